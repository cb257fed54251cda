#pragma once
// The data path's last step: each field of a batch converted by its kind on
// the way to the model, in one place. The same table of fields is converted
// on the host (convert_fields_host: the cpu backend) and on the GPU
// (convert_fields_async: one launch for every field of a batch), widening
// every stored value with the core's one routine (dtype.hpp).
//
//   stored      the stored bytes as they are
//   normalised  (x - mean[c]) * inv_std[c] as float (or bf16), channel c of
//               `hw` consecutive values; written at dst[s * stride + offset + e]
//               for element e of sample s (a side input's columns in a wider
//               row; stride = per_sample, offset 0 for a plain field)
//   values      float (regression targets, other integers)
//   classes32   int32; a value outside int32 (or negative) becomes -1, which
//               a loss counts as a bad label
//   classes64   int64 (PyTorch's losses take int64)
#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "dstk/dataset.hpp"
#include "dstk/dtype.hpp"

namespace dstk::data {

enum class FieldKind : std::uint8_t { stored, normalised, values, classes32, classes64 };
std::string_view field_kind_name(FieldKind k); // "stored", "normalised", ...
// The dtype a field of stored dtype `t` is delivered in.
DType converted_dtype(FieldKind k, DType stored);

struct FieldConversion {
    const void* src = nullptr;
    const std::uint64_t* rows = nullptr; // GPU only: sample i is row rows[i] of src (BatchField::rows); null: row i
    DType dtype = DType::u8;             // stored
    std::uint64_t per_sample = 0;        // values per sample
    void* dst = nullptr;
    FieldKind kind = FieldKind::stored;
    // normalised: per-channel statistics (in the memory the conversion runs
    // in), values per channel, and where each sample's values go.
    const float* mean = nullptr;
    const float* inv_std = nullptr;
    std::uint64_t hw = 1;
    std::uint64_t stride = 0, offset = 0; // stride 0: per_sample
    bool bf16 = false;                    // normalised: bf16 output (the trainer's bf16 activations)
};

// Converts `n` samples of every field on the host.
void convert_fields_host(std::span<const FieldConversion> fields, std::uint32_t n);
// The same on the GPU, on `stream` (a cudaStream_t): one launch for up to
// max_conversions fields (more take one launch per max_conversions). A
// no_fit_error in a build without CUDA.
inline constexpr std::size_t max_conversions = 17;
void convert_fields_async(std::span<const FieldConversion> fields, std::uint32_t n, void* stream);

// A field's per-channel statistics, in stored units: what normalisation divides by.
struct ChannelNorm {
    std::vector<float> mean, std;
    std::uint64_t per_channel = 1; // values per channel
    std::string source;            // "the manifest", "a scan of 4,096 samples of split 'train'", "given"
};
// The one rule for statistics, per channel (stats_channels, manifest.hpp):
// the manifest's for this field (Manifest::stats_of), else a scan of up to
// 4,096 samples spread evenly over split `scan_split` (the training split). A
// non-finite value is a runtime error naming its sample, as are non-finite
// statistics in the manifest. Float fields are scanned for non-finite values
// even where the manifest has statistics: values written after it (or by
// another tool) may be non-finite while the statistics are not.
ChannelNorm field_norm(const Dataset& ds, const std::string& field, std::string_view scan_split = "train");

} // namespace dstk::data
