#pragma once
// Element types of dataset fields and their scalar conversions. The widening
// of a stored value (bf16_to_float, f16_to_float, widen_float, widen_int) is
// the one routine every reader of stored values calls: the data path's
// conversion on the host and in its kernels (this header compiles in CUDA
// code too), the trainer's CPU backend, statistics scans, dsgen, dsbench.
#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#if !defined(__CUDA_ARCH__)
#include <bit>
#endif

#if defined(__CUDACC__)
#define DSTK_HOST_DEVICE __host__ __device__
#else
#define DSTK_HOST_DEVICE
#endif

namespace dstk {

enum class DType : std::uint8_t { u8, i8, u16, i16, i32, i64, f16, bf16, f32, f64 };

inline constexpr DType all_dtypes[] = {DType::u8,  DType::i8,  DType::u16,  DType::i16, DType::i32,
                                       DType::i64, DType::f16, DType::bf16, DType::f32, DType::f64};

std::size_t dtype_size(DType t);
std::string_view dtype_name(DType t); // "u8", "bf16", ...
std::optional<DType> dtype_from_name(std::string_view name);
DType parse_dtype(std::string_view name, std::string_view what = "dtype"); // usage error if unknown
bool is_float(DType t);
bool is_signed(DType t);

// NumPy's descr for the dtype in little-endian order ("|u1", "<f4"). NumPy has
// no bfloat16: bf16 is stored as "<u2" and the manifest says bf16.
std::string npy_descr(DType t);

// Float conversions: round to nearest even; NaN stays NaN (quiet), Inf stays Inf.
std::uint16_t float_to_bf16(float f);
std::uint16_t float_to_f16(float f);

DSTK_HOST_DEVICE inline float float_from_bits(std::uint32_t u) {
#if defined(__CUDA_ARCH__)
    return __uint_as_float(u);
#else
    return std::bit_cast<float>(u);
#endif
}

// Exact: every bf16 and f16 value is a float.
DSTK_HOST_DEVICE inline float bf16_to_float(std::uint16_t h) {
    return float_from_bits(static_cast<std::uint32_t>(h) << 16);
}

DSTK_HOST_DEVICE inline float f16_to_float(std::uint16_t h) {
    const std::uint32_t sign = static_cast<std::uint32_t>(h & 0x8000u) << 16;
    const std::uint32_t exp = (h >> 10) & 0x1Fu;
    const std::uint32_t mant = h & 0x3FFu;
    if (exp == 0) {
        if (mant == 0) return float_from_bits(sign);
        const float v = static_cast<float>(mant) * 0x1.0p-24f; // subnormal: mant * 2^-24
        return sign ? -v : v;
    }
    if (exp == 31) return float_from_bits(sign | 0x7F800000u | (mant << 13));
    return float_from_bits(sign | ((exp + 112u) << 23) | (mant << 13));
}

// Element i of an array of stored dtype T as float (integers beyond 2^24
// rounded: use widen_int for class labels).
template <DType T> DSTK_HOST_DEVICE inline float widen_float_as(const void* data, std::uint64_t i) {
    if constexpr (T == DType::u8)
        return static_cast<const std::uint8_t*>(data)[i];
    else if constexpr (T == DType::i8)
        return static_cast<const std::int8_t*>(data)[i];
    else if constexpr (T == DType::u16)
        return static_cast<const std::uint16_t*>(data)[i];
    else if constexpr (T == DType::i16)
        return static_cast<const std::int16_t*>(data)[i];
    else if constexpr (T == DType::i32)
        return static_cast<float>(static_cast<const std::int32_t*>(data)[i]);
    else if constexpr (T == DType::i64)
        return static_cast<float>(static_cast<const std::int64_t*>(data)[i]);
    else if constexpr (T == DType::f16)
        return f16_to_float(static_cast<const std::uint16_t*>(data)[i]);
    else if constexpr (T == DType::bf16)
        return bf16_to_float(static_cast<const std::uint16_t*>(data)[i]);
    else if constexpr (T == DType::f32)
        return static_cast<const float*>(data)[i];
    else
        return static_cast<float>(static_cast<const double*>(data)[i]);
}

DSTK_HOST_DEVICE inline float widen_float(const void* data, DType t, std::uint64_t i) {
    switch (t) {
    case DType::u8:
        return widen_float_as<DType::u8>(data, i);
    case DType::i8:
        return widen_float_as<DType::i8>(data, i);
    case DType::u16:
        return widen_float_as<DType::u16>(data, i);
    case DType::i16:
        return widen_float_as<DType::i16>(data, i);
    case DType::i32:
        return widen_float_as<DType::i32>(data, i);
    case DType::i64:
        return widen_float_as<DType::i64>(data, i);
    case DType::f16:
        return widen_float_as<DType::f16>(data, i);
    case DType::bf16:
        return widen_float_as<DType::bf16>(data, i);
    case DType::f32:
        return widen_float_as<DType::f32>(data, i);
    case DType::f64:
        return widen_float_as<DType::f64>(data, i);
    }
    return 0.0f;
}

// Element i of an integer array as int64, exactly (floats truncated toward zero).
DSTK_HOST_DEVICE inline std::int64_t widen_int(const void* data, DType t, std::uint64_t i) {
    switch (t) {
    case DType::u8:
        return static_cast<const std::uint8_t*>(data)[i];
    case DType::i8:
        return static_cast<const std::int8_t*>(data)[i];
    case DType::u16:
        return static_cast<const std::uint16_t*>(data)[i];
    case DType::i16:
        return static_cast<const std::int16_t*>(data)[i];
    case DType::i32:
        return static_cast<const std::int32_t*>(data)[i];
    case DType::i64:
        return static_cast<const std::int64_t*>(data)[i];
    case DType::f64:
        return static_cast<std::int64_t>(static_cast<const double*>(data)[i]);
    default:
        return static_cast<std::int64_t>(widen_float(data, t, i));
    }
}

} // namespace dstk
