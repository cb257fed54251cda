#include "dstk/bench/bench.hpp"

#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <map>
#include <new>
#include <set>
#include <sstream>

#include "dstk/atomic_output.hpp"
#include "dstk/bench/page_cache.hpp"
#include "dstk/error.hpp"
#include "dstk/gpu_info.hpp"
#include "dstk/manifest.hpp"
#include "dstk/sysinfo.hpp"
#include "dstk/units.hpp"

namespace dstk::bench {
namespace {

std::vector<std::string> split_list(std::string_view text) {
    std::vector<std::string> out;
    std::size_t start = 0;
    while (start <= text.size()) {
        std::size_t end = text.find(',', start);
        if (end == std::string_view::npos) end = text.size();
        out.emplace_back(text.substr(start, end - start));
        start = end + 1;
    }
    return out;
}

std::string pad(std::string s, std::size_t width) {
    if (s.size() < width) s.append(width - s.size(), ' ');
    return s;
}

// Rows as left-aligned columns two spaces apart, no trailing blanks.
std::string render_columns(const std::vector<std::vector<std::string>>& rows) {
    std::vector<std::size_t> width;
    for (const auto& row : rows) {
        width.resize(std::max(width.size(), row.size()), 0);
        for (std::size_t i = 0; i < row.size(); ++i) width[i] = std::max(width[i], row[i].size());
    }
    std::string out;
    for (const auto& row : rows) {
        std::string line;
        for (std::size_t i = 0; i < row.size(); ++i) line += pad(row[i], width[i] + 2);
        while (!line.empty() && line.back() == ' ') line.pop_back();
        out += line + "\n";
    }
    return out;
}

std::string fixed(double v, int decimals) {
    char buf[64];
    std::snprintf(buf, sizeof buf, "%.*f", decimals, v);
    return buf;
}

std::string per_second(double v, const std::string& unit) { // "401,000 samples/s"
    return format_count(static_cast<std::uint64_t>(v + 0.5)) + " " + unit;
}

std::string format_metric(const Metric& m) {
    if (m.unit == "B/s") return format_rate(m.median);
    if (m.unit == "us") return fixed(m.median, m.median < 100 ? 1 : 0) + " us";
    return per_second(m.median, m.unit);
}

} // namespace

std::vector<unsigned> parse_thread_list(std::string_view text, std::string_view what) {
    std::vector<unsigned> out;
    for (const auto& item : split_list(text)) {
        const std::uint64_t n = parse_count(item, what);
        if (n == 0 || n > 4096)
            throw usage_error("invalid " + std::string(what) + "=" + std::string(text) +
                              " (thread counts must be 1..4096)");
        out.push_back(static_cast<unsigned>(n));
    }
    std::sort(out.begin(), out.end());
    out.erase(std::unique(out.begin(), out.end()), out.end());
    return out;
}

std::vector<std::uint64_t> parse_size_list(std::string_view text, std::string_view what) {
    std::vector<std::uint64_t> out;
    for (const auto& item : split_list(text)) {
        const std::uint64_t n = parse_size(item, what);
        if (n == 0)
            throw usage_error("invalid " + std::string(what) + "=" + std::string(text) + " (sizes must be positive)");
        out.push_back(n);
    }
    std::sort(out.begin(), out.end());
    out.erase(std::unique(out.begin(), out.end()), out.end());
    return out;
}

Context detect_context(const BenchOptions& o, const Target* target) {
    Context c;
    c.dstk_version = DSTK_VERSION;
    c.command_line = o.command_line;
    c.date = now_iso8601();
    const SystemInfo sys = detect_system();
    c.host = sys.hostname;
    c.kernel = sys.kernel;
    c.cpu_model = sys.cpu_model;
    c.logical_cores = sys.logical_cores;
    c.physical_cores = sys.physical_cores;
    c.numa_nodes = sys.numa_nodes;
    c.ram_total_bytes = sys.memory.total;
    c.ram_available_bytes = sys.memory.available;
    if (target) {
        c.target = target->given.string();
        c.file = target->file.string();
        c.file_bytes = target->file_bytes;
        c.sample_bytes = target->sample_bytes;
        const DiskInfo d = disk_info(target->file);
        c.filesystem = d.filesystem;
        c.mount_point = d.mount_point;
        c.block_device = d.device;
    }
    c.built_with_cuda = built_with_cuda();
    std::string why;
    const auto gpus = detect_gpus(&why);
    if (gpus.empty()) {
        c.gpu_status = why;
    } else {
        const GpuInfo& g = gpus.front();
        c.gpu_name = g.name;
        c.gpu_memory_bytes = g.total_memory;
        c.gpu_free_bytes = g.free_memory;
        c.pcie_generation = g.pcie_generation;
        c.pcie_width = g.pcie_width;
        c.driver_version = g.driver_version;
        c.cuda_runtime_version = g.runtime_version;
        c.cudnn_version = cudnn_version();
    }
    const Settings& s = o.settings;
    c.settings = {{"cases", o.cases.empty() ? "default" : o.cases},
                  {"repetitions", s.repeat.repetitions},
                  {"min_time_s", s.repeat.min_time},
                  {"threads", s.threads},
                  {"block_bytes", s.block_bytes},
                  {"size_bytes", s.size_bytes},
                  {"batch_samples", s.batch_samples},
                  {"chunk_bytes", s.chunk_bytes},
                  {"transfer_sizes", s.transfer_sizes},
                  {"drop_caches", s.drop_caches},
                  {"zstd_level", s.zstd_level},
                  {"seed", s.seed}};
    return c;
}

Results run_cases(const BenchOptions& o, const CaseRegistry& registry) {
    const Settings& s = o.settings;
    if (s.threads.empty()) throw usage_error("invalid --threads (empty list)");
    if (s.block_bytes == 0) throw usage_error("invalid --block-size=0 (must be positive)");
    if (s.size_bytes == 0) throw usage_error("invalid --size=0 (must be positive)");
    if (s.chunk_bytes == 0) throw usage_error("invalid --chunk-size=0 (must be positive)");
    if (s.batch_samples == 0) throw usage_error("invalid --batch=0 (must be positive)");
    if (s.transfer_sizes.empty()) throw usage_error("invalid --transfer-sizes (empty list)");
    if (s.drop_caches && !can_drop_caches())
        throw usage_error("--drop-caches needs write access to /proc/sys/vm/drop_caches (run as root, outside a "
                          "read-only container); without it dsbench drops only the file's pages (posix_fadvise)");
    const auto selected = registry.select(o.cases);
    if (selected.empty()) throw usage_error("--cases '" + o.cases + "' matches no case; 'dsbench --list' shows them");

    std::optional<Target> target;
    if (!o.target.empty()) target = open_target(o.target, o.sample_bytes);
    Results results;
    results.context = detect_context(o, target ? &*target : nullptr);
    const CaseContext ctx{target ? &*target : nullptr, s, o.out};
    for (const Case* c : selected) {
        auto record = [&](CaseStatus status, const std::string& reason) {
            CaseResult r;
            r.key = c->key;
            r.description = c->description;
            r.status = status;
            r.reason = reason;
            r.params = nlohmann::json::object();
            results.results.push_back(std::move(r));
        };
        try {
            if (auto why = c->waive ? c->waive(ctx) : std::nullopt) {
                note(o.out, "dsbench: " + c->key + ": waived (" + *why + ")");
                record(CaseStatus::waived, *why);
                continue;
            }
            note(o.out, "dsbench: " + c->key + " ...");
            for (CaseResult& r : c->run(ctx)) {
                r.key = c->key;
                r.description = c->description;
                results.results.push_back(std::move(r));
            }
        } catch (const Error& e) {
            if (e.code() == ExitCode::interrupted) throw;
            warning(c->key + ": " + e.what());
            record(e.code() == ExitCode::no_fit ? CaseStatus::waived : CaseStatus::failed, e.what());
        } catch (const std::bad_alloc&) {
            warning(c->key + ": out of memory");
            record(CaseStatus::failed, "out of memory");
        } catch (const std::exception& e) {
            warning(c->key + ": " + e.what());
            record(CaseStatus::failed, e.what());
        }
    }
    return results;
}

void run_bench(const BenchOptions& o) {
    if (!o.json_file.empty() && o.json_file != "-") check_overwrite(o.json_file, o.force);
    const Results r = run_cases(o, builtin_cases());
    const std::string json = serialize_results(r);
    if (o.json_file == "-") {
        std::fwrite(json.data(), 1, json.size(), stdout);
    } else {
        const std::string table = format_results_table(r);
        std::fwrite(table.data(), 1, table.size(), stdout);
        if (!o.json_file.empty()) {
            AtomicFile f(o.json_file, o.force);
            f.write(json.data(), json.size());
            f.commit();
            note(o.out, "dsbench: results written to " + o.json_file);
        }
    }
    std::fflush(stdout);
    std::size_t ok = 0, failed = 0, waived = 0;
    for (const auto& c : r.results)
        (c.status == CaseStatus::ok ? ok : c.status == CaseStatus::failed ? failed : waived)++;
    if (failed)
        throw runtime_error(std::to_string(failed) + " of " + std::to_string(r.results.size()) +
                            " results failed (see the table); the others were measured");
    if (ok == 0) throw no_fit_error("nothing could be measured here (every selected case was waived; see the reasons)");
}

std::string format_case_list(const CaseRegistry& registry) {
    std::size_t width = 0;
    for (const auto& c : registry.cases()) width = std::max(width, c.key.size());
    std::string out;
    for (const auto& c : registry.cases())
        out += pad(c.key, width + 2) + (c.in_default ? "  " : "- ") + c.description + "\n";
    out += "\n(- : not in the default set; select with --cases)\n";
    return out;
}

std::string format_results_table(const Results& r) {
    std::vector<std::vector<std::string>> rows;
    rows.push_back({"case", "variant", "rate", "per second", "p50", "p99", "spread", "reps"});
    std::vector<std::string> notes;
    for (const auto& c : r.results) {
        if (c.status != CaseStatus::ok) {
            notes.push_back(pad(c.key, 28) + " " + std::string(status_name(c.status)) + ": " + c.reason +
                            (c.variant.empty() ? "" : " (" + c.variant + ")"));
            continue;
        }
        std::vector<std::string> row{c.key, c.variant, "", "", "", "", "", std::to_string(c.repetitions)};
        if (const Metric* m = c.metric("rate")) {
            row[2] = format_metric(*m);
            row[6] = fixed(m->spread_pct(), 1) + "%";
        }
        for (const char* name : {"samples_rate", "elements_rate", "ops_rate"})
            if (const Metric* m = c.metric(name)) {
                row[3] = format_metric(*m);
                break;
            }
        if (const Metric* m = c.metric("latency_p50")) row[4] = format_metric(*m);
        if (const Metric* m = c.metric("latency_p99")) row[5] = format_metric(*m);
        rows.push_back(std::move(row));
    }
    std::string out = rows.size() > 1 ? render_columns(rows) : "";
    if (!notes.empty()) {
        if (!out.empty()) out += "\n";
        for (const auto& n : notes) out += n + "\n";
    }
    return out;
}

std::string format_comparison(const Results& a, const Results& b, const std::string& name_a,
                              const std::string& name_b) {
    std::vector<std::vector<std::string>> rows;
    rows.push_back({"case", "variant", "metric", "A", "B", "B/A"});
    std::vector<std::string> notes;
    std::set<std::pair<std::string, std::string>> seen;
    for (const auto& ra : a.results) {
        if (!seen.insert({ra.key, ra.variant}).second) continue;
        const CaseResult* rb = nullptr;
        for (const auto& c : b.results)
            if (c.key == ra.key && c.variant == ra.variant) rb = &c;
        const std::string label = ra.key + (ra.variant.empty() ? "" : " " + ra.variant);
        if (!rb) {
            notes.push_back(label + ": only in A");
            continue;
        }
        if (ra.status != CaseStatus::ok || rb->status != CaseStatus::ok) {
            notes.push_back(label + ": A " + std::string(status_name(ra.status)) + ", B " +
                            std::string(status_name(rb->status)));
            continue;
        }
        for (const auto& [name, ma] : ra.metrics) {
            const Metric* mb = rb->metric(name);
            if (!mb || mb->unit != ma.unit) continue;
            rows.push_back({ra.key, ra.variant, name, format_metric(ma), format_metric(*mb),
                            ma.median > 0 ? fixed(mb->median / ma.median, 2) + "x" : "-"});
        }
    }
    for (const auto& rb : b.results)
        if (!seen.count({rb.key, rb.variant})) {
            seen.insert({rb.key, rb.variant});
            notes.push_back(rb.key + (rb.variant.empty() ? "" : " " + rb.variant) + ": only in B");
        }
    std::string out = "A: " + name_a + " (" + a.context.host + ", " + a.context.date + ")\nB: " + name_b + " (" +
                      b.context.host + ", " + b.context.date + ")\n\n" + render_columns(rows);
    if (!notes.empty()) {
        out += "\n";
        for (const auto& n : notes) out += n + "\n";
    }
    return out;
}

void run_compare(const std::string& a, const std::string& b, const OutputOptions&) {
    const Results ra = load_results(a), rb = load_results(b);
    const std::string text = format_comparison(ra, rb, a, b);
    std::fwrite(text.data(), 1, text.size(), stdout);
}

} // namespace dstk::bench
