#pragma once
// The widening of a stored value (dtype.hpp's element types) to a number:
// the one routine every reader of stored values calls, on the host and in
// CUDA kernels alike (this header compiles in CUDA code): the data path's
// conversion (data/convert.hpp) on the host and in its kernels, statistics
// scans (channel_stats.hpp, data::field_norm), dtype.cpp's bf16_to_float and
// f16_to_float, dsgen and dsbench. widen is exact but for i64 beyond 2^53;
// widen_int is exact for integers (class labels).
#include <cstdint>
#if !defined(__CUDA_ARCH__)
#include <bit>
#endif

#include "dstk/dtype.hpp"

#if defined(__CUDACC__)
#define DSTK_HOST_DEVICE __host__ __device__
#else
#define DSTK_HOST_DEVICE
#endif

namespace dstk {

DSTK_HOST_DEVICE inline float float_from_bits(std::uint32_t u) {
#if defined(__CUDA_ARCH__)
    return __uint_as_float(u);
#else
    return std::bit_cast<float>(u);
#endif
}

// Exact: every bf16 and f16 value is a float.
DSTK_HOST_DEVICE inline float bf16_bits_to_float(std::uint16_t h) {
    return float_from_bits(static_cast<std::uint32_t>(h) << 16);
}

DSTK_HOST_DEVICE inline float f16_bits_to_float(std::uint16_t h) {
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

// Element i of an array of stored dtype T, widened: the one routine that
// reads a stored value (exact but for i64 beyond 2^53; call sites that want a
// float cast it, which the compiler folds into one conversion).
template <DType T> DSTK_HOST_DEVICE inline double widen_as(const void* data, std::uint64_t i) {
    if constexpr (T == DType::u8)
        return static_cast<const std::uint8_t*>(data)[i];
    else if constexpr (T == DType::i8)
        return static_cast<const std::int8_t*>(data)[i];
    else if constexpr (T == DType::u16)
        return static_cast<const std::uint16_t*>(data)[i];
    else if constexpr (T == DType::i16)
        return static_cast<const std::int16_t*>(data)[i];
    else if constexpr (T == DType::i32)
        return static_cast<const std::int32_t*>(data)[i];
    else if constexpr (T == DType::i64)
        return static_cast<double>(static_cast<const std::int64_t*>(data)[i]);
    else if constexpr (T == DType::f16)
        return f16_bits_to_float(static_cast<const std::uint16_t*>(data)[i]);
    else if constexpr (T == DType::bf16)
        return bf16_bits_to_float(static_cast<const std::uint16_t*>(data)[i]);
    else if constexpr (T == DType::f32)
        return static_cast<const float*>(data)[i];
    else
        return static_cast<const double*>(data)[i];
}

DSTK_HOST_DEVICE inline double widen(const void* data, DType t, std::uint64_t i) {
    switch (t) {
    case DType::u8:
        return widen_as<DType::u8>(data, i);
    case DType::i8:
        return widen_as<DType::i8>(data, i);
    case DType::u16:
        return widen_as<DType::u16>(data, i);
    case DType::i16:
        return widen_as<DType::i16>(data, i);
    case DType::i32:
        return widen_as<DType::i32>(data, i);
    case DType::i64:
        return widen_as<DType::i64>(data, i);
    case DType::f16:
        return widen_as<DType::f16>(data, i);
    case DType::bf16:
        return widen_as<DType::bf16>(data, i);
    case DType::f32:
        return widen_as<DType::f32>(data, i);
    case DType::f64:
        return widen_as<DType::f64>(data, i);
    }
    return 0.0;
}

DSTK_HOST_DEVICE inline float widen_float(const void* data, DType t, std::uint64_t i) {
    return static_cast<float>(widen(data, t, i));
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
        return static_cast<std::int64_t>(widen(data, t, i));
    }
}

} // namespace dstk
