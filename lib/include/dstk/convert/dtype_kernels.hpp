#pragma once
// dsconvert's element conversion: one mapping (scale, offset) applied in
// double precision and rounded once to the output type, with a record of what
// the conversion lost.
#include <cstdint>

#include <nlohmann/json.hpp>

#include "dstk/dtype.hpp"

namespace dstk {

// out = in * scale + offset (in double precision), then rounded to the output
// type: float outputs round to nearest even and keep NaN; integer outputs
// round to nearest even and clip to the type's range.
struct ValueMapping {
    double scale = 1.0, offset = 0.0;
    bool identity() const { return scale == 1.0 && offset == 0.0; }
};

// What a conversion lost. Errors are measured against the exact mapped value.
struct ConversionStats {
    std::uint64_t elements = 0;
    std::uint64_t inexact = 0;      // outputs that differ from the exact mapped value
    std::uint64_t clipped = 0;      // integer outputs clipped to the type's range
    std::uint64_t overflow_inf = 0; // finite inputs that became +-Inf
    std::uint64_t nan = 0;          // NaN inputs (kept as NaN; 0 for integer outputs)
    double max_abs_error = 0.0, max_rel_error = 0.0;
    std::uint64_t bytes_in = 0, bytes_out = 0;

    void merge(const ConversionStats& o);
    bool lossy() const { return inexact > 0 || clipped > 0 || overflow_inf > 0 || nan > 0; }
    nlohmann::json to_json() const;
};

// Converts n elements. `stats` is updated (not reset).
void convert_elements(DType from, DType to, const void* src, void* dst, std::uint64_t n, const ValueMapping& map,
                      ConversionStats& stats);

// Smallest and largest finite value of n elements (NaN and Inf ignored);
// lo > hi when there is none.
void finite_range(DType t, const void* src, std::uint64_t n, double& lo, double& hi);

// The mapping that sends [lo, hi] onto the whole range of an integer type
// (u8: 0..255), or onto [0, 1] for a float type.
ValueMapping range_mapping(double lo, double hi, DType to);

} // namespace dstk
