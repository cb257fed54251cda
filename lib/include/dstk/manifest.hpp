#pragma once
// dataset.json: what a dataset directory holds (man/dstk-format.5).
#include <cstdint>
#include <filesystem>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "dstk/dtype.hpp"
#include "dstk/shape.hpp"

namespace dstk {

inline constexpr int manifest_format_version = 1;
inline constexpr const char* manifest_file_name = "dataset.json";

enum class Storage { npy, zstd_chunked };
std::string_view storage_name(Storage s); // "npy", "zstd-chunked"

// One file of a field stored in parts (dsconvert --merge of --shard outputs):
// the part holds `samples` consecutive samples, in the field's storage, dtype
// and shape, after the samples of the parts before it.
struct FieldPart {
    std::string file; // relative to the dataset directory
    std::uint64_t samples = 0;
    std::uint64_t bytes = 0; // file size
    std::string checksum;    // "xxh64:<hex>" of the whole part file
};

// Per-channel statistics of a field's values, in stored-value units (u8:
// 0..255), over the train split. The channels of a per-sample shape are
// those dstrain's models read (stats_channels).
struct ChannelStats {
    std::vector<double> mean, std; // per channel
};
// Statistics that can normalise: finite means, positive finite stds. A
// manifest holding others is refused; serialize_manifest leaves them out
// (a constant channel: dstrain then computes them from the data).
bool usable_stats(const ChannelStats& s);

// The channels of a field of per-sample shape `s`, for its statistics: one
// for a scalar, one per element of a vector (D features), one for a 2-d
// sample (an HxW image), the first dimension for 3 or more (CxHxW).
std::uint64_t stats_channels(const Shape& s);

struct FieldInfo {
    std::string name; // "x", "y", "positions"
    DType dtype = DType::u8;
    Shape shape; // per sample
    Storage storage = Storage::npy;
    std::string file;                // relative to the dataset directory
    std::uint64_t bytes = 0;         // file size
    std::string checksum;            // "xxh64:<hex>" of the whole file
    std::uint64_t chunk_samples = 0; // zstd-chunked: samples per chunk
    // Empty for a field in one file (`file`, `bytes`, `checksum` describe it);
    // otherwise the field's files in sample order, and `file` is empty.
    std::vector<FieldPart> parts;
    // Its statistics (stats_channels(shape) channels), where the tool that
    // wrote it computed them: for the fields that can be an input.
    std::optional<ChannelStats> stats;

    std::uint64_t sample_bytes() const { return dstk::sample_bytes(shape, dtype); }
};

struct SplitInfo {
    std::string name; // "train", "test"
    std::uint64_t samples = 0;
    std::vector<FieldInfo> fields;

    const FieldInfo* find(std::string_view field) const;
    const FieldInfo& field(std::string_view field) const; // runtime error naming the split if absent
};

struct Provenance {
    std::string tool, version, command_line, created; // created: ISO 8601 UTC
    std::optional<std::uint64_t> seed;
    std::map<std::string, std::string> params; // tool-specific settings (kind, noise, ...)
};

// A dataset written with --shard I/N (dsgen, dsconvert): part `index` (0-based)
// of `count` of the dataset that the same command without --shard writes.
// Each split holds the whole split's samples [first, first + samples), a range
// cut at multiples of `chunk_samples` (shard_range in shard.hpp); dsconvert
// --merge checks that its parts are complete, disjoint, in order and share
// `settings`.
struct ShardSplit {
    std::string name;
    std::uint64_t first = 0, total = 0; // total: the whole split's samples
    // dsgen's train split: per chunk of the range, in order, the sum of each
    // channel's values then the sum of their squares, so that a merge adds
    // them in the order of a single run (identical stats).
    std::vector<std::vector<double>> chunk_sums;
    // dsconvert's split of statistics (train, else the first): the same rows,
    // per field that has statistics.
    std::map<std::string, std::vector<std::vector<double>>> field_chunk_sums;
};

struct ShardInfo {
    std::uint64_t index = 0, count = 1, chunk_samples = 1;
    std::string settings;           // "xxh64:<hex>" of the settings that decide the bytes
    std::vector<ShardSplit> splits; // in the manifest's split order
};

struct Manifest {
    int format_version = manifest_format_version;
    std::vector<SplitInfo> splits;
    std::optional<std::uint32_t> num_classes;
    std::optional<ChannelStats> stats; // the input field's, for readers of per-field-less manifests
    // The roles of fields, by name; empty: no field has the role (a dataset
    // imported without naming its input or label).
    std::string input_field = "x", label_field = "y";
    Provenance provenance;
    std::optional<ShardInfo> shard; // set in a --shard output only

    const SplitInfo* find(std::string_view split) const;
    const SplitInfo& split(std::string_view split) const; // runtime error listing the splits if absent
    // The statistics of `field`: its own (in the train split, else the first
    // split), else the top-level ones when it is the input field; null when
    // there are none. Every reader of statistics asks here.
    const ChannelStats* stats_of(std::string_view field) const;
};

// Split and field names become file names (SPLIT_FIELD.npy inside the
// dataset directory), so a usable one is 1 to max_name_bytes bytes, holds no
// '/', NUL or other control character, and is not "." or "..". The cap keeps
// SPLIT_FIELD.zst and its temporaries under the 255-byte limit of common
// filesystems.
inline constexpr std::size_t max_name_bytes = 100;
// Empty when `name` is usable, else why not, naming it (control characters
// escaped): "split name '../x' holds a '/' (...)". `what`: "split", "field".
std::string name_problem(std::string_view what, std::string_view name);
// The file of a field of a split: SPLIT_FIELD then `ext` (".npy", ".zst"),
// after name_problem on both names (a runtime error: the names were checked
// where they entered, so a bad one here is a bug).
std::string field_file_name(std::string_view split, std::string_view field, std::string_view ext);

// Throws Error(failure) naming `source` and the JSON path of the problem.
Manifest parse_manifest(std::string_view json_text, const std::string& source);
std::string serialize_manifest(const Manifest& m); // pretty JSON, trailing newline
Manifest load_manifest(const std::filesystem::path& dataset_dir);

// "u8[3x32x32]", "i32" (a scalar): a field's type, for messages and reports.
std::string field_type_text(DType t, const Shape& s);

// sample_bytes * samples, checked.
std::uint64_t checked_sample_total(const FieldInfo& f, std::uint64_t samples);

std::string now_iso8601();

} // namespace dstk
