#pragma once
// Synthetic samples as pure functions of (parameters, seed, split, index):
// the same sample whatever thread generates it, in whatever order.
//
// images:  learnable class-conditional images. Each class has a smooth
//          prototype per channel (a sum of random low-frequency waves); a sample
//          is its class prototype shifted (with wrap-around), scaled in
//          contrast, offset in brightness, plus per-pixel noise of std --noise.
// tabular: a Gaussian mixture: class means ~ N(0, 1) per feature, samples are
//          mean + noise * N(0, 1).
// bytes:   uniformly random bytes (pure I/O tests); labels random.
#include <cstdint>
#include <string_view>
#include <vector>

#include "dstk/dtype.hpp"
#include "dstk/shape.hpp"

namespace dstk {

enum class SynthKind { images, tabular, bytes };
SynthKind parse_synth_kind(std::string_view text);
std::string_view synth_kind_name(SynthKind k);
double default_noise(SynthKind k); // images 0.25, tabular 1.0, bytes 0

struct SynthParams {
    SynthKind kind = SynthKind::images;
    Shape shape{{3, 32, 32}};
    DType dtype = DType::u8;
    std::uint32_t classes = 10;
    double noise = 0.25;
    std::uint64_t seed = 0;
};

class SampleGenerator {
  public:
    // Validates the combination (usage errors: images need CxHxW or HxW,
    // tabular needs a float dtype, ...).
    explicit SampleGenerator(const SynthParams& p);

    const SynthParams& params() const { return p_; }
    std::uint64_t sample_bytes() const { return sample_bytes_; }
    std::uint64_t channels() const { return channels_; }

    std::int32_t label(std::uint64_t split_stream, std::uint64_t index) const;
    // Writes one sample (sample_bytes() bytes) into dst.
    void sample(std::uint64_t split_stream, std::uint64_t index, void* dst) const;

  private:
    template <typename Store>
    void image_into(std::uint64_t stream, std::uint64_t index, std::int32_t label, Store store) const;
    void image(std::uint64_t stream, std::uint64_t index, std::int32_t label, void* dst) const;
    void tabular(std::uint64_t stream, std::uint64_t index, std::int32_t label, void* dst) const;

    SynthParams p_;
    std::uint64_t sample_bytes_, numel_, channels_ = 1, height_ = 1, width_ = 1;
    std::vector<float> prototypes_; // images: classes x C x H x W in [0, 1]; tabular: classes x numel means
};

} // namespace dstk
