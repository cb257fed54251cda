#pragma once
// The input formats of dsconvert, read as streams of samples: a dataset
// directory, .npy (a file, or a directory of .npy files of one length per
// split: one field per file), .npz (stored or deflated: one field per array),
// raw binary (sample- or
// feature-major), v28b (images_*.bin + labels_*.bin, feature-major), MNIST IDX
// (plain or gzip, a file or a directory of images/labels pairs) and CIFAR-10
// binary batches. Every header parser checks counts against the bytes present
// before trusting them, and errors name the file.
#include <cstdint>
#include <filesystem>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "dstk/dtype.hpp"
#include "dstk/layout.hpp"
#include "dstk/manifest.hpp"
#include "dstk/shape.hpp"

namespace dstk {

class ThreadPool;

enum class InputFormat { automatic, dataset, npy, npz, raw, v28b, idx, cifar10 };
std::string_view input_format_name(InputFormat f);
InputFormat parse_input_format(std::string_view name); // usage error listing the names

// Sequential reader of one field: samples in order, whole samples only.
class FieldStream {
  public:
    virtual ~FieldStream() = default;
    // The next `count` samples into dst; throws naming the file when it ends early.
    virtual void read(std::uint64_t count, void* dst) = 0;
    // Skips `count` samples (read and discarded where the format cannot seek).
    virtual void skip(std::uint64_t count);
    virtual std::uint64_t sample_bytes() const = 0;
    // At most `max` samples into dst; returns how many, 0 at the end. Only a
    // stream of unknown length (raw stdin) returns fewer than asked; it
    // throws when the data ends inside a sample.
    virtual std::uint64_t read_up_to(std::uint64_t max, void* dst) {
        read(max, dst);
        return max;
    }
    // Throws when data follows the samples read (checked where the count
    // comes from elsewhere, e.g. stdin images with a --labels file).
    virtual void expect_end() {}
};

struct SourceField {
    std::string name;
    DType dtype = DType::u8;
    Shape shape;
    std::unique_ptr<FieldStream> stream;
};

struct SourceSplit {
    std::string name;
    std::uint64_t samples = 0;
    bool count_known = true; // false: raw stdin without labels; read until the stream ends
    std::vector<SourceField> fields;
};

struct Source {
    InputFormat format = InputFormat::automatic;
    std::string description; // "MNIST IDX", "dataset directory", ...
    std::vector<SourceSplit> splits;
    std::optional<std::uint32_t> num_classes;
    std::optional<Manifest> manifest; // the input's, for a dataset directory
    // The fields with the input and label roles; empty where none has it
    // (arrays named neither by --input/--label nor by the usual names).
    std::string input_field = "x", label_field = "y";
    bool roles_applied = false;       // --input/--label resolved by the opener (by array names)
    bool rereadable = true;           // false for stdin
    std::vector<std::string> notices; // what was guessed (e.g. HWC images), for the user
};

enum class InLayout { automatic, nhwc, nchw };
InLayout parse_in_layout(std::string_view text); // --in-layout: auto | nhwc | nchw

// How to read inputs that do not describe themselves (raw, v28b), and how to
// name and lay out the arrays of those that do.
struct RawInputOptions {
    std::optional<Shape> shape;
    std::optional<DType> dtype;
    Layout layout = Layout::sample_major;
    DType label_dtype = DType::i32; // v28b labels
    // --labels: an IDX label file (plain or gzip) that gives field y to raw or
    // IDX-file images (stdin included); its count must match the images'.
    std::filesystem::path labels;
    // --input, --label: the fields (or .npz arrays, or .npy files of a
    // directory) that take the input and the label roles, by member name
    // ("x_train", "positions") or by the field name after the split affix is
    // taken off ("positions" for positions_train and positions_test); empty:
    // the input's own roles (a dataset's manifest; x and y of the formats
    // that have them; arrays with the usual names).
    std::string input, label;
    // The input field's images stored height x width x channels (nhwc) are
    // transposed to CHW; automatic: where the last axis is 1, 3 or 4 and the
    // others are not.
    InLayout in_layout = InLayout::automatic;
};

// Detects the format when `format` is automatic, then opens every split and
// field and sets the roles. `path` "-" is stdin (raw and IDX only); raw stdin
// without labels has no known count (count_known false).
Source open_source(const std::filesystem::path& path, InputFormat format, const RawInputOptions& raw, ThreadPool& pool);

// Header parsers, exposed for the fuzzers and unit tests; each throws
// Error(failure) naming `source` on malformed input.
struct IdxHeader {
    DType dtype = DType::u8;
    std::vector<std::uint64_t> dims; // dims[0] = sample count
    std::uint64_t data_offset = 0;
};
IdxHeader parse_idx_header(std::span<const std::uint8_t> bytes, const std::string& source);

struct ZipMember {
    std::string name;
    std::uint16_t method = 0; // 0 stored, 8 deflated
    std::uint16_t flags = 0;  // general purpose bits: bit 0 set for an encrypted member
    std::uint64_t compressed_bytes = 0, uncompressed_bytes = 0;
    std::uint64_t data_offset = 0; // of the member's data in the archive
    std::uint32_t crc32 = 0;
};
// Parses a zip central directory from `tail` (the last bytes of an archive of
// `file_bytes` bytes, as much as holds the end records and the directory).
// Returns the members, with data offsets still pointing at local headers
// (resolve_zip_member reads them).
std::vector<ZipMember> parse_zip_directory(std::span<const std::uint8_t> tail, std::uint64_t file_bytes,
                                           const std::string& source);
// The data offset from a member's local file header (30+ bytes at its offset).
std::uint64_t zip_data_offset(std::span<const std::uint8_t> local_header, const ZipMember& m, std::uint64_t file_bytes,
                              const std::string& source);

// CIFAR-10: a file of 10000 records of 1 label byte + 3072 pixel bytes.
inline constexpr std::uint64_t cifar_record_bytes = 1 + 3 * 32 * 32;
std::uint64_t cifar_record_count(std::uint64_t file_bytes, const std::string& source);

// Byte-swaps `count` elements of `elem_bytes` bytes in place.
void byteswap_elements(void* data, std::uint64_t count, std::size_t elem_bytes);

} // namespace dstk
