#pragma once
// dsconvert's plan: what each field becomes (dtype, mapping), the output
// splits the samples are routed to, and the conversion of one block.
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "dstk/convert/dtype_kernels.hpp"
#include "dstk/manifest.hpp"
#include "dstk/shape.hpp"
#include "sinks.hpp"

namespace dstk::convert {

// Elements per parallel conversion task.
inline constexpr std::uint64_t convert_grain = 1ull << 16;

struct FieldPlan {
    std::string name;
    DType in = DType::u8, out = DType::u8;
    Shape shape;
    ValueMapping map;
    bool convert = false;
    std::uint64_t in_bytes = 0, out_bytes = 0; // per sample
    ConversionStats stats;
    // Integer class labels: stored as i32; their range is checked and gives
    // the class count.
    bool label = false;
    double label_lo = 0, label_hi = -1; // lo > hi: none seen yet
    // Per-channel statistics of the output values, written into the field's
    // manifest entry in the train split (the fields that can be an input).
    bool channel_stats = false;
};

// The manifest entry of field `p` in output split `split`: zstd-chunked
// storage with `chunk_samples` per chunk, else (0) .npy.
FieldInfo output_field(const std::string& split, const FieldPlan& p, std::uint64_t chunk_samples);

struct OutSplit {
    std::string name;
    std::uint64_t samples = 0;
    std::vector<std::unique_ptr<FieldSink>> sinks; // empty when this split is not written
    std::uint64_t written = 0;
};

// Sends consecutive samples to the output splits in order.
class Router {
  public:
    Router(std::vector<OutSplit*> outs, const std::vector<FieldPlan>& fields)
        : outs_(std::move(outs)), fields_(fields) {}
    void route(const std::vector<const std::uint8_t*>& data, std::uint64_t count);

  private:
    std::vector<OutSplit*> outs_;
    const std::vector<FieldPlan>& fields_;
    std::size_t cur_ = 0;
};

// Converts one block of every field on the pool; the task partition depends
// only on the block, so the stats are the same whatever the thread count.
void convert_block(std::vector<FieldPlan>& fields, const std::vector<std::vector<std::uint8_t>>& in,
                   std::vector<std::vector<std::uint8_t>>& out, std::uint64_t count, ThreadPool& pool);

} // namespace dstk::convert
