#pragma once
// What dsconvert is asked to do: the parsed command line, as one struct.
#include <cstdint>
#include <filesystem>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "dstk/convert/importers.hpp"
#include "dstk/dtype.hpp"
#include "dstk/output.hpp"
#include "dstk/shard.hpp"

namespace dstk {

enum class OutputFormat { dataset, npy, raw };
OutputFormat parse_output_format(std::string_view text); // --to: usage error listing the names
std::string_view output_format_name(OutputFormat f);

struct SplitFraction {
    std::string name;
    double fraction = 0.0;
};
// "train=0.9,test=0.1": fractions must be positive and sum to 1 (within 1e-6).
std::vector<SplitFraction> parse_split_fractions(const std::string& text);

struct ConvertOptions;
// The --dtype values: a bare DTYPE (the input field's, at most one) or
// FIELD=DTYPE (each field once); usage errors otherwise.
void parse_dtype_options(const std::vector<std::string>& texts, ConvertOptions& o);

struct ConvertOptions {
    std::filesystem::path input, output;
    bool verify_only = false; // dsconvert --verify DIR
    bool benchmark = false;   // dsconvert --benchmark [FILE]

    InputFormat from = InputFormat::automatic;
    RawInputOptions raw; // --shape, --in-dtype, --layout, --label-dtype

    std::optional<OutputFormat> to; // default: dataset, or npy/raw by the output's extension
    std::optional<DType> dtype;     // of the input field; integer class labels are stored as i32
    // --dtype FIELD=DTYPE: the dtype of other fields (f32 targets as bf16), in the order given.
    std::vector<std::pair<std::string, DType>> field_dtypes;
    std::optional<std::uint32_t> num_classes; // --num-classes; default: the input's, else max label + 1
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
    // --shard I/N: part I of each split (whole chunks of consecutive samples).
    std::optional<ShardSpec> shard;
    // --merge PART... OUTPUT: the --shard outputs joined into the dataset
    // OUTPUT by hard links (or renames with --move), never copies.
    std::vector<std::filesystem::path> merge_parts;
    bool move = false;
    // --concat MEMBER... OUTPUT: datasets with the same fields joined, in
    // order, into the dataset OUTPUT (hard links where the filesystem
    // allows, else copies); with dataset_field, an i32 field "dataset" holds
    // each sample's member index.
    std::vector<std::filesystem::path> concat_members;
    bool dataset_field = false;
    bool resume = false; // keep .OUTPUT.partial/ when interrupted; continue from it
    bool force = false;
    unsigned threads = 0; // 0: all cores
    std::string command_line;
    OutputOptions out;
};

} // namespace dstk
