// Element conversions between dataset dtypes, with the error accounting that
// dsconvert reports. One template loop per (input, output) pair, so the inner
// loop has no per-element dispatch.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <type_traits>
#include <vector>

#include "dstk/convert/dtype_kernels.hpp"
#include "dstk/error.hpp"

namespace dstk {
namespace {

struct F16 {
    std::uint16_t v;
};
struct BF16 {
    std::uint16_t v;
};

// Same rounding as dstk::float_to_bf16 (nearest even, NaN kept quiet), inline
// because it is the hot path of f32 -> bf16.
inline std::uint16_t bf16_rne(float f) {
    std::uint32_t b;
    std::memcpy(&b, &f, 4);
    if ((b & 0x7FFFFFFFu) > 0x7F800000u) return static_cast<std::uint16_t>((b >> 16) | 0x40);
    return static_cast<std::uint16_t>((b + 0x7FFFu + ((b >> 16) & 1u)) >> 16);
}
inline float bf16_value(std::uint16_t h) {
    const std::uint32_t b = std::uint32_t{h} << 16;
    float f;
    std::memcpy(&f, &b, 4);
    return f;
}

template <class T> inline double load(T x) {
    return static_cast<double>(x);
}
template <> inline double load(F16 x) {
    return f16_to_float(x.v);
}
template <> inline double load(BF16 x) {
    return bf16_value(x.v);
}

template <class T>
constexpr bool is_float_v = std::is_floating_point_v<T> || std::is_same_v<T, F16> || std::is_same_v<T, BF16>;

struct Local {
    std::uint64_t inexact = 0, clipped = 0, overflow = 0, nan = 0;
    double max_abs = 0, max_rel = 0;
    void error(double exact, double got) {
        if (got == exact) return;
        ++inexact;
        const double e = std::fabs(got - exact);
        if (e > max_abs) max_abs = e;
        if (exact != 0) {
            const double r = e / std::fabs(exact);
            if (r > max_rel) max_rel = r;
        }
    }
    // Adds this tally of n elements, In -> Out bytes, to `stats`.
    void add_to(ConversionStats& stats, std::uint64_t n, std::uint64_t in_bytes, std::uint64_t out_bytes) const {
        stats.elements += n;
        stats.inexact += inexact;
        stats.clipped += clipped;
        stats.overflow_inf += overflow;
        stats.nan += nan;
        stats.max_abs_error = std::max(stats.max_abs_error, max_abs);
        stats.max_rel_error = std::max(stats.max_rel_error, max_rel);
        stats.bytes_in += n * in_bytes;
        stats.bytes_out += n * out_bytes;
    }
};

template <class Out> inline Out store(double d, Local& s) {
    if constexpr (is_float_v<Out>) {
        Out out;
        if constexpr (std::is_same_v<Out, F16>)
            out.v = float_to_f16(static_cast<float>(d));
        else if constexpr (std::is_same_v<Out, BF16>)
            out.v = bf16_rne(static_cast<float>(d));
        else
            out = static_cast<Out>(d);
        const double back = load(out);
        if (std::isnan(d))
            ++s.nan;
        else if (std::isinf(back) && !std::isinf(d))
            ++s.overflow;
        else
            s.error(d, back);
        return out;
    } else {
        constexpr double lo = static_cast<double>(std::numeric_limits<Out>::min());
        // One past the largest value, exactly representable for every width.
        constexpr double hi_excl = static_cast<double>(std::numeric_limits<Out>::max() / 2 + 1) * 2.0;
        if (std::isnan(d)) {
            ++s.nan;
            return Out{0};
        }
        double r = std::nearbyint(d);
        Out out;
        if (r < lo) {
            ++s.clipped;
            out = std::numeric_limits<Out>::min();
        } else if (r >= hi_excl) {
            ++s.clipped;
            out = std::numeric_limits<Out>::max();
        } else {
            out = static_cast<Out>(r);
        }
        s.error(d, static_cast<double>(out));
        return out;
    }
}

template <class In, class Out>
void loop(const void* src, void* dst, std::uint64_t n, const ValueMapping& map, ConversionStats& stats) {
    const auto* in = static_cast<const In*>(src);
    auto* out = static_cast<Out*>(dst);
    Local s;
    if (map.identity()) {
        for (std::uint64_t i = 0; i < n; ++i) {
            In x;
            std::memcpy(&x, in + i, sizeof x);
            const Out y = store<Out>(load(x), s);
            std::memcpy(out + i, &y, sizeof y);
        }
    } else {
        for (std::uint64_t i = 0; i < n; ++i) {
            In x;
            std::memcpy(&x, in + i, sizeof x);
            const Out y = store<Out>(load(x) * map.scale + map.offset, s);
            std::memcpy(out + i, &y, sizeof y);
        }
    }
    s.add_to(stats, n, sizeof(In), sizeof(Out));
}

// f32 -> bf16 without a mapping (the fast path). Branch-free so that
// the compiler vectorises it: integer rounding, selects instead of branches,
// and the error maxima taken on the bit patterns of non-negative floats (the
// same order as the values), which needs no float max reduction. Integer ops
// and IEEE float subtraction and division give the same bits on every code
// path; the AVX2 clone only runs it 8 lanes wide.
struct Bf16Tally {
    std::uint32_t inexact = 0, overflow = 0, nan = 0, max_abs_bits = 0, max_rel_bits = 0;
};

// The error accounting of the f32 -> bf16 / f16 kernels, one element at a
// time: b the input's bits, a its magnitude's, back_bits the output read back
// as f32. Integer arithmetic with masks but for one subtraction and one
// division, so that the loops calling it stay branch-free and vectorise;
// positive floats compare as their bits. Inexact <=> the bits differ (NaN and
// overflow excluded).
struct HalfTallyLanes {
    std::uint32_t inexact = 0, overflow = 0, nan = 0, max_abs = 0, max_rel = 0;

    [[gnu::always_inline]] inline void add(std::uint32_t b, std::uint32_t a, std::uint32_t back_bits, std::uint32_t ovf,
                                           std::uint32_t is_nan) {
        const std::uint32_t inex = (back_bits != b ? 1u : 0u) & ~is_nan & ~ovf & 1u;
        const std::uint32_t m = 0u - inex;
        float back, f;
        std::memcpy(&back, &back_bits, 4);
        std::memcpy(&f, &b, 4);
        const float d = back - f;
        std::uint32_t db;
        std::memcpy(&db, &d, 4);
        const std::uint32_t eb = db & 0x7FFFFFFFu & m;
        const std::uint32_t denb = (a & m) | (~m & 0x3F800000u);
        float e, den;
        std::memcpy(&e, &eb, 4);
        std::memcpy(&den, &denb, 4);
        const float rel = e / den;
        std::uint32_t rb;
        std::memcpy(&rb, &rel, 4);
        max_abs = eb > max_abs ? eb : max_abs;
        max_rel = rb > max_rel ? rb : max_rel;
        inexact += inex;
        overflow += ovf;
        nan += is_nan;
    }
    void flush(Bf16Tally& t) const {
        t.inexact += inexact;
        t.overflow += overflow;
        t.nan += nan;
        t.max_abs_bits = t.max_abs_bits > max_abs ? t.max_abs_bits : max_abs;
        t.max_rel_bits = t.max_rel_bits > max_rel ? t.max_rel_bits : max_rel;
    }
};

// Round to nearest even on the bit pattern; NaN stays NaN (quieted).
__attribute__((target_clones("avx2", "default"))) void f32_to_bf16_kernel(const float* in, std::uint16_t* out,
                                                                          std::uint32_t n, Bf16Tally& t) {
    HalfTallyLanes lanes;
    for (std::uint32_t i = 0; i < n; ++i) {
        std::uint32_t b;
        std::memcpy(&b, in + i, 4);
        const std::uint32_t a = b & 0x7FFFFFFFu;
        const std::uint32_t is_nan = a > 0x7F800000u ? 1u : 0u;
        const std::uint32_t nan_m = 0u - is_nan;
        const std::uint32_t rounded = (b + 0x7FFFu + ((b >> 16) & 1u)) >> 16;
        const std::uint32_t h = (nan_m & ((b >> 16) | 0x40u)) | (~nan_m & rounded);
        out[i] = static_cast<std::uint16_t>(h);
        const std::uint32_t back_bits = h << 16;
        const std::uint32_t ovf = ((h & 0x7FFFu) == 0x7F80u ? 1u : 0u) & (a < 0x7F800000u ? 1u : 0u);
        lanes.add(b, a, back_bits, ovf, is_nan);
    }
    lanes.flush(t);
}

// u8 -> any type: there are only 256 inputs, so the kernel computes their
// outputs once, with the same rounding and error accounting as the generic
// loop (store()), and is then a table lookup over restrict pointers. The
// error accounting needs only which values occur: the exact values (or the
// inexact ones, whichever are fewer, up to 4) are counted in one vectorised
// compare pass, and the largest errors are found by looking for the worst
// values with memchr; mappings that clip or overflow some values, or have
// many of both kinds, fall back to a byte histogram.
template <class Bits>
void u8_lookup(const std::uint8_t* __restrict in, Bits* __restrict out, std::uint64_t n, const Bits* __restrict table) {
    for (std::uint64_t i = 0; i < n; ++i) out[i] = table[in[i]];
}
// The u8 -> f32 case gets AVX2 / AVX-512 clones (gathers).
__attribute__((target_clones("avx512f", "avx2", "default"))) void u8_lookup32(const std::uint8_t* __restrict in,
                                                                              std::uint32_t* __restrict out,
                                                                              std::uint64_t n,
                                                                              const std::uint32_t* __restrict table) {
    for (std::uint64_t i = 0; i < n; ++i) out[i] = table[in[i]];
}

// Elements equal to one of a, b, c, d; n < 2^32 (the caller passes blocks).
__attribute__((target_clones("avx2", "default"))) std::uint32_t u8_count4(const std::uint8_t* __restrict in,
                                                                          std::uint32_t n, std::uint8_t a,
                                                                          std::uint8_t b, std::uint8_t c,
                                                                          std::uint8_t d) {
    std::uint32_t k = 0;
    for (std::uint32_t i = 0; i < n; ++i) {
        const std::uint8_t x = in[i];
        k += static_cast<std::uint32_t>((x == a) | (x == b) | (x == c) | (x == d));
    }
    return k;
}

std::uint64_t u8_count(const std::uint8_t* in, std::uint64_t n, const std::vector<std::uint8_t>& values) {
    if (values.empty()) return 0;
    std::uint8_t v[4];
    for (int k = 0; k < 4; ++k) v[k] = values[std::min<std::size_t>(k, values.size() - 1)];
    std::uint64_t total = 0;
    constexpr std::uint64_t step = 1ull << 30;
    for (std::uint64_t at = 0; at < n; at += step)
        total += u8_count4(in + at, static_cast<std::uint32_t>(std::min(step, n - at)), v[0], v[1], v[2], v[3]);
    return total;
}

__attribute__((target_clones("avx2", "default"))) void u8_histogram(const std::uint8_t* in, std::uint64_t n,
                                                                    std::uint64_t* hist) {
    std::uint32_t h[4][256] = {};
    constexpr std::uint64_t step = 1ull << 30; // keeps the 32-bit counters from overflowing
    for (std::uint64_t at = 0; at < n; at += step) {
        const std::uint64_t end = std::min(n, at + step);
        std::uint64_t i = at;
        for (; i + 4 <= end; i += 4) {
            ++h[0][in[i]];
            ++h[1][in[i + 1]];
            ++h[2][in[i + 2]];
            ++h[3][in[i + 3]];
        }
        for (; i < end; ++i) ++h[0][in[i]];
        for (int v = 0; v < 256; ++v) {
            hist[v] += std::uint64_t{h[0][v]} + h[1][v] + h[2][v] + h[3][v];
            h[0][v] = h[1][v] = h[2][v] = h[3][v] = 0;
        }
    }
}

// The largest `err` among the values in `by_err` (sorted by err, largest
// first) that occur in the input; false when none of the first few occurs
// (the caller then builds a histogram).
bool largest_present(const std::uint8_t* in, std::uint64_t n, const std::vector<std::uint8_t>& by_err,
                     const double* err, double& out) {
    constexpr std::size_t tries = 8;
    for (std::size_t k = 0; k < by_err.size() && k < tries; ++k)
        if (std::memchr(in, by_err[k], n)) {
            out = err[by_err[k]];
            return true;
        }
    return by_err.empty();
}

template <class Out>
void from_u8(const void* src, void* dst, std::uint64_t n, const ValueMapping& map, ConversionStats& stats) {
    using Bits =
        std::conditional_t<sizeof(Out) == 1, std::uint8_t,
                           std::conditional_t<sizeof(Out) == 2, std::uint16_t,
                                              std::conditional_t<sizeof(Out) == 4, std::uint32_t, std::uint64_t>>>;
    static_assert(sizeof(Bits) == sizeof(Out));
    const auto* in = static_cast<const std::uint8_t*>(src);
    Bits table[256];
    Local per[256];
    double abs_err[256], rel_err[256];
    std::vector<std::uint8_t> exact, inexact;
    bool other = false; // some value clips, overflows or is NaN
    for (int v = 0; v < 256; ++v) {
        const Out y = store<Out>(map.identity() ? static_cast<double>(v) : v * map.scale + map.offset, per[v]);
        std::memcpy(&table[v], &y, sizeof y);
        abs_err[v] = per[v].max_abs;
        rel_err[v] = per[v].max_rel;
        (per[v].inexact ? inexact : exact).push_back(static_cast<std::uint8_t>(v));
        other |= per[v].clipped || per[v].overflow || per[v].nan;
    }
    if constexpr (sizeof(Bits) == 4)
        u8_lookup32(in, static_cast<std::uint32_t*>(dst), n, table);
    else
        u8_lookup(in, static_cast<Bits*>(dst), n, table);
    Local s;
    bool done = inexact.empty() && !other;
    if (!done && !other && exact.size() <= 4) {
        std::vector<std::uint8_t> by_abs = inexact, by_rel = inexact;
        std::stable_sort(by_abs.begin(), by_abs.end(), [&](auto a, auto b) { return abs_err[a] > abs_err[b]; });
        std::stable_sort(by_rel.begin(), by_rel.end(), [&](auto a, auto b) { return rel_err[a] > rel_err[b]; });
        s.inexact = n - u8_count(in, n, exact);
        done = s.inexact == 0 || (largest_present(in, n, by_abs, abs_err, s.max_abs) &&
                                  largest_present(in, n, by_rel, rel_err, s.max_rel));
    } else if (!done && !other && inexact.size() <= 4) {
        for (std::uint8_t v : inexact) {
            const std::uint64_t c = u8_count(in, n, {v});
            if (!c) continue;
            s.inexact += c;
            s.max_abs = std::max(s.max_abs, abs_err[v]);
            s.max_rel = std::max(s.max_rel, rel_err[v]);
        }
        done = true;
    }
    if (!done) {
        s = Local{};
        std::uint64_t hist[256] = {};
        u8_histogram(in, n, hist);
        for (int v = 0; v < 256; ++v) {
            if (!hist[v]) continue;
            s.inexact += hist[v] * per[v].inexact;
            s.clipped += hist[v] * per[v].clipped;
            s.overflow += hist[v] * per[v].overflow;
            s.nan += hist[v] * per[v].nan;
            s.max_abs = std::max(s.max_abs, per[v].max_abs);
            s.max_rel = std::max(s.max_rel, per[v].max_rel);
        }
    }
    s.add_to(stats, n, 1, sizeof(Out));
}

// f16 / bf16 -> f32 widen exactly; only NaN inputs are counted, and they
// come out as quiet NaNs with their payload. bf16 is a shift; f16 is a
// lookup in a table of all 65536 values built by the generic path's own
// conversion.
__attribute__((target_clones("avx2", "default"))) std::uint64_t
bf16_widen(const std::uint16_t* __restrict in, std::uint32_t* __restrict out, std::uint64_t n) {
    std::uint64_t nan = 0;
    for (std::uint64_t i = 0; i < n; ++i) {
        const std::uint32_t h = in[i];
        const std::uint32_t is_nan = (h & 0x7FFFu) > 0x7F80u ? 1u : 0u;
        out[i] = (h << 16) | (is_nan << 22);
        nan += is_nan;
    }
    return nan;
}

__attribute__((target_clones("avx2", "default"))) std::uint64_t f16_widen(const std::uint16_t* __restrict in,
                                                                          std::uint32_t* __restrict out,
                                                                          std::uint64_t n,
                                                                          const std::uint32_t* __restrict table) {
    std::uint64_t nan = 0;
    for (std::uint64_t i = 0; i < n; ++i) {
        const std::uint16_t h = in[i];
        out[i] = table[h];
        nan += (h & 0x7FFFu) > 0x7C00u ? 1u : 0u;
    }
    return nan;
}

const std::uint32_t* f16_to_f32_table() {
    static const std::vector<std::uint32_t> table = [] {
        std::vector<std::uint32_t> t(65536);
        Local unused;
        for (std::uint32_t h = 0; h < 65536; ++h) {
            const float f = store<float>(load(F16{static_cast<std::uint16_t>(h)}), unused);
            std::memcpy(&t[h], &f, 4);
            if (std::isnan(f)) t[h] |= 0x400000u; // quiet, like bf16_widen
        }
        return t;
    }();
    return table.data();
}

void half_to_f32(DType from, const void* src, void* dst, std::uint64_t n, ConversionStats& stats) {
    const auto* in = static_cast<const std::uint16_t*>(src);
    auto* out = static_cast<std::uint32_t*>(dst);
    stats.nan += from == DType::bf16 ? bf16_widen(in, out, n) : f16_widen(in, out, n, f16_to_f32_table());
    stats.elements += n;
    stats.bytes_in += 2 * n;
    stats.bytes_out += 4 * n;
}

// f32 -> f16 without a mapping, branch-free like f32_to_bf16 and with the
// same bits as dstk::float_to_f16: normal numbers round on the integer bit
// pattern; numbers below 2^-14 (f16 subnormals) are scaled by 2^24 and
// rounded to an integer by adding 2^23 in float arithmetic (exact scaling,
// one round-to-nearest-even); selects pick the case.
__attribute__((target_clones("avx2", "default"))) void
f32_to_f16_kernel(const float* __restrict in, std::uint16_t* __restrict out, std::uint32_t n, Bf16Tally& t) {
    HalfTallyLanes lanes;
    for (std::uint32_t i = 0; i < n; ++i) {
        std::uint32_t b;
        std::memcpy(&b, in + i, 4);
        const std::uint32_t a = b & 0x7FFFFFFFu;
        const std::uint32_t sign = (b >> 16) & 0x8000u;
        const std::uint32_t rebased = a - 0x38000000u;
        const std::uint32_t normal = (rebased + 0x0FFFu + ((rebased >> 13) & 1u)) >> 13;
        float af;
        std::memcpy(&af, &a, 4);
        const float scaled = af * 0x1p24f + 0x1p23f;
        std::uint32_t sb;
        std::memcpy(&sb, &scaled, 4);
        const std::uint32_t sub = sb - 0x4B000000u;
        const std::uint32_t is_nan = a > 0x7F800000u ? 1u : 0u;
        // Masks, not ?:, so that GCC if-converts the whole body and vectorises it.
        const std::uint32_t m_sub = 0u - static_cast<std::uint32_t>(a < 0x38800000u);
        const std::uint32_t m_big = 0u - static_cast<std::uint32_t>(a >= 0x477FF000u);
        const std::uint32_t m_inf = 0u - static_cast<std::uint32_t>(a >= 0x7F800000u);
        std::uint32_t h = (sub & m_sub) | (normal & ~m_sub);
        h = (0x7C00u & m_big) | (h & ~m_big);
        h = ((0x7C00u | (is_nan << 9)) & m_inf) | (h & ~m_inf);
        h |= sign;
        out[i] = static_cast<std::uint16_t>(h);
        // The f16 read back as f32: rebias a normal, scale a subnormal exactly.
        const std::uint32_t hm = h & 0x7FFFu;
        const float sub_back = static_cast<float>(static_cast<std::int32_t>(hm)) * 0x1p-24f;
        std::uint32_t sub_bits;
        std::memcpy(&sub_bits, &sub_back, 4);
        const std::uint32_t m_hsub = 0u - static_cast<std::uint32_t>(hm < 0x0400u);
        const std::uint32_t m_hinf = 0u - static_cast<std::uint32_t>(hm >= 0x7C00u);
        std::uint32_t back_bits = (sub_bits & m_hsub) | (((hm << 13) + 0x38000000u) & ~m_hsub);
        back_bits = ((0x7F800000u & m_hinf) | (back_bits & ~m_hinf)) | (sign << 16);
        const std::uint32_t ovf = ((h & 0x7FFFu) == 0x7C00u ? 1u : 0u) & (a < 0x7F800000u ? 1u : 0u);
        lanes.add(b, a, back_bits, ovf, is_nan);
    }
    lanes.flush(t);
}

// f32 -> bf16 or f16 (to_f16) without a mapping.
void f32_to_half(const void* src, void* dst, std::uint64_t n, bool to_f16, ConversionStats& stats) {
    const auto* in = static_cast<const float*>(src);
    auto* out = static_cast<std::uint16_t*>(dst);
    constexpr std::uint64_t step = 1u << 24; // keeps the 32-bit tallies from overflowing
    std::uint64_t inexact = 0, overflow = 0, nan = 0;
    std::uint32_t max_abs = 0, max_rel = 0;
    for (std::uint64_t at = 0; at < n; at += step) {
        Bf16Tally t;
        const auto len = static_cast<std::uint32_t>(std::min(step, n - at));
        if (to_f16)
            f32_to_f16_kernel(in + at, out + at, len, t);
        else
            f32_to_bf16_kernel(in + at, out + at, len, t);
        inexact += t.inexact;
        overflow += t.overflow;
        nan += t.nan;
        max_abs = std::max(max_abs, t.max_abs_bits);
        max_rel = std::max(max_rel, t.max_rel_bits);
    }
    float fa, fr;
    std::memcpy(&fa, &max_abs, 4);
    std::memcpy(&fr, &max_rel, 4);
    stats.elements += n;
    stats.inexact += inexact;
    stats.overflow_inf += overflow;
    stats.nan += nan;
    stats.max_abs_error = std::max<double>(stats.max_abs_error, fa);
    stats.max_rel_error = std::max<double>(stats.max_rel_error, fr);
    stats.bytes_in += 4 * n;
    stats.bytes_out += 2 * n;
}

template <class F> void with_type(DType t, F&& f) {
    switch (t) {
    case DType::u8:
        return f.template operator()<std::uint8_t>();
    case DType::i8:
        return f.template operator()<std::int8_t>();
    case DType::u16:
        return f.template operator()<std::uint16_t>();
    case DType::i16:
        return f.template operator()<std::int16_t>();
    case DType::i32:
        return f.template operator()<std::int32_t>();
    case DType::i64:
        return f.template operator()<std::int64_t>();
    case DType::f16:
        return f.template operator()<F16>();
    case DType::bf16:
        return f.template operator()<BF16>();
    case DType::f32:
        return f.template operator()<float>();
    case DType::f64:
        return f.template operator()<double>();
    }
}

} // namespace

void ConversionStats::merge(const ConversionStats& o) {
    elements += o.elements;
    inexact += o.inexact;
    clipped += o.clipped;
    overflow_inf += o.overflow_inf;
    nan += o.nan;
    max_abs_error = std::max(max_abs_error, o.max_abs_error);
    max_rel_error = std::max(max_rel_error, o.max_rel_error);
    bytes_in += o.bytes_in;
    bytes_out += o.bytes_out;
}

nlohmann::json ConversionStats::to_json() const {
    return {{"elements", elements},
            {"lossy", lossy()},
            {"inexact", inexact},
            {"clipped", clipped},
            {"overflow_to_inf", overflow_inf},
            {"nan", nan},
            {"max_abs_error", max_abs_error},
            {"max_rel_error", max_rel_error},
            {"bytes_in", bytes_in},
            {"bytes_out", bytes_out}};
}

void convert_elements(DType from, DType to, const void* src, void* dst, std::uint64_t n, const ValueMapping& map,
                      ConversionStats& stats) {
    if (from == to && map.identity()) {
        std::memcpy(dst, src, n * dtype_size(from));
        stats.elements += n;
        stats.bytes_in += n * dtype_size(from);
        stats.bytes_out += n * dtype_size(to);
        return;
    }
    if (from == DType::f32 && (to == DType::bf16 || to == DType::f16) && map.identity())
        return f32_to_half(src, dst, n, to == DType::f16, stats);
    if (from == DType::u8) return with_type(to, [&]<class Out>() { from_u8<Out>(src, dst, n, map, stats); });
    if ((from == DType::f16 || from == DType::bf16) && to == DType::f32 && map.identity())
        return half_to_f32(from, src, dst, n, stats);
    with_type(from, [&]<class In>() { with_type(to, [&]<class Out>() { loop<In, Out>(src, dst, n, map, stats); }); });
}

void finite_range(DType t, const void* src, std::uint64_t n, double& lo, double& hi) {
    with_type(t, [&]<class T>() {
        const auto* p = static_cast<const T*>(src);
        for (std::uint64_t i = 0; i < n; ++i) {
            T x;
            std::memcpy(&x, p + i, sizeof x);
            const double d = load(x);
            if (!std::isfinite(d)) continue;
            if (d < lo) lo = d;
            if (d > hi) hi = d;
        }
    });
}

ValueMapping range_mapping(double lo, double hi, DType to) {
    double tlo = 0, thi = 1;
    if (!is_float(to))
        with_type(to, [&]<class T>() {
            if constexpr (!is_float_v<T>) {
                tlo = static_cast<double>(std::numeric_limits<T>::min());
                thi = static_cast<double>(std::numeric_limits<T>::max());
            }
        });
    ValueMapping m;
    if (!(hi > lo)) {
        m.scale = 1.0;
        m.offset = tlo - lo;
        return m;
    }
    m.scale = (thi - tlo) / (hi - lo);
    m.offset = tlo - lo * m.scale;
    return m;
}

} // namespace dstk
