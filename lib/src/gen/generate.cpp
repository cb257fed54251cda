#include "dstk/gen/generate.hpp"

#include <chrono>
#include <cmath>
#include <cstring>
#include <fcntl.h>
#include <future>
#include <nlohmann/json.hpp>
#include <unistd.h>

#include "dstk/atomic_output.hpp"
#include "dstk/dataset_writer.hpp"
#include "dstk/error.hpp"
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
    std::vector<double> sum, sumsq; // per channel, train split only
    std::uint64_t first = 0, count = 0;
};

struct SplitPlan {
    std::string name;
    std::uint64_t stream, samples;
};

// The seeds' v28b layout: images_<split>.bin holds f32 features column-major
// (feature f of sample i at f * N + i); labels_<split>.bin holds i32 labels.
class FeatureMajorWriter {
  public:
    FeatureMajorWriter(DatasetWriter& dw, const std::string& split, std::uint64_t samples, std::uint64_t features)
        : samples_(samples), features_(features) {
        images_ = dw.file("images_" + split + ".bin");
        labels_ = dw.file("labels_" + split + ".bin");
        img_fd_ = ::open(images_.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
        if (img_fd_ < 0) throw_errno("cannot create", images_.string());
        lab_fd_ = ::open(labels_.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
        if (lab_fd_ < 0) throw_errno("cannot create", labels_.string());
    }
    ~FeatureMajorWriter() {
        if (img_fd_ >= 0) ::close(img_fd_);
        if (lab_fd_ >= 0) ::close(lab_fd_);
    }
    // Writes a block of samples given as floats, sample-major (count x features).
    void write(std::uint64_t first, std::uint64_t count, const float* values, const std::int32_t* labels) {
        column_.resize(count);
        for (std::uint64_t f = 0; f < features_; ++f) {
            for (std::uint64_t i = 0; i < count; ++i) column_[i] = values[i * features_ + f];
            write_all(img_fd_, column_.data(), count * sizeof(float),
                      static_cast<long long>((f * samples_ + first) * sizeof(float)), images_);
        }
        write_all(lab_fd_, labels, count * sizeof(std::int32_t), static_cast<long long>(first * sizeof(std::int32_t)),
                  labels_);
    }

  private:
    std::uint64_t samples_, features_;
    fs::path images_, labels_;
    int img_fd_ = -1, lab_fd_ = -1;
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
        throw usage_error("--layout feature needs u8 or floating-point samples");
    }
}

__attribute__((target_clones("avx2", "default"))) void sum_u8(const unsigned char* p, std::uint64_t n,
                                                              std::uint64_t& sum, std::uint64_t& sumsq) {
    // 32-bit partial sums vectorise; flush them before they can overflow.
    for (std::uint64_t i0 = 0; i0 < n; i0 += 65536) {
        const std::uint64_t end = std::min(n, i0 + 65536);
        std::uint32_t s = 0, s2 = 0;
        for (std::uint64_t j = i0; j < end; ++j) {
            s += p[j];
            s2 += std::uint32_t{p[j]} * p[j];
        }
        sum += s;
        sumsq += s2;
    }
}

// Adds one sample's per-channel sum and sum of squares (stored units).
void accumulate_stats(const unsigned char* sample, DType t, std::uint64_t channels, std::uint64_t per_channel,
                      std::vector<float>& scratch, double* sum, double* sumsq) {
    if (t == DType::u8) { // exact integer sums: cheap and order-independent
        for (std::uint64_t c = 0; c < channels; ++c) {
            std::uint64_t s = 0, s2 = 0;
            sum_u8(sample + c * per_channel, per_channel, s, s2);
            sum[c] += static_cast<double>(s);
            sumsq[c] += static_cast<double>(s2);
        }
        return;
    }
    scratch.resize(channels * per_channel);
    to_floats(sample, t, channels * per_channel, scratch.data());
    for (std::uint64_t c = 0; c < channels; ++c) {
        double s = 0, s2 = 0;
        for (std::uint64_t j = 0; j < per_channel; ++j) {
            const double v = scratch[c * per_channel + j];
            s += v;
            s2 += v * v;
        }
        sum[c] += s;
        sumsq[c] += s2;
    }
}

} // namespace

SampleLayout parse_sample_layout(std::string_view t) {
    if (t == "sample") return SampleLayout::sample;
    if (t == "feature") return SampleLayout::feature;
    throw usage_error("unknown --layout '" + std::string(t) + "' (expected sample or feature)");
}

void finalize_options(GenerateOptions& o) {
    if (!o.dtype_given) o.synth.dtype = o.synth.kind == SynthKind::tabular ? DType::f32 : DType::u8;
    if (!o.noise_given)
        o.synth.noise = default_noise(o.synth.kind);
    else if (o.synth.kind == SynthKind::bytes)
        throw usage_error("--noise has no meaning for --kind bytes (random bytes); drop it");
    if (o.train == 0 && o.test == 0) throw usage_error("--train and --test are both 0 (nothing to generate)");
    if (o.out_dir.empty()) throw usage_error("missing OUT_DIR");
}

GenerateResult generate_dataset(const GenerateOptions& o) {
    const auto start = std::chrono::steady_clock::now();
    const std::uint64_t sb = sample_bytes(o.synth.shape, o.synth.dtype);
    const std::uint64_t features = o.synth.shape.numel();

    std::vector<SplitPlan> splits;
    if (o.train) splits.push_back({"train", 0, o.train});
    if (o.test) splits.push_back({"test", 1, o.test});

    // Bytes about to be written, for the free-disk check and the summary.
    std::uint64_t total_bytes = 0, total_samples = 0;
    for (const auto& s : splits) {
        std::uint64_t b = checked_mul(s.samples, sb, "dataset size");
        b = checked_add(b, checked_mul(s.samples, 4, "label size"), "dataset size");
        if (o.layout == SampleLayout::feature)
            b = checked_add(b,
                            checked_mul(checked_mul(s.samples, features, "v28b size"), 4, "v28b size") + s.samples * 4,
                            "dataset size");
        total_bytes = checked_add(total_bytes, b, "dataset size");
        total_samples += s.samples;
    }
    const SampleGenerator gen(o.synth);
    const std::uint64_t channels = gen.channels();
    const std::uint64_t per_channel = features / channels;
    fs::path parent = o.out_dir.parent_path();
    if (parent.empty()) parent = ".";
    if (!o.force) check_free_disk(parent, total_bytes + total_bytes / 100 + (64u << 20));

    DatasetWriter dw(o.out_dir, o.force);
    ThreadPool pool(o.threads);
    const std::uint64_t block_samples = std::max<std::uint64_t>(1, block_target_bytes / sb);
    const std::uint64_t blocks_per_round =
        std::clamp<std::uint64_t>(round_budget_bytes / (block_samples * sb), 1, 4 * std::uint64_t{pool.size()});

    Manifest m;
    m.num_classes = o.synth.classes;
    std::vector<double> ch_sum(channels, 0), ch_sumsq(channels, 0);
    Progress progress("dsgen", total_samples, total_bytes, o.out);

    for (const auto& split : splits) {
        auto xw = dw.npy_field(split.name, "x", o.synth.dtype, o.synth.shape, split.samples);
        auto yw = dw.npy_field(split.name, "y", DType::i32, Shape{}, split.samples);
        std::unique_ptr<FeatureMajorWriter> fw;
        if (o.layout == SampleLayout::feature)
            fw = std::make_unique<FeatureMajorWriter>(dw, split.name, split.samples, features);
        const bool stats = split.name == "train";
        const std::uint64_t nblocks = (split.samples + block_samples - 1) / block_samples;

        // Two sets of blocks: one is generated while the other is written.
        std::vector<Block> sets[2];
        for (auto& set : sets) set.resize(blocks_per_round);
        std::future<void> writing;
        int cur = 0;
        for (std::uint64_t b0 = 0; b0 < nblocks; b0 += blocks_per_round) {
            throw_if_interrupted();
            const std::uint64_t nb = std::min(blocks_per_round, nblocks - b0);
            auto& set = sets[cur];
            pool.parallel_for(nb, [&](std::uint64_t k) {
                Block& blk = set[k];
                blk.first = (b0 + k) * block_samples;
                blk.count = std::min(block_samples, split.samples - blk.first);
                blk.x.resize(blk.count * sb);
                blk.y.resize(blk.count);
                blk.sum.assign(channels, 0);
                blk.sumsq.assign(channels, 0);
                std::vector<float> f;
                for (std::uint64_t i = 0; i < blk.count; ++i) {
                    const std::uint64_t idx = blk.first + i;
                    blk.y[i] = gen.label(split.stream, idx);
                    unsigned char* dst = blk.x.data() + i * sb;
                    gen.sample(split.stream, idx, dst);
                    if (stats && o.synth.kind != SynthKind::bytes)
                        accumulate_stats(dst, o.synth.dtype, channels, per_channel, f, blk.sum.data(),
                                         blk.sumsq.data());
                }
            });
            if (writing.valid()) writing.get();
            if (stats)
                for (std::uint64_t k = 0; k < nb; ++k)
                    for (std::uint64_t c = 0; c < channels; ++c) {
                        ch_sum[c] += set[k].sum[c];
                        ch_sumsq[c] += set[k].sumsq[c];
                    }
            writing = std::async(std::launch::async, [&, nb, cur] {
                std::vector<float> values;
                for (std::uint64_t k = 0; k < nb; ++k) {
                    const Block& blk = sets[cur][k];
                    xw->append(blk.x.data(), blk.count);
                    yw->append(blk.y.data(), blk.count);
                    if (fw) {
                        values.resize(blk.count * features);
                        to_floats(blk.x.data(), o.synth.dtype, blk.count * features, values.data());
                        fw->write(blk.first, blk.count, values.data(), blk.y.data());
                    }
                    progress.add(blk.count, blk.count * (sb + 4));
                }
            });
            cur ^= 1;
        }
        if (writing.valid()) writing.get();
        SplitInfo info;
        info.name = split.name;
        info.samples = split.samples;
        info.fields.push_back(xw->finish());
        info.fields.push_back(yw->finish());
        m.splits.push_back(std::move(info));
    }
    progress.finish();

    if (o.train && o.synth.kind != SynthKind::bytes) {
        ChannelStats st;
        const double n = static_cast<double>(o.train) * static_cast<double>(per_channel);
        for (std::uint64_t c = 0; c < channels; ++c) {
            const double mean = ch_sum[c] / n;
            st.mean.push_back(mean);
            st.std.push_back(std::sqrt(std::max(0.0, ch_sumsq[c] / n - mean * mean)));
        }
        m.stats = std::move(st);
    }
    m.provenance.tool = "dsgen";
    m.provenance.version = DSTK_VERSION;
    m.provenance.command_line = o.command_line;
    m.provenance.created = now_iso8601();
    m.provenance.seed = o.synth.seed;
    m.provenance.params["kind"] = std::string(synth_kind_name(o.synth.kind));
    m.provenance.params["noise"] = std::to_string(o.synth.noise);
    m.provenance.params["layout"] = o.layout == SampleLayout::feature ? "feature" : "sample";
    dw.commit(m);

    GenerateResult r;
    r.dir = o.out_dir;
    r.samples = total_samples;
    r.bytes = 0;
    for (const auto& s : m.splits)
        for (const auto& f : s.fields) r.bytes += f.bytes;
    if (o.layout == SampleLayout::feature)
        for (const auto& s : splits) r.bytes += s.samples * (features * 4 + 4);
    r.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    r.peak_rss = peak_rss_bytes();
    r.threads = pool.size();
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
