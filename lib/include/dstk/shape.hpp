#pragma once
// Per-sample shapes ("3x32x32"; a scalar such as a label has no dimensions).
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "dstk/dtype.hpp"

namespace dstk {

struct Shape {
    std::vector<std::uint64_t> dims;

    std::uint64_t numel() const; // checked: throws on overflow; 1 for a scalar
    std::string str() const;     // "3x32x32", or "scalar"
    bool operator==(const Shape&) const = default;
};

// "3x32x32", "784", "scalar". Every dimension must be >= 1.
Shape parse_shape(std::string_view text, std::string_view what = "shape");

// numel * dtype_size, checked.
std::uint64_t sample_bytes(const Shape& shape, DType dtype);

} // namespace dstk
