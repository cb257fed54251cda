#pragma once
// Fields stored in parts (FieldInfo::parts, written by dsconvert --merge), as
// dsconvert reads and verifies them: each part is the single-file field its
// --shard run wrote, opened with the ordinary field readers.
#include <cstdint>
#include <filesystem>
#include <memory>
#include <vector>

#include "dstk/chunked_file.hpp"
#include "dstk/dataset.hpp"
#include "dstk/manifest.hpp"

namespace dstk::convert {

// One file of a field: the split and field as that file alone describes them.
struct PartView {
    SplitInfo split; // its samples: the part's
    FieldInfo field; // its file, bytes and checksum: the part's
};

// The files of `field` in sample order: one view for a single-file field.
std::vector<PartView> part_views(const SplitInfo& split, const FieldInfo& field);
bool has_parts(const Manifest& m);

// Sequential-or-random reads of samples across the parts of a field.
class PartedField {
  public:
    PartedField(const std::filesystem::path& dir, const SplitInfo& split, const FieldInfo& field);
    // Samples [first, first + count) into dst; zstd chunks decoded on `pool`.
    void read(std::uint64_t first, std::uint64_t count, void* dst, ThreadPool* pool) const;
    // Re-reads every part, checking sizes and checksums (and zstd chunks).
    void verify(ThreadPool* pool) const;

  private:
    struct Part {
        std::uint64_t first = 0, samples = 0;
        std::unique_ptr<FieldReader> reader;    // validated against the manifest at open
        std::unique_ptr<ChunkedReader> chunked; // zstd-chunked parts: pooled decoding
    };
    std::vector<Part> parts_;
    std::uint64_t sample_bytes_ = 0;
};

} // namespace dstk::convert
