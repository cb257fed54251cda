#include "dstk/dtype.hpp"

#include <bit>
#include <cstring>
#include <utility>

#include "dstk/error.hpp"
#include "dstk/widen.hpp"

namespace dstk {
namespace {

struct DTypeRow {
    DType type;
    const char* name;
    std::size_t size;
    const char* descr;
    bool is_float, is_signed;
};

constexpr DTypeRow rows[] = {
    {DType::u8, "u8", 1, "|u1", false, false},   {DType::i8, "i8", 1, "|i1", false, true},
    {DType::u16, "u16", 2, "<u2", false, false}, {DType::i16, "i16", 2, "<i2", false, true},
    {DType::i32, "i32", 4, "<i4", false, true},  {DType::i64, "i64", 8, "<i8", false, true},
    {DType::f16, "f16", 2, "<f2", true, true},   {DType::bf16, "bf16", 2, "<u2", true, true},
    {DType::f32, "f32", 4, "<f4", true, true},   {DType::f64, "f64", 8, "<f8", true, true},
};

// Common spellings from numpy and PyTorch, read as well as the names above.
constexpr std::pair<std::string_view, DType> aliases[] = {
    {"uint8", DType::u8},      {"int8", DType::i8},     {"uint16", DType::u16},  {"int16", DType::i16},
    {"int32", DType::i32},     {"int64", DType::i64},   {"float16", DType::f16}, {"half", DType::f16},
    {"bfloat16", DType::bf16}, {"float32", DType::f32}, {"float", DType::f32},   {"float64", DType::f64},
    {"double", DType::f64}};

const DTypeRow& row(DType t) {
    return rows[static_cast<int>(t)];
}

} // namespace

std::size_t dtype_size(DType t) {
    return row(t).size;
}
std::string_view dtype_name(DType t) {
    return row(t).name;
}
bool is_float(DType t) {
    return row(t).is_float;
}
bool is_signed(DType t) {
    return row(t).is_signed;
}
std::string npy_descr(DType t) {
    return row(t).descr;
}

std::optional<DType> dtype_from_name(std::string_view name) {
    for (const auto& r : rows)
        if (name == r.name) return r.type;
    for (const auto& [alias, type] : aliases)
        if (name == alias) return type;
    return std::nullopt;
}

DType parse_dtype(std::string_view name, std::string_view what) {
    if (auto t = dtype_from_name(name)) return *t;
    throw usage_error("unknown " + std::string(what) + " '" + std::string(name) +
                      "' (expected one of u8 i8 u16 i16 i32 i64 f16 bf16 f32 f64)");
}

std::uint16_t float_to_bf16(float f) {
    const std::uint32_t u = std::bit_cast<std::uint32_t>(f);
    if ((u & 0x7F800000u) == 0x7F800000u && (u & 0x007FFFFFu) != 0)
        return static_cast<std::uint16_t>((u >> 16) | 0x0040u); // quiet NaN, sign kept
    const std::uint32_t rounding = 0x7FFFu + ((u >> 16) & 1u);
    return static_cast<std::uint16_t>((u + rounding) >> 16);
}

float bf16_to_float(std::uint16_t h) {
    return bf16_bits_to_float(h);
}

std::uint16_t float_to_f16(float f) {
    const std::uint32_t u = std::bit_cast<std::uint32_t>(f);
    const std::uint16_t sign = static_cast<std::uint16_t>((u >> 16) & 0x8000u);
    const std::uint32_t abs = u & 0x7FFFFFFFu;
    if (abs >= 0x7F800000u) // Inf or NaN
        return static_cast<std::uint16_t>(sign | 0x7C00u | (abs > 0x7F800000u ? 0x0200u : 0u));
    if (abs >= 0x477FF000u) return static_cast<std::uint16_t>(sign | 0x7C00u); // rounds to >= 65520: Inf
    if (abs < 0x38800000u) {                // below the smallest normal half (2^-14): subnormal or zero
        if (abs < 0x33000000u) return sign; // < 2^-25 rounds to zero
        const int exp = static_cast<int>(abs >> 23);
        const std::uint32_t mant = (abs & 0x007FFFFFu) | 0x00800000u;
        const int shift = 126 - exp; // 14..24: mant * 2^(exp-150) / 2^-24
        const std::uint32_t q = mant >> shift;
        const std::uint32_t rem = mant & ((1u << shift) - 1u);
        const std::uint32_t half = 1u << (shift - 1);
        const std::uint32_t r = q + ((rem > half || (rem == half && (q & 1u))) ? 1u : 0u);
        return static_cast<std::uint16_t>(sign | r);
    }
    // Normal: rebias exponent 127 -> 15, round mantissa 23 -> 10 bits to nearest even.
    const std::uint32_t rebased = abs - 0x38000000u;
    const std::uint32_t r = rebased + 0x0FFFu + ((rebased >> 13) & 1u);
    return static_cast<std::uint16_t>(sign | (r >> 13));
}

float f16_to_float(std::uint16_t h) {
    return f16_bits_to_float(h);
}

} // namespace dstk
