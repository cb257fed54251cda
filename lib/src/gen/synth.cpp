#include "dstk/gen/synth.hpp"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "dstk/error.hpp"
#include "dstk/enum_names.hpp"
#include "dstk/rng.hpp"

namespace dstk {
namespace {

// Philox streams: samples of split s use stream 2*s+1 (labels and per-sample
// parameters) and seed their noise from it; class tables use the stream space
// above 2^63 so the two never meet.
constexpr std::uint64_t class_stream_base = std::uint64_t{1} << 63;

std::uint64_t sample_stream(std::uint64_t split) {
    return 2 * split + 1;
}

inline float quantize_u8(float v) {
    return v * 255.0f + 0.5f;
}

void store_values(const float* v, std::uint64_t n, DType dtype, void* dst) {
    switch (dtype) {
    case DType::u8: {
        auto* d = static_cast<std::uint8_t*>(dst);
        for (std::uint64_t i = 0; i < n; ++i) d[i] = static_cast<std::uint8_t>(quantize_u8(v[i]));
        return;
    }
    case DType::f32:
        std::memcpy(dst, v, n * sizeof(float));
        return;
    case DType::bf16: {
        auto* d = static_cast<std::uint16_t*>(dst);
        for (std::uint64_t i = 0; i < n; ++i) d[i] = float_to_bf16(v[i]);
        return;
    }
    case DType::f16: {
        auto* d = static_cast<std::uint16_t*>(dst);
        for (std::uint64_t i = 0; i < n; ++i) d[i] = float_to_f16(v[i]);
        return;
    }
    case DType::f64: {
        auto* d = static_cast<double*>(dst);
        for (std::uint64_t i = 0; i < n; ++i) d[i] = v[i];
        return;
    }
    default:
        throw usage_error("internal: unsupported dtype for synthetic values");
    }
}

} // namespace

namespace {
constexpr EnumNames<SynthKind, 3> synth_kind_names{
    {{{SynthKind::images, "images"}, {SynthKind::tabular, "tabular"}, {SynthKind::bytes, "bytes"}}}};
} // namespace

SynthKind parse_synth_kind(std::string_view t) {
    return synth_kind_names.parse(t, "--kind");
}

std::string_view synth_kind_name(SynthKind k) {
    return synth_kind_names.name(k);
}

double default_noise(SynthKind k) {
    switch (k) {
    case SynthKind::images:
        return 0.25;
    case SynthKind::tabular:
        return 1.0;
    case SynthKind::bytes:
        return 0.0;
    }
    return 0.0;
}

SampleGenerator::SampleGenerator(const SynthParams& p) : p_(p) {
    if (p.classes == 0 || p.classes > 1'000'000)
        throw usage_error("invalid --classes " + std::to_string(p.classes) + " (must be between 1 and 1000000)");
    if (!(p.noise >= 0) || !std::isfinite(p.noise)) throw usage_error("invalid --noise (must be a finite number >= 0)");
    numel_ = p.shape.numel();
    sample_bytes_ = dstk::sample_bytes(p.shape, p.dtype);
    switch (p.kind) {
    case SynthKind::images: {
        const auto& d = p.shape.dims;
        if (d.size() != 3 && d.size() != 2)
            throw usage_error("--kind images needs a CxHxW or HxW shape, not " + p.shape.str() +
                              " (use --kind tabular for flat feature vectors)");
        channels_ = d.size() == 3 ? d[0] : 1;
        height_ = d[d.size() - 2];
        width_ = d[d.size() - 1];
        if (p.dtype != DType::u8 && p.dtype != DType::f32 && p.dtype != DType::bf16 && p.dtype != DType::f16)
            throw usage_error("--kind images writes u8, bf16, f16 or f32, not " + std::string(dtype_name(p.dtype)));
        const std::uint64_t table = std::uint64_t{p.classes} * numel_;
        if (table > (std::uint64_t{256} << 20) / sizeof(float))
            throw usage_error("--classes x shape is too large for the prototype table (" + std::to_string(p.classes) +
                              " x " + p.shape.str() + " over 256 MiB)");
        prototypes_.resize(table);
        const double two_pi = 6.283185307179586;
        for (std::uint32_t c = 0; c < p.classes; ++c) {
            for (std::uint64_t ch = 0; ch < channels_; ++ch) {
                CounterRng rng(p.seed, class_stream_base + std::uint64_t{c} * 4096 + ch);
                constexpr int waves = 4;
                double fx[waves], fy[waves], amp[waves], phase[waves];
                for (int k = 0; k < waves; ++k) {
                    do {
                        fx[k] = static_cast<double>(rng.below(7)) - 3.0;
                        fy[k] = static_cast<double>(rng.below(7)) - 3.0;
                    } while (fx[k] == 0 && fy[k] == 0);
                    amp[k] = rng.uniform(0.08, 0.2);
                    phase[k] = rng.uniform(0, two_pi);
                }
                float* out = &prototypes_[(std::uint64_t{c} * channels_ + ch) * height_ * width_];
                for (std::uint64_t y = 0; y < height_; ++y)
                    for (std::uint64_t x = 0; x < width_; ++x) {
                        double v = 0.5;
                        for (int k = 0; k < waves; ++k)
                            v += amp[k] * std::sin(two_pi * (fx[k] * double(x) / double(width_) +
                                                             fy[k] * double(y) / double(height_)) +
                                                   phase[k]);
                        out[y * width_ + x] = static_cast<float>(std::clamp(v, 0.0, 1.0));
                    }
            }
        }
        break;
    }
    case SynthKind::tabular: {
        if (!is_float(p.dtype))
            throw usage_error("--kind tabular writes floating-point features (f16, bf16, f32, f64), not " +
                              std::string(dtype_name(p.dtype)));
        const std::uint64_t table = std::uint64_t{p.classes} * numel_;
        if (table > (std::uint64_t{256} << 20) / sizeof(float))
            throw usage_error("--classes x shape is too large for the class-mean table");
        prototypes_.resize(table);
        for (std::uint32_t c = 0; c < p.classes; ++c) {
            CounterRng rng(p.seed, class_stream_base + std::uint64_t{c} * 4096);
            for (std::uint64_t f = 0; f < numel_; ++f)
                prototypes_[std::uint64_t{c} * numel_ + f] = static_cast<float>(rng.normal());
        }
        break;
    }
    case SynthKind::bytes:
        break;
    }
}

std::int32_t SampleGenerator::label(std::uint64_t split, std::uint64_t index) const {
    const PhiloxBlock b = philox(p_.seed, sample_stream(split), index);
    const std::uint64_t r = (std::uint64_t{b[0]} << 32) | b[1];
    return static_cast<std::int32_t>((static_cast<unsigned __int128>(r) * p_.classes) >> 64);
}

void SampleGenerator::sample(std::uint64_t split, std::uint64_t index, void* dst) const {
    const std::int32_t c = label(split, index);
    switch (p_.kind) {
    case SynthKind::images:
        image(split, index, c, dst);
        return;
    case SynthKind::tabular:
        tabular(split, index, c, dst);
        return;
    case SynthKind::bytes: {
        const PhiloxBlock b = philox(p_.seed, sample_stream(split), index);
        SplitMix64 rng((std::uint64_t{b[2]} << 32) | b[3]);
        auto* d = static_cast<unsigned char*>(dst);
        std::uint64_t i = 0;
        for (; i + 8 <= sample_bytes_; i += 8) {
            const std::uint64_t v = rng.next();
            std::memcpy(d + i, &v, 8);
        }
        if (i < sample_bytes_) {
            const std::uint64_t v = rng.next();
            std::memcpy(d + i, &v, sample_bytes_ - i);
        }
        return;
    }
    }
}

namespace {

// Stores a row of values in [0, 1] as the stored dtype.
struct StoreU8 {
    std::uint8_t* d;
    void operator()(std::uint64_t at, const float* v, std::uint64_t n) const;
};
struct StoreF32 {
    float* d;
    void operator()(std::uint64_t at, const float* v, std::uint64_t n) const { std::memcpy(d + at, v, n * 4); }
};
struct StoreBf16 {
    std::uint16_t* d;
    void operator()(std::uint64_t at, const float* v, std::uint64_t n) const {
        for (std::uint64_t i = 0; i < n; ++i) d[at + i] = float_to_bf16(v[i]);
    }
};
struct StoreF16 {
    std::uint16_t* d;
    void operator()(std::uint64_t at, const float* v, std::uint64_t n) const {
        for (std::uint64_t i = 0; i < n; ++i) d[at + i] = float_to_f16(v[i]);
    }
};

// A 32-bit integer hash with good avalanche (Wellons' "lowbias32"): per-pixel
// noise from the pixel's index, so the inner loop has no serial RNG state and
// vectorises.
inline std::uint32_t hash32(std::uint32_t x) {
    x ^= x >> 16;
    x *= 0x7feb352dU;
    x ^= x >> 15;
    x *= 0x846ca68bU;
    x ^= x >> 16;
    return x;
}

} // namespace

// One image row: v = clamp(base + contrast * s + noise, 0, 1). Integer hashing
// and float math without contraction give the same bits on every code path;
// the AVX2 clone only runs it 8 lanes wide.
__attribute__((target_clones("avx2", "default"))) void noisy_row(const float* s, float* v, std::uint32_t w,
                                                                 std::uint32_t row_key, float base, float contrast,
                                                                 float noise_scale) {
    for (std::uint32_t x = 0; x < w; ++x) {
        const std::uint32_t h = hash32(row_key + x * 0x9E3779B9U);
        const float n = static_cast<float>(static_cast<std::int32_t>((h & 0xFFFFU) + (h >> 16)));
        v[x] = std::min(std::max(base + contrast * s[x] + noise_scale * n, 0.0f), 1.0f);
    }
}

__attribute__((target_clones("avx2", "default"))) void store_u8_row(std::uint8_t* d, const float* v, std::uint64_t n) {
    for (std::uint64_t i = 0; i < n; ++i)
        d[i] = static_cast<std::uint8_t>(static_cast<std::int32_t>(v[i] * 255.0f + 0.5f));
}

void StoreU8::operator()(std::uint64_t at, const float* v, std::uint64_t n) const {
    store_u8_row(d + at, v, n);
}

template <typename Store>
void SampleGenerator::image_into(std::uint64_t split, std::uint64_t index, std::int32_t c, Store store) const {
    const PhiloxBlock b = philox(p_.seed, sample_stream(split), index);
    // Per-sample parameters from a second Philox block of this sample.
    const PhiloxBlock q = philox(p_.seed, sample_stream(split) + (std::uint64_t{1} << 62), index);
    const auto unit = [](std::uint32_t u) { return static_cast<float>(u) * 0x1.0p-32f; };
    const std::uint64_t max_shift = std::max<std::uint64_t>(1, width_ / 8);
    const std::uint64_t span = 2 * max_shift + 1;
    const std::uint64_t dx = (q[0] % span + width_ - max_shift) % width_;
    const std::uint64_t dy = (q[1] % span + height_ - max_shift) % height_;
    const float contrast = 0.6f + 0.8f * unit(q[2]);
    const float brightness = -0.15f + 0.3f * unit(q[3]);
    // Triangular noise (sum of two 16-bit uniforms, mean 65535) with standard deviation `noise`.
    const float noise_scale = static_cast<float>(p_.noise) * 2.449489743f / 65536.0f;
    const float base = 0.5f - 0.5f * contrast + brightness - 65535.0f * noise_scale;
    const std::uint32_t key = b[2] ^ (b[3] * 0x9E3779B9U);

    const std::uint64_t plane = height_ * width_;
    const float* proto = &prototypes_[static_cast<std::uint64_t>(c) * channels_ * plane];
    thread_local std::vector<float> shifted, values;
    shifted.resize(width_);
    values.resize(width_);
    std::uint32_t pixel = 0;
    std::uint64_t o = 0;
    for (std::uint64_t ch = 0; ch < channels_; ++ch) {
        for (std::uint64_t y = 0; y < height_; ++y) {
            // The prototype row shifted by dx with wrap-around.
            const float* src = proto + ch * plane + ((y + dy) % height_) * width_;
            std::copy(src + dx, src + width_, shifted.begin());
            std::copy(src, src + dx, shifted.begin() + static_cast<std::ptrdiff_t>(width_ - dx));
            const auto w = static_cast<std::uint32_t>(width_);
            noisy_row(shifted.data(), values.data(), w, key + pixel * 0x9E3779B9U, base, contrast, noise_scale);
            store(o, values.data(), width_);
            pixel += w;
            o += width_;
        }
    }
}

void SampleGenerator::image(std::uint64_t split, std::uint64_t index, std::int32_t c, void* dst) const {
    switch (p_.dtype) {
    case DType::u8:
        image_into(split, index, c, StoreU8{static_cast<std::uint8_t*>(dst)});
        return;
    case DType::f32:
        image_into(split, index, c, StoreF32{static_cast<float*>(dst)});
        return;
    case DType::bf16:
        image_into(split, index, c, StoreBf16{static_cast<std::uint16_t*>(dst)});
        return;
    case DType::f16:
        image_into(split, index, c, StoreF16{static_cast<std::uint16_t*>(dst)});
        return;
    default:
        throw usage_error("internal: images in " + std::string(dtype_name(p_.dtype)));
    }
}

void SampleGenerator::tabular(std::uint64_t split, std::uint64_t index, std::int32_t c, void* dst) const {
    const PhiloxBlock b = philox(p_.seed, sample_stream(split), index);
    SplitMix64 rng((std::uint64_t{b[2]} << 32) | b[3]);
    thread_local std::vector<float> v;
    v.resize(numel_);
    const float* mean = &prototypes_[static_cast<std::uint64_t>(c) * numel_];
    const float noise = static_cast<float>(p_.noise);
    for (std::uint64_t f = 0; f < numel_; f += 2) {
        // Box-Muller on two 53-bit uniforms: two normals per draw.
        const double u1 = (static_cast<double>(rng.next() >> 11) + 0.5) * 0x1.0p-53;
        const double u2 = static_cast<double>(rng.next() >> 11) * 0x1.0p-53;
        const double r = std::sqrt(-2.0 * std::log(u1));
        v[f] = mean[f] + noise * static_cast<float>(r * std::cos(6.283185307179586 * u2));
        if (f + 1 < numel_) v[f + 1] = mean[f + 1] + noise * static_cast<float>(r * std::sin(6.283185307179586 * u2));
    }
    store_values(v.data(), numel_, p_.dtype, dst);
}

} // namespace dstk
