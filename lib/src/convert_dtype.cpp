// Element conversions between dataset dtypes, with the error accounting that
// dsconvert reports. One template loop per (input, output) pair, so the inner
// loop has no per-element dispatch.
#include <cmath>
#include <cstring>
#include <limits>

#include "dstk/convert.hpp"
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
    stats.elements += n;
    stats.inexact += s.inexact;
    stats.clipped += s.clipped;
    stats.overflow_inf += s.overflow;
    stats.nan += s.nan;
    stats.max_abs_error = std::max(stats.max_abs_error, s.max_abs);
    stats.max_rel_error = std::max(stats.max_rel_error, s.max_rel);
    stats.bytes_in += n * sizeof(In);
    stats.bytes_out += n * sizeof(Out);
}

// f32 -> bf16 without a mapping: float arithmetic only (the ≥ 1 GB/s path).
void f32_to_bf16(const void* src, void* dst, std::uint64_t n, ConversionStats& stats) {
    const auto* in = static_cast<const float*>(src);
    auto* out = static_cast<std::uint16_t*>(dst);
    std::uint64_t inexact = 0, overflow = 0, nan = 0;
    float max_abs = 0, max_rel = 0;
    for (std::uint64_t i = 0; i < n; ++i) {
        const float f = in[i];
        const std::uint16_t h = bf16_rne(f);
        out[i] = h;
        const float back = bf16_value(h);
        const float e = std::fabs(back - f);
        if (f != f) {
            ++nan;
        } else if (std::isinf(back) && !std::isinf(f)) {
            ++overflow;
        } else if (e != 0) {
            ++inexact;
            max_abs = std::max(max_abs, e);
            max_rel = std::max(max_rel, e / std::fabs(f));
        }
    }
    stats.elements += n;
    stats.inexact += inexact;
    stats.overflow_inf += overflow;
    stats.nan += nan;
    stats.max_abs_error = std::max<double>(stats.max_abs_error, max_abs);
    stats.max_rel_error = std::max<double>(stats.max_rel_error, max_rel);
    stats.bytes_in += 4 * n;
    stats.bytes_out += 2 * n;
}

// u8 -> f32: exact without a mapping; with one, computed in double and
// rounded once, so the error accounting is that of `loop`.
void u8_to_f32(const void* src, void* dst, std::uint64_t n, const ValueMapping& map, ConversionStats& stats) {
    const auto* in = static_cast<const std::uint8_t*>(src);
    auto* out = static_cast<float*>(dst);
    float table[256];
    Local s;
    for (int v = 0; v < 256; ++v) table[v] = static_cast<float>(v * map.scale + map.offset);
    std::uint64_t hist_inexact[256] = {};
    for (std::uint64_t i = 0; i < n; ++i) {
        out[i] = table[in[i]];
        ++hist_inexact[in[i]];
    }
    for (int v = 0; v < 256; ++v) {
        if (!hist_inexact[v]) continue;
        Local one;
        one.error(v * map.scale + map.offset, table[v]);
        if (one.inexact) s.inexact += hist_inexact[v];
        s.max_abs = std::max(s.max_abs, one.max_abs);
        s.max_rel = std::max(s.max_rel, one.max_rel);
    }
    stats.elements += n;
    stats.inexact += s.inexact;
    stats.max_abs_error = std::max(stats.max_abs_error, s.max_abs);
    stats.max_rel_error = std::max(stats.max_rel_error, s.max_rel);
    stats.bytes_in += n;
    stats.bytes_out += 4 * n;
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
    if (from == DType::f32 && to == DType::bf16 && map.identity()) return f32_to_bf16(src, dst, n, stats);
    if (from == DType::u8 && to == DType::f32) return u8_to_f32(src, dst, n, map, stats);
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
