#pragma once
// The fields a batch source delivers, resolved against the split once: every
// part of the data path (the ring, the window cache, the resident copies, the
// memory plans) takes its per-field sizes and read settings from here.
//
// The lead field is the one with the most bytes per sample (the first of
// them): its reads are the ones that cost, so its zstd storage chunk is the
// order's chunk (each of its chunks is then decoded once per window) and its
// reads are the ones StageTimes::io counts.
//
// A bulk field has at least a quarter of the lead's bytes per sample (the
// input, a 480-byte f32[120] target beside a 1296-byte image). Bulk fields
// read with O_DIRECT where the source reads directly, and their pages leave
// the page cache once read where the plan drops pages. The others (labels,
// small side targets) stay buffered and keep their pages: each adds at most a
// quarter of the lead's bytes to the page cache; a page of them holds the
// samples of several chunks, so dropping it would make the next chunk's read a
// disk read of its own; and O_DIRECT would make every chunk read of them a
// small disk read queued behind the large ones.
#include <cstddef>
#include <cstdint>
#include <vector>

#include "dstk/batch.hpp"
#include "dstk/data/order.hpp"
#include "dstk/manifest.hpp"

namespace dstk::data {

class SourceFields {
  public:
    SourceFields(const SplitInfo& split, std::vector<const FieldInfo*> fields);

    const SplitInfo& split() const { return *split_; }
    const std::vector<const FieldInfo*>& list() const { return list_; }
    std::uint64_t samples() const { return split_->samples; }
    std::size_t size() const { return list_.size(); }
    const FieldInfo& operator[](std::size_t f) const { return *list_[f]; }
    std::size_t lead() const { return lead_; }
    bool bulk(std::size_t f) const;
    // Bytes of one sample over every field.
    std::uint64_t row_bytes() const;
    // The order's chunk: the lead's storage chunk where it is zstd-chunked,
    // else the configuration's.
    OrderConfig order(const OrderConfig& config) const;
    // The storage chunk io_threads_for sizes the I/O threads by: the lead's,
    // else any decoded field's (zstd chunks are decoded on those threads); 0
    // where every field is .npy.
    std::uint64_t decoded_chunk() const;
    // The batch's fields named, typed and shaped, without data.
    Batch batch() const;

  private:
    const SplitInfo* split_;
    std::vector<const FieldInfo*> list_;
    std::size_t lead_ = 0;
};

} // namespace dstk::data
