#pragma once
// Element types of dataset fields and their scalar conversions.
#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

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
float bf16_to_float(std::uint16_t h);
std::uint16_t float_to_f16(float f);
float f16_to_float(std::uint16_t h);

} // namespace dstk
