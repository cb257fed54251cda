// dsconvert's pipeline: source streams -> block conversion (parallel) ->
// optional external shuffle -> router over output splits -> field sinks
// (.npy, zstd-chunked, or one raw/.npy file). Every stage works on bounded
// blocks of samples; run_convert calls them in order.
#include "dstk/convert/convert.hpp"

#include <algorithm>
#include <chrono>
#include <cmath>

#include "convert_job.hpp"
#include "dstk/atomic_output.hpp"
#include "dstk/checksum.hpp"
#include "dstk/convert/bench.hpp"
#include "dstk/error.hpp"
#include "dstk/json.hpp"
#include "dstk/signals.hpp"
#include "dstk/units.hpp"

namespace fs = std::filesystem;

namespace dstk {
namespace convert {
namespace {

void open_input(Job& j) {
    const ConvertOptions& o = j.o;
    j.src = open_source(o.input, o.from, o.raw, j.pool);
    for (const std::string& n : j.src.notices) note(o.out, n);
    j.x_name = j.src.input_field;
    j.y_name = j.src.label_field;
    // Raw stdin without --labels: the count is what arrives before the pipe ends.
    for (const auto& sp : j.src.splits) j.count_known &= sp.count_known;
    if (!j.count_known) {
        const char* why = !o.split.empty() ? "--split" : o.shuffle_seed ? "--shuffle" : o.resume ? "--resume" : nullptr;
        if (why)
            throw usage_error(std::string(why) +
                              " needs the sample count before it starts, and raw stdin gives it only at its end; "
                              "save the input to a file first, or give --labels FILE (the labels set the count)");
    }
}

// --range auto: a first pass over the input field finds its finite range.
void scan_range(Job& j) {
    const ConvertOptions& o = j.o;
    FieldPlan* xp = j.x();
    if (!j.src.rereadable) throw usage_error("--range auto reads the input twice, which stdin cannot do; give LO:HI");
    double lo = INFINITY, hi = -INFINITY;
    for (auto& sp : j.src.splits)
        for (auto& f : sp.fields) {
            if (f.name != j.x_name) continue;
            std::vector<std::uint8_t> buf;
            const std::uint64_t per = std::max<std::uint64_t>(1, block_target_bytes / sample_bytes(xp->shape, xp->in));
            for (std::uint64_t s = 0; s < sp.samples; s += per) {
                throw_if_interrupted();
                const std::uint64_t n = std::min(per, sp.samples - s);
                buf.resize(n * f.stream->sample_bytes());
                f.stream->read(n, buf.data());
                finite_range(f.dtype, buf.data(), n * f.shape.numel(), lo, hi);
            }
        }
    if (lo > hi) throw runtime_error(o.input.string() + ": --range auto found no finite value to map");
    xp->map = range_mapping(lo, hi, xp->out);
    note(o.out, "range: [" + std::to_string(lo) + ", " + std::to_string(hi) + "] -> scale " +
                    std::to_string(xp->map.scale) + ", offset " + std::to_string(xp->map.offset));
    j.src = open_source(o.input, o.from, o.raw, j.pool);
}

// Each source split to its own output split, or everything through --split.
void plan_output_splits(Job& j) {
    for (auto& p : j.fields) {
        p.convert = p.in != p.out || !p.map.identity();
        p.in_bytes = sample_bytes(p.shape, p.in);
        p.out_bytes = sample_bytes(p.shape, p.out);
    }
    for (const auto& sp : j.src.splits) j.total_samples += sp.samples;
    if (j.o.split.empty()) {
        // An unknown count is set when the stream ends; the router never reaches it.
        for (const auto& sp : j.src.splits)
            j.outs.push_back(OutSplit{sp.name, sp.count_known ? sp.samples : ~std::uint64_t{0}, {}, 0});
        return;
    }
    const auto& fr = j.settings.split;
    std::uint64_t given = 0;
    for (std::size_t i = 0; i < fr.size(); ++i) {
        OutSplit s;
        s.name = fr[i].name;
        const std::uint64_t left = j.total_samples - given;
        s.samples = i + 1 == fr.size()
                        ? left
                        : std::min<std::uint64_t>(
                              left, static_cast<std::uint64_t>(std::llround(fr[i].fraction * j.total_samples)));
        given += s.samples;
        j.outs.push_back(std::move(s));
    }
}

// A single .npy/raw output holds one field of one split: --select, or the
// only split's input field.
void select_single_output(Job& j) {
    const ConvertOptions& o = j.o;
    if (j.settings.to == OutputFormat::dataset) {
        if (!o.select.empty())
            throw usage_error(
                "--select chooses what a single .npy/raw output holds; a dataset output keeps everything");
        return;
    }
    std::string want_split, want_field = j.x_name;
    if (!o.select.empty()) {
        const auto slash = o.select.find('/');
        want_split = o.select.substr(0, slash);
        if (slash != std::string::npos) want_field = o.select.substr(slash + 1);
    } else if (j.outs.size() == 1) {
        want_split = j.outs[0].name;
    } else {
        std::string names;
        for (const auto& s : j.outs) names += (names.empty() ? "" : ", ") + s.name;
        throw usage_error("a single-file output holds one split, the input has " + std::to_string(j.outs.size()) +
                          " (" + names + "); choose one with --select SPLIT[/FIELD]");
    }
    if (want_field.empty())
        throw usage_error("a single-file output holds one field, and the input names no input field (its fields: " +
                          fields_text(j.fields) + "); choose one with --select SPLIT/FIELD");
    for (std::size_t i = 0; i < j.outs.size(); ++i)
        if (j.outs[i].name == want_split) j.only_split = i;
    if (!j.only_split) throw usage_error("--select: no split '" + want_split + "' in the input");
    bool found = false;
    for (std::size_t f = 0; f < j.fields.size(); ++f)
        if (j.fields[f].name == want_field) {
            j.only_field = f;
            found = true;
        }
    if (!found) throw usage_error("--select: no field '" + want_field + "' in the input");
}

// The settings a --resume run must share with the one it continues.
std::string resume_fingerprint(Job& j) {
    const ConvertOptions& o = j.o;
    const FieldPlan* xp = j.x();
    const nlohmann::json fp = {{"input", fs::absolute(o.input).lexically_normal().string()},
                               {"from", std::string(input_format_name(j.src.format))},
                               {"shape", o.raw.shape ? o.raw.shape->str() : ""},
                               {"in_dtype", o.raw.dtype ? std::string(dtype_name(*o.raw.dtype)) : ""},
                               {"label_dtype", std::string(dtype_name(o.raw.label_dtype))},
                               {"layout", o.raw.layout == Layout::feature_major},
                               {"dtype", xp ? std::string(dtype_name(xp->out)) : ""},
                               {"scale", xp ? xp->map.scale : 1.0},
                               {"offset", xp ? xp->map.offset : 0.0},
                               {"compress", o.compress},
                               {"chunk_samples", j.chunk_samples},
                               {"split", o.split}};
    nlohmann::json with_fields = fp;
    if (!o.field_dtypes.empty() || !o.raw.input.empty() || !o.raw.label.empty()) {
        for (const auto& p : j.fields) with_fields["field_dtypes"][p.name] = std::string(dtype_name(p.out));
        with_fields["roles"] = {j.x_name, j.y_name};
    }
    if (!o.shard) return with_fields.dump() + "\n";
    nlohmann::json with_shard = with_fields;
    with_shard["shard"] = std::to_string(o.shard->index) + "/" + std::to_string(o.shard->count);
    return with_shard.dump() + "\n";
}

// --chunk-samples, or the samples of the widest output field that fit in
// --chunk-size (default 4 MiB); at most the samples of the largest whole
// split, as a chunk larger than its split is the split (a 64G chunk of a
// small dataset would otherwise be a 64G buffer). The manifest gives the
// chunk actually used.
std::uint64_t chunk_samples_of(const Job& j) {
    std::uint64_t chunk = j.o.chunk_samples;
    if (!chunk) {
        std::uint64_t widest = 1;
        for (const auto& p : j.fields) widest = std::max(widest, sample_bytes(p.shape, p.out));
        const std::uint64_t target = j.o.chunk_bytes ? j.o.chunk_bytes : chunked_default_chunk_bytes;
        chunk = target / widest;
    }
    if (!j.count_known) return std::max<std::uint64_t>(1, chunk);
    // The whole splits: --shard's totals, else the output splits once planned, else the input's.
    std::uint64_t largest = 0;
    for (const std::uint64_t n : j.shard_totals) largest = std::max(largest, n);
    if (j.shard_totals.empty())
        for (const auto& s : j.outs) largest = std::max(largest, s.samples);
    if (j.shard_totals.empty() && j.outs.empty())
        for (const auto& sp : j.src.splits) largest = std::max(largest, sp.samples);
    return std::max<std::uint64_t>(1, std::min(chunk, largest));
}

// --shard I/N: each source split shrinks to part I's range of it, so every
// later stage (resume, progress, sinks) sees only that part. The ranges are
// cut at chunks of the zstd chunk size, also for .npy storage, so that the
// parts of a zstd-chunked output are whole chunks of the single run's file.
void shard_source(Job& j) {
    const ConvertOptions& o = j.o;
    const char* why = !o.split.empty()                         ? "--split re-splits the whole input"
                      : o.shuffle_seed                         ? "--shuffle permutes the whole input"
                      : j.settings.to != OutputFormat::dataset ? "a single .npy/raw output cannot be merged"
                      : !j.count_known                         ? "raw stdin has no sample count to cut"
                                                               : nullptr;
    if (why)
        throw usage_error(std::string("--shard cannot be used here (") + why +
                          "); convert whole, or shard a plain dataset conversion and --shuffle/--split the merged "
                          "dataset");
    j.shard_chunk = chunk_samples_of(j);
    for (auto& sp : j.src.splits) {
        const SampleRange r = shard_range(sp.samples, j.shard_chunk, *o.shard);
        for (auto& f : sp.fields) f.stream->skip(r.first);
        j.shard_ranges.push_back(r);
        j.shard_totals.push_back(sp.samples);
        sp.samples = r.count;
    }
}

// Chunk size, the staging directory (or the overwrite check of a single
// file) and the free-disk check.
void prepare_output(Job& j) {
    const ConvertOptions& o = j.o;
    const Settings& st = j.settings;
    std::uint64_t estimate = 0;
    for (std::size_t i = 0; i < j.outs.size() && j.count_known; ++i)
        for (std::size_t f = 0; f < j.fields.size(); ++f)
            if (st.to == OutputFormat::dataset || (j.only_split == i && f == j.only_field))
                estimate += checked_mul(j.outs[i].samples, j.fields[f].out_bytes, "output size");
    if (st.zstd) j.chunk_samples = chunk_samples_of(j);
    j.out_dir = o.output.parent_path().empty() ? fs::path(".") : o.output.parent_path();
    if (o.resume) {
        if (st.to != OutputFormat::dataset)
            throw usage_error("--resume works for dataset outputs (a single .npy/raw file is rewritten whole)");
        if (o.shuffle_seed)
            throw usage_error("--resume cannot continue a --shuffle conversion (its buckets are not kept); run "
                              "without --resume");
        std::vector<std::string> files;
        for (const OutSplit& s : j.outs)
            for (const auto& p : j.fields) files.push_back(output_field(s.name, p, st.zstd ? j.chunk_samples : 0).file);
        j.resumable = std::make_unique<ResumableOutput>(o.output, resume_fingerprint(j), o.force, o.out, files);
        j.out_dir = j.resumable->dir();
    } else if (st.to == OutputFormat::dataset) {
        j.writer.emplace(o.output, o.force);
        j.out_dir = j.writer->tmp_dir();
    } else if (o.output != "-") {
        check_overwrite(o.output, o.force);
    }
    if (!o.report_json.empty()) j.report_file.emplace(o.report_json, o.force);
    if (!st.zstd && !o.force && o.output != "-") check_free_disk(j.out_dir, estimate);
}

// --resume: complete splits are kept, the split in progress continues after
// its last complete chunk, later splits start over.
void make_resumable_sinks(Job& j) {
    bool current_found = false;
    for (OutSplit& s : j.outs) {
        std::vector<FieldInfo> infos;
        std::uint64_t keep = s.samples;
        for (const auto& p : j.fields) {
            const FieldInfo fi = output_field(s.name, p, j.settings.zstd ? j.chunk_samples : 0);
            keep = std::min(keep, j.resumable->done(fi, s.samples));
            infos.push_back(fi);
        }
        if (current_found) keep = 0; // after the split in progress: start over
        if (keep < s.samples) current_found = true;
        for (const auto& fi : infos)
            s.sinks.push_back(j.resumable->sink(fi, s.samples, keep, j.settings.level, j.pool));
        align_batches(s.sinks);
        s.written = keep;
        j.resume_at += keep;
    }
    if (j.resume_at > 0) note(j.o.out, "resuming after " + format_count(j.resume_at) + " samples");
}

void make_dataset_sinks(Job& j) {
    for (OutSplit& s : j.outs)
        for (const auto& p : j.fields) {
            if (j.settings.zstd) {
                const FieldInfo fi = output_field(s.name, p, j.chunk_samples);
                s.sinks.push_back(std::make_unique<ChunkedSink>(j.writer->file(fi.file), fi, j.settings.level, j.pool));
            } else if (!j.count_known) {
                const FieldInfo fi = output_field(s.name, p, 0);
                s.sinks.push_back(make_unknown_count_npy_sink(j.writer->file(fi.file), fi));
            } else {
                s.sinks.push_back(make_npy_sink(j.writer->npy_field(s.name, p.name, p.out, p.shape, s.samples)));
            }
        }
}

// The fields that get statistics pass through a statistics sink in the train
// split (else the first split: the one Manifest::stats_of reads), in rows of
// the shard chunk.
void add_stats_sinks(Job& j) {
    for (std::size_t i = 0; i < j.outs.size(); ++i)
        if (j.outs[i].name == "train") j.stats_split = i;
    OutSplit& s = j.outs[j.stats_split];
    for (std::size_t f = 0; f < j.fields.size(); ++f) {
        const FieldPlan& p = j.fields[f];
        if (!p.channel_stats) continue;
        StatsSinkSpec spec{s.name,    s.samples,
                           s.written, chunk_samples_of(j),
                           j.out_dir, [out = j.o.out](const std::string& line) { note(out, line); },
                           nullptr};
        if (j.o.shard) spec.rows = j.stats_rows[p.name] = std::make_shared<std::vector<std::vector<double>>>();
        s.sinks[f] = make_stats_sink(std::move(s.sinks[f]), p.out, p.shape, std::move(spec));
    }
}

void make_sinks(Job& j) {
    const ConvertOptions& o = j.o;
    if (j.resumable)
        make_resumable_sinks(j);
    else if (j.settings.to == OutputFormat::dataset)
        make_dataset_sinks(j);
    if (j.settings.to == OutputFormat::dataset) add_stats_sinks(j);
    if (j.settings.to != OutputFormat::dataset) {
        // Only the selected field gets a real sink; the others are dropped.
        OutSplit& s = j.outs[*j.only_split];
        const FieldPlan& p = j.fields[j.only_field];
        s.sinks.resize(j.fields.size());
        for (std::size_t f = 0; f < j.fields.size(); ++f)
            s.sinks[f] = f == j.only_field ? make_file_sink(o.output, o.force, p.out, p.shape,
                                                            j.count_known ? std::optional(s.samples) : std::nullopt,
                                                            j.settings.to == OutputFormat::npy, o.out_layout)
                                           : make_null_sink();
    }
    // Splits that are not written still consume their samples.
    for (auto& s : j.outs)
        if (s.sinks.empty())
            for (std::size_t f = 0; f < j.fields.size(); ++f) s.sinks.push_back(make_null_sink());
}

// The settings that decide the bytes, shared by the parts of one dataset:
// those a --resume run must share, less the part itself, plus the importers'.
ShardInfo shard_info(Job& j) {
    const ConvertOptions& o = j.o;
    nlohmann::json settings = parse_json(resume_fingerprint(j));
    settings.erase("shard");
    settings["shard_chunk"] = j.shard_chunk;
    settings["in_layout"] = static_cast<int>(o.raw.in_layout);
    settings["input_field"] = j.x_name;
    settings["label_field"] = j.y_name;
    settings["labels"] = o.raw.labels.empty() ? "" : fs::absolute(o.raw.labels).lexically_normal().string();
    settings["num_classes"] = o.num_classes ? static_cast<std::int64_t>(*o.num_classes) : -1;
    const std::string text = settings.dump();
    Xxh64 h;
    h.update(text.data(), text.size());
    ShardInfo sh;
    sh.index = o.shard->index;
    sh.count = o.shard->count;
    sh.chunk_samples = j.shard_chunk;
    sh.settings = h.hex();
    for (std::size_t i = 0; i < j.outs.size(); ++i)
        sh.splits.push_back({j.outs[i].name, j.shard_ranges[i].first, j.shard_totals[i], {}, {}});
    for (const auto& [field, rows] : j.stats_rows) sh.splits[j.stats_split].field_chunk_sums[field] = *rows;
    return sh;
}

Manifest output_manifest(Job& j, Manifest m) {
    const ConvertOptions& o = j.o;
    const FieldPlan* xp = j.x();
    m.input_field = j.x_name;
    m.label_field = j.y_name;
    // A dataset's class count holds for its own label field.
    const bool same_label = j.src.manifest && j.src.manifest->label_field == j.y_name;
    m.num_classes = j.src.manifest ? (same_label ? j.src.manifest->num_classes : std::nullopt) : j.src.num_classes;
    if (j.src.manifest) {
        // The origin is said once: a manifest that took its count from an
        // earlier manifest already says so, and re-conversions keep its words.
        const std::string manifest = "the input's manifest";
        const auto& from = j.src.manifest->provenance.params;
        const auto it = from.find("num_classes_from");
        j.classes_from = it == from.end()                     ? manifest
                         : it->second.rfind(manifest, 0) == 0 ? it->second
                                                              : manifest + ": " + it->second;
    } else {
        j.classes_from = "the input format (" + std::string(input_format_name(j.src.format)) + ")";
    }
    if (const auto classes = check_labels(j); classes && (o.num_classes || !m.num_classes)) {
        m.num_classes = classes;
        j.classes_from = o.num_classes ? "--num-classes" : "the largest label + 1";
    }
    j.classes = m.num_classes;
    if (m.num_classes) m.provenance.params["num_classes_from"] = j.classes_from;
    // The input's statistics also top-level, for readers of older manifests.
    if (const ChannelStats* st = m.stats_of(m.input_field)) m.stats = *st;
    m.provenance.tool = "dsconvert";
    m.provenance.version = DSTK_VERSION;
    m.provenance.command_line = o.command_line;
    m.provenance.created = now_iso8601();
    m.provenance.seed = o.shuffle_seed;
    m.provenance.params["from"] = std::string(input_format_name(j.src.format));
    m.provenance.params["input"] = o.input.string();
    m.provenance.params["compress"] = o.compress;
    if (j.settings.zstd) m.provenance.params["chunk_samples"] = std::to_string(j.chunk_samples);
    if (xp && xp->convert) {
        m.provenance.params["scale"] = std::to_string(xp->map.scale);
        m.provenance.params["offset"] = std::to_string(xp->map.offset);
    }
    if (o.shard) m.shard = shard_info(j);
    return m;
}

// Finishes every sink and, for a dataset, writes the manifest; place_outputs
// puts it in place.
void finish_output(Job& j) {
    if (!j.count_known) {
        j.total_samples = j.src.splits.front().samples;
        j.outs.front().samples = j.total_samples;
        if (j.total_samples == 0)
            throw runtime_error(j.o.input.string() + ": no samples arrived (empty input); nothing written");
    }
    Manifest m;
    for (auto& out : j.outs) {
        SplitInfo si;
        si.name = out.name;
        si.samples = out.samples;
        for (auto& sink : out.sinks) {
            FieldInfo fi = sink->finish();
            j.bytes_written += fi.bytes;
            si.fields.push_back(std::move(fi));
        }
        m.splits.push_back(std::move(si));
    }
    if (!j.writer && !j.resumable) return;
    m = output_manifest(j, std::move(m));
    if (j.resumable)
        j.resumable->stage(m, j.o.force);
    else
        j.writer->write_manifest(m);
}

} // namespace

void place_outputs(Job& j) {
    OutputSet set;
    if (j.report_file) set.add(*j.report_file);
    if (j.resumable) set.add(j.resumable->output());
    if (j.writer) set.add(j.writer->output());
    if (j.only_split)
        for (auto& sink : j.outs[*j.only_split].sinks)
            if (AtomicOutput* file = sink->staged_output()) set.add(*file);
    try {
        set.commit();
    } catch (const Error&) {
        if (j.resumable) j.resumable->keep_for_resume();
        throw;
    }
}

} // namespace convert

void run_convert(const ConvertOptions& o) {
    convert::check_modes(o);
    if (o.verify_only) return convert::run_verify(o);
    if (o.benchmark) return run_convert_benchmark(o);
    if (!o.merge_parts.empty()) return run_merge(o);
    if (!o.concat_members.empty()) return run_concat(o);
    const auto start = std::chrono::steady_clock::now();
    convert::Job job(o, convert::check_settings(o));
    convert::open_input(job);
    convert::plan_fields(job);
    if (job.settings.range_auto) convert::scan_range(job);
    if (o.shard) convert::shard_source(job);
    convert::plan_output_splits(job);
    convert::select_single_output(job);
    convert::prepare_output(job);
    convert::make_sinks(job);
    convert::stream_input(job);
    convert::finish_output(job);
    const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    const nlohmann::json summary = convert::write_report(job, seconds);
    convert::place_outputs(job);
    convert::print_report(job, summary, seconds);
}

} // namespace dstk
