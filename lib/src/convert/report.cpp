// dsconvert's report: what was converted and what the conversion lost, as
// text on stderr or one JSON document (--json, --report-json).
#include <cstdio>

#include "convert_job.hpp"
#include "dstk/atomic_output.hpp"
#include "dstk/json.hpp"
#include "dstk/output.hpp"
#include "dstk/sysinfo.hpp"
#include "dstk/units.hpp"

namespace fs = std::filesystem;

namespace dstk::convert {
namespace {

std::string field_summary(const FieldPlan& p) {
    std::string s = p.name + ": " + std::string(dtype_name(p.in));
    if (p.convert) s += " -> " + std::string(dtype_name(p.out));
    return s;
}

// What the output holds: a single .npy/raw output one field of one split
// (--select), a dataset everything.
struct Written {
    std::uint64_t samples = 0, bytes_in = 0;
    std::string what; // "test/robs" for a single output
    std::vector<const FieldPlan*> fields;
    std::vector<const OutSplit*> splits;
};

Written written(const Job& j) {
    Written w;
    if (j.settings.to == OutputFormat::dataset || !j.only_split) {
        w.samples = j.total_samples;
        for (const auto& p : j.fields) w.bytes_in += p.stats.bytes_in, w.fields.push_back(&p);
        for (const auto& s : j.outs) w.splits.push_back(&s);
        return w;
    }
    const OutSplit& s = j.outs[*j.only_split];
    const FieldPlan& p = j.fields[j.only_field];
    w.samples = s.samples;
    w.bytes_in = s.samples * p.in_bytes;
    w.what = s.name + "/" + p.name;
    w.fields = {&p};
    w.splits = {&s};
    return w;
}

nlohmann::json report_json(Job& j, double secs, const Written& w) {
    nlohmann::json out;
    out["input"] = j.o.input.string();
    out["input_format"] = std::string(input_format_name(j.src.format));
    out["output"] = j.o.output.string();
    out["output_format"] = j.settings.to == OutputFormat::dataset
                               ? (j.settings.zstd ? "dataset (zstd-chunked)" : "dataset (npy)")
                               : (j.settings.to == OutputFormat::npy ? "npy" : "raw");
    out["samples"] = w.samples;
    if (!w.what.empty()) out["selected"] = w.what;
    out["splits"] = nlohmann::json::array();
    for (const OutSplit* s : w.splits) out["splits"].push_back({{"name", s->name}, {"samples", s->samples}});
    out["fields"] = nlohmann::json::array();
    for (const FieldPlan* fp : w.fields) {
        const FieldPlan& p = *fp;
        nlohmann::json fj = {{"name", p.name},
                             {"from", std::string(dtype_name(p.in))},
                             {"to", std::string(dtype_name(p.out))},
                             {"shape", p.shape.str()},
                             {"scale", p.map.scale},
                             {"offset", p.map.offset}};
        fj["conversion"] = p.stats.to_json();
        out["fields"].push_back(fj);
    }
    if (j.classes) {
        out["num_classes"] = *j.classes;
        out["num_classes_from"] = j.classes_from;
    }
    out["bytes_in"] = w.bytes_in;
    out["bytes_out"] = j.bytes_written;
    if (j.settings.zstd) {
        out["compression_level"] = j.settings.level;
        out["chunk_samples"] = j.chunk_samples;
    }
    if (j.o.shuffle_seed) out["shuffle_seed"] = *j.o.shuffle_seed;
    if (j.resumable) out["resumed_after_samples"] = j.resume_at;
    out["seconds"] = secs;
    out["threads"] = j.pool.size();
    out["peak_rss_bytes"] = peak_rss_bytes();
    return out;
}

void print_text(Job& j, double secs, const Written& w) {
    note(j.o.out, "dsconvert: " + format_count(w.samples) + " samples" + (w.what.empty() ? "" : " of " + w.what) +
                      " (" + j.src.description + ") -> " + j.o.output.string() + ": " + format_bytes(w.bytes_in) +
                      " -> " + format_bytes(j.bytes_written) + " in " + format_duration(secs) + " (" +
                      format_rate(secs > 0 ? static_cast<double>(w.bytes_in) / secs : 0) + ")");
    if (j.classes)
        note(j.o.out, "  classes: " + std::to_string(*j.classes) + " (from " + j.classes_from +
                          (j.classes_from == "the largest label + 1"
                               ? "; a class no sample shows is not counted: give --num-classes N when there are more)"
                               : ")"));
    for (const FieldPlan* fp : w.fields) {
        const FieldPlan& p = *fp;
        if (!p.convert) continue;
        const ConversionStats& s = p.stats;
        std::string line = "  " + field_summary(p) + ": ";
        if (!s.lossy()) {
            line += "exact";
        } else {
            char buf[200];
            std::snprintf(buf, sizeof buf, "max abs error %.6g, max rel error %.3g, %llu inexact", s.max_abs_error,
                          s.max_rel_error, static_cast<unsigned long long>(s.inexact));
            line += buf;
            if (s.clipped) line += ", " + format_count(s.clipped) + " clipped";
            if (s.overflow_inf) line += ", " + format_count(s.overflow_inf) + " overflowed to Inf";
            if (s.nan) line += ", " + format_count(s.nan) + " NaN";
        }
        line += " (" + format_bytes(s.bytes_in) + " -> " + format_bytes(s.bytes_out) + ")";
        note(j.o.out, line);
    }
}

} // namespace

nlohmann::json write_report(Job& j, double secs) {
    nlohmann::json out = report_json(j, secs, written(j));
    if (j.report_file) {
        const std::string text = dump_json(out, 2, "the report '" + j.o.report_json.string() + "'") + "\n";
        j.report_file->write(text.data(), text.size());
    }
    return out;
}

void print_report(Job& j, const nlohmann::json& summary, double secs) {
    if (j.o.out.json)
        std::printf("%s\n", summary.dump(2).c_str());
    else
        print_text(j, secs, written(j));
}

} // namespace dstk::convert
