#pragma once
// dsconvert: dtype, compression, layout and format conversion, out of core.
// Every stage streams blocks of samples, so memory stays bounded whatever the
// dataset size.
#include <cstdint>
#include <filesystem>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "dstk/dtype.hpp"
#include "dstk/convert/importers.hpp"
#include "dstk/output.hpp"

namespace dstk {

// ---- element conversion ----------------------------------------------------

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

// ---- the tool ---------------------------------------------------------------

enum class OutputFormat { dataset, npy, raw };

struct SplitFraction {
    std::string name;
    double fraction = 0.0;
};
// "train=0.9,test=0.1": fractions must be positive and sum to 1 (within 1e-6).
std::vector<SplitFraction> parse_split_fractions(const std::string& text);

struct ConvertOptions {
    std::filesystem::path input, output;
    bool verify_only = false; // dsconvert --verify DIR
    bool benchmark = false;   // dsconvert --benchmark [FILE]

    InputFormat from = InputFormat::automatic;
    RawInputOptions raw; // --shape, --in-dtype, --layout, --label-dtype

    std::optional<OutputFormat> to; // default: dataset, or npy/raw by the output's extension
    std::optional<DType> dtype;     // of the input field (x); labels are copied as they are
    std::optional<double> scale, offset;
    std::string range;                        // "", "auto" or "LO:HI"
    std::string compress = "none";            // "none" | "zstd" | "zstd:LEVEL"
    std::uint64_t chunk_samples = 0;          // 0: from chunk_bytes
    std::uint64_t chunk_bytes = 0;            // 0: 4 MiB
    Layout out_layout = Layout::sample_major; // raw output
    std::optional<std::uint64_t> shuffle_seed;
    std::string split;  // "train=0.9,test=0.1"
    std::string select; // SPLIT/FIELD for npy/raw outputs
    std::filesystem::path report_json;
    bool resume = false; // keep .OUTPUT.partial/ when interrupted; continue from it
    bool force = false;
    unsigned threads = 0; // 0: all cores
    std::string command_line;
    OutputOptions out;
};

// Runs the whole conversion (or the verification); prints the report on
// stderr (or one JSON document on stdout with --json). Throws Error.
void run_convert(const ConvertOptions& o);

// dsconvert --benchmark [FILE]: prints the in-memory speed (per wall and per
// CPU second) of the f32 -> bf16, f32 -> f16, u8 -> f32 and u8 -> bf16
// kernels on 1 and all threads and, with FILE (its first 256
// MiB), of zstd-chunked compression and decompression at levels 1 and 3 (or
// the --compress level) through ChunkedWriter/ChunkedReader.
void run_convert_benchmark(const ConvertOptions& o);

} // namespace dstk
