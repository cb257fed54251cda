#include "dstk/gen/generate.hpp"

#include <chrono>
#include <cmath>
#include <cstring>
#include <fcntl.h>
#include <future>
#include <nlohmann/json.hpp>
#include <unistd.h>

#include "dstk/atomic_output.hpp"
#include "dstk/checksum.hpp"
#include "dstk/dataset_writer.hpp"
#include "dstk/error.hpp"
#include "dstk/fd.hpp"
#include "dstk/signals.hpp"
#include "dstk/thread_pool.hpp"
#include "dstk/units.hpp"

namespace fs = std::filesystem;

namespace dstk {
namespace {

// Work is cut into blocks of a fixed number of samples (independent of the
// thread count, so per-block statistics reduce in the same order every run).
constexpr std::uint64_t block_target_bytes = 2u << 20;
constexpr std::uint64_t round_budget_bytes = 96u << 20; // per buffer set; two sets in flight

struct Block {
    std::vector<unsigned char> x;
    std::vector<std::int32_t> y;
    std::vector<double> sums; // train split only: the block's row of per-channel sums (ChannelSums)
    std::uint64_t first = 0, count = 0;
};

struct SplitPlan {
    std::string name;
    std::uint64_t stream, samples; // samples: the whole split's
    SampleRange range;             // what this run writes: all, or its --shard part
};

// The seeds' v28b layout: images_<split>.bin holds f32 features column-major
// (feature f of sample i at f * N + i); labels_<split>.bin holds i32 labels.
class FeatureMajorWriter {
  public:
    FeatureMajorWriter(DatasetWriter& dw, const std::string& split, std::uint64_t samples, std::uint64_t features)
        : samples_(samples), features_(features) {
        images_ = dw.file("images_" + split + ".bin");
        labels_ = dw.file("labels_" + split + ".bin");
        img_fd_ = UniqueFd::open(images_, O_WRONLY | O_CREAT | O_TRUNC, "cannot create");
        lab_fd_ = UniqueFd::open(labels_, O_WRONLY | O_CREAT | O_TRUNC, "cannot create");
    }
    // Writes a block of samples given as floats, sample-major (count x features).
    void write(std::uint64_t first, std::uint64_t count, const float* values, const std::int32_t* labels) {
        column_.resize(count);
        for (std::uint64_t f = 0; f < features_; ++f) {
            for (std::uint64_t i = 0; i < count; ++i) column_[i] = values[i * features_ + f];
            write_all(img_fd_.get(), column_.data(), count * sizeof(float),
                      static_cast<long long>((f * samples_ + first) * sizeof(float)), images_);
        }
        write_all(lab_fd_.get(), labels, count * sizeof(std::int32_t),
                  static_cast<long long>(first * sizeof(std::int32_t)), labels_);
    }

  private:
    std::uint64_t samples_, features_;
    fs::path images_, labels_;
    UniqueFd img_fd_, lab_fd_;
    std::vector<float> column_;
};

void to_floats(const void* src, DType t, std::uint64_t n, float* out) {
    switch (t) {
    case DType::u8:
        for (std::uint64_t i = 0; i < n; ++i) out[i] = static_cast<const std::uint8_t*>(src)[i];
        return;
    case DType::f32:
        std::memcpy(out, src, n * sizeof(float));
        return;
    case DType::bf16:
        for (std::uint64_t i = 0; i < n; ++i) out[i] = bf16_to_float(static_cast<const std::uint16_t*>(src)[i]);
        return;
    case DType::f16:
        for (std::uint64_t i = 0; i < n; ++i) out[i] = f16_to_float(static_cast<const std::uint16_t*>(src)[i]);
        return;
    case DType::f64:
        for (std::uint64_t i = 0; i < n; ++i) out[i] = static_cast<float>(static_cast<const double*>(src)[i]);
        return;
    default:
        throw usage_error("--layout feature-major needs u8 or floating-point samples");
    }
}

} // namespace

void finalize_options(GenerateOptions& o) {
    if (!o.dtype_given) o.synth.dtype = o.synth.kind == SynthKind::tabular ? DType::f32 : DType::u8;
    if (!o.noise_given)
        o.synth.noise = default_noise(o.synth.kind);
    else if (o.synth.kind == SynthKind::bytes)
        throw usage_error("--noise has no meaning for --kind bytes (random bytes); drop it");
    if (o.train == 0 && o.test == 0) throw usage_error("--train and --test are both 0 (nothing to generate)");
    if (o.out_dir.empty()) throw usage_error("missing OUT_DIR");
    if (o.shard && o.layout == Layout::feature_major)
        throw usage_error("--shard writes sample-major parts; the column-major v28b files of --layout feature-major "
                          "cannot be cut into parts: generate them in one run, or convert the merged dataset with "
                          "dsconvert --to raw --out-layout feature-major");
}

std::uint64_t generate_chunk_samples(std::uint64_t sample_bytes) {
    return std::max<std::uint64_t>(1, block_target_bytes / sample_bytes);
}

namespace {

// What one run shares across its splits.
struct GenRun {
    GenRun(const GenerateOptions& options, Progress& p)
        : o(options), gen(options.synth), sb(sample_bytes(options.synth.shape, options.synth.dtype)),
          features(options.synth.shape.numel()), channels(stats_channels(options.synth.shape)),
          per_channel(features / channels), pool(options.threads), progress(p), sums(channels) {
        block_samples = generate_chunk_samples(sb);
        blocks_per_round =
            std::clamp<std::uint64_t>(round_budget_bytes / (block_samples * sb), 1, 4 * std::uint64_t{pool.size()});
    }
    const GenerateOptions& o;
    const SampleGenerator gen;
    const std::uint64_t sb, features, channels, per_channel;
    ThreadPool pool;
    Progress& progress;
    std::uint64_t block_samples = 1, blocks_per_round = 1;
    ChannelSums sums;                          // train split
    std::vector<std::vector<double>> sum_rows; // train split, per block: kept for a --shard manifest
};

std::vector<SplitPlan> plan_splits(const GenerateOptions& o) {
    std::vector<SplitPlan> splits;
    if (o.train) splits.push_back({"train", 0, o.train, {0, o.train}});
    if (o.test) splits.push_back({"test", 1, o.test, {0, o.test}});
    if (o.shard) {
        const std::uint64_t chunk = generate_chunk_samples(sample_bytes(o.synth.shape, o.synth.dtype));
        for (auto& s : splits) s.range = shard_range(s.samples, chunk, *o.shard);
    }
    return splits;
}

// Bytes about to be written, for the free-disk check and the progress.
std::uint64_t planned_bytes(const GenerateOptions& o, const std::vector<SplitPlan>& splits) {
    const std::uint64_t sb = sample_bytes(o.synth.shape, o.synth.dtype), features = o.synth.shape.numel();
    std::uint64_t total = 0;
    for (const auto& s : splits) {
        std::uint64_t b = checked_mul(s.range.count, sb, "dataset size");
        b = checked_add(b, checked_mul(s.range.count, 4, "label size"), "dataset size");
        if (o.layout == Layout::feature_major)
            b = checked_add(b,
                            checked_mul(checked_mul(s.samples, features, "v28b size"), 4, "v28b size") + s.samples * 4,
                            "dataset size");
        total = checked_add(total, b, "dataset size");
    }
    return total;
}

// Generates blocks b0 .. b0+nb-1 of a split into `set`, in parallel.
void generate_round(GenRun& r, const SplitPlan& split, std::vector<Block>& set, std::uint64_t b0, std::uint64_t nb,
                    bool stats) {
    r.pool.parallel_for(nb, [&](std::uint64_t k) {
        Block& blk = set[k];
        blk.first = (b0 + k) * r.block_samples;
        blk.count = std::min(r.block_samples, split.samples - blk.first);
        blk.x.resize(blk.count * r.sb);
        blk.y.resize(blk.count);
        for (std::uint64_t i = 0; i < blk.count; ++i) {
            const std::uint64_t idx = blk.first + i;
            blk.y[i] = r.gen.label(split.stream, idx);
            r.gen.sample(split.stream, idx, blk.x.data() + i * r.sb);
        }
        if (stats && r.o.synth.kind != SynthKind::bytes)
            blk.sums = channel_sums_row(blk.x.data(), blk.count, r.o.synth.dtype, r.o.synth.shape);
    });
    if (!stats || r.o.synth.kind == SynthKind::bytes) return;
    for (std::uint64_t k = 0; k < nb; ++k) {
        r.sums.add(set[k].sums);
        if (r.o.shard) r.sum_rows.push_back(set[k].sums);
    }
}

struct SplitWriters {
    std::unique_ptr<NpyFieldWriter> x, y;
    std::unique_ptr<FeatureMajorWriter> v28b;
};

void write_round(GenRun& r, SplitWriters& w, const std::vector<Block>& set, std::uint64_t nb) {
    std::vector<float> values;
    for (std::uint64_t k = 0; k < nb; ++k) {
        const Block& blk = set[k];
        w.x->append(blk.x.data(), blk.count);
        w.y->append(blk.y.data(), blk.count);
        if (w.v28b) {
            values.resize(blk.count * r.features);
            to_floats(blk.x.data(), r.o.synth.dtype, blk.count * r.features, values.data());
            w.v28b->write(blk.first, blk.count, values.data(), blk.y.data());
        }
        r.progress.add(blk.count, blk.count * (r.sb + 4));
    }
}

SplitInfo write_split(GenRun& r, DatasetWriter& dw, const SplitPlan& split) {
    SplitWriters w;
    w.x = dw.npy_field(split.name, "x", r.o.synth.dtype, r.o.synth.shape, split.range.count);
    w.y = dw.npy_field(split.name, "y", DType::i32, Shape{}, split.range.count);
    if (r.o.layout == Layout::feature_major)
        w.v28b = std::make_unique<FeatureMajorWriter>(dw, split.name, split.samples, r.features);
    const bool stats = split.name == "train";
    // A --shard range starts on a block boundary (shard_range cuts at blocks).
    const std::uint64_t bfirst = split.range.first / r.block_samples;
    const std::uint64_t bend = (split.range.first + split.range.count + r.block_samples - 1) / r.block_samples;
    // Two sets of blocks: one is generated while the other is written.
    std::vector<Block> sets[2];
    for (auto& set : sets) set.resize(r.blocks_per_round);
    std::future<void> writing;
    int cur = 0;
    for (std::uint64_t b0 = bfirst; b0 < bend; b0 += r.blocks_per_round) {
        throw_if_interrupted();
        const std::uint64_t nb = std::min(r.blocks_per_round, bend - b0);
        generate_round(r, split, sets[cur], b0, nb, stats);
        if (writing.valid()) writing.get();
        writing = std::async(std::launch::async, [&, nb, cur] { write_round(r, w, sets[cur], nb); });
        cur ^= 1;
    }
    if (writing.valid()) writing.get();
    SplitInfo info;
    info.name = split.name;
    info.samples = split.range.count;
    info.fields.push_back(w.x->finish());
    info.fields.push_back(w.y->finish());
    return info;
}

// The settings that decide the bytes: the parts of one dataset share them.
std::string generate_settings(const GenerateOptions& o) {
    const nlohmann::json j = {{"tool", "dsgen"},
                              {"kind", std::string(synth_kind_name(o.synth.kind))},
                              {"shape", o.synth.shape.dims},
                              {"dtype", std::string(dtype_name(o.synth.dtype))},
                              {"classes", o.synth.classes},
                              {"noise", o.synth.noise},
                              {"seed", o.synth.seed},
                              {"train", o.train},
                              {"test", o.test}};
    const std::string text = j.dump();
    Xxh64 h;
    h.update(text.data(), text.size());
    return h.hex();
}

void describe_shard(const GenRun& r, const std::vector<SplitPlan>& splits, Manifest& m) {
    ShardInfo sh;
    sh.index = r.o.shard->index;
    sh.count = r.o.shard->count;
    sh.chunk_samples = r.block_samples;
    sh.settings = generate_settings(r.o);
    for (const auto& s : splits) {
        ShardSplit ss{s.name, s.range.first, s.samples, {}, {}};
        if (s.name == "train") ss.chunk_sums = r.sum_rows;
        sh.splits.push_back(std::move(ss));
    }
    m.shard = std::move(sh);
}

void describe_run(const GenRun& r, const std::vector<SplitPlan>& splits, Manifest& m) {
    const GenerateOptions& o = r.o;
    const std::uint64_t train = o.train ? splits.front().range.count : 0;
    if (train && o.synth.kind != SynthKind::bytes) {
        // The input's statistics, top-level (older readers) and in its field.
        std::string why;
        m.stats = usable_stats(r.sums.stats(static_cast<double>(train) * static_cast<double>(r.per_channel)), why);
        if (m.stats)
            m.splits.front().fields.front().stats = m.stats;
        else
            note(o.out, "no statistics written for field x: " + why);
    }
    if (o.shard) describe_shard(r, splits, m);
    m.num_classes = o.synth.classes;
    m.provenance.tool = "dsgen";
    m.provenance.version = DSTK_VERSION;
    m.provenance.command_line = o.command_line;
    m.provenance.created = now_iso8601();
    m.provenance.seed = o.synth.seed;
    m.provenance.params["kind"] = std::string(synth_kind_name(o.synth.kind));
    m.provenance.params["noise"] = std::to_string(o.synth.noise);
    m.provenance.params["layout"] = std::string(layout_name(o.layout));
}

} // namespace

GenerateResult generate_dataset(const GenerateOptions& o) {
    const auto start = std::chrono::steady_clock::now();
    const std::vector<SplitPlan> splits = plan_splits(o);
    const std::uint64_t total_bytes = planned_bytes(o, splits);
    std::uint64_t total_samples = 0;
    for (const auto& s : splits) total_samples += s.range.count;
    Progress progress("dsgen", total_samples, total_bytes, o.out);
    GenRun run(o, progress);
    fs::path parent = o.out_dir.parent_path();
    if (parent.empty()) parent = ".";
    if (!o.force) check_free_disk(parent, total_bytes + total_bytes / 100 + (64u << 20));
    DatasetWriter dw(o.out_dir, o.force);
    Manifest m;
    for (const auto& split : splits) m.splits.push_back(write_split(run, dw, split));
    progress.finish();
    describe_run(run, splits, m);
    dw.commit(m);

    GenerateResult r;
    r.dir = o.out_dir;
    r.samples = total_samples;
    for (const auto& s : m.splits)
        for (const auto& f : s.fields) r.bytes += f.bytes;
    if (o.layout == Layout::feature_major)
        for (const auto& s : splits) r.bytes += s.samples * (run.features * 4 + 4);
    r.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    r.peak_rss = peak_rss_bytes();
    r.threads = run.pool.size();
    return r;
}

std::string generate_summary(const GenerateResult& r, bool json) {
    const double gbps = r.seconds > 0 ? static_cast<double>(r.bytes) / r.seconds / 1e9 : 0.0;
    if (json) {
        nlohmann::json j{{"tool", "dsgen"},      {"dir", r.dir.string()},       {"samples", r.samples},
                         {"bytes", r.bytes},     {"seconds", r.seconds},        {"gb_per_s", gbps},
                         {"threads", r.threads}, {"peak_rss_bytes", r.peak_rss}};
        return j.dump(2) + "\n";
    }
    char buf[512];
    std::snprintf(buf, sizeof buf, "dsgen: %s samples, %s in %.2f s, %.2f GB/s (%u threads) -> %s\n",
                  format_count(r.samples).c_str(), format_bytes(r.bytes).c_str(), r.seconds, gbps, r.threads,
                  r.dir.string().c_str());
    return buf;
}

} // namespace dstk
