#pragma once
// The reader of one field of one dataset split: the one place where a field's
// bytes are read by sample range, by the dataset API (Dataset::read,
// dsconvert, dsplan, the Python bindings) and by the resident placements
// loading a split. Immutable once open, and thread-safe: every reader of the
// dataset shares it. The stream placement reads through its own
// data::StreamReader (dstk/data/stream_reader.hpp), which owns the handles,
// O_DIRECT, decode cache and counters of one source.
//
// A field is one file, or several parts (FieldInfo::parts: each part a file of
// consecutive samples in the field's storage); the reader joins them, so a
// caller sees one run of samples whatever the layout. Opening validates every
// file against the manifest (existence, size, npy header or chunk index) and
// names the file (and the part) on a mismatch.
#include <cstdint>
#include <filesystem>
#include <memory>
#include <string>

#include "dstk/manifest.hpp"

namespace dstk {

class ThreadPool;

class FieldReader {
  public:
    virtual ~FieldReader() = default;
    FieldReader(const FieldReader&) = delete;
    FieldReader& operator=(const FieldReader&) = delete;

    const FieldInfo& info() const { return info_; }
    // The field's file (the first part's, for a field in parts): for messages.
    const std::filesystem::path& path() const { return path_; }
    std::uint64_t samples() const { return samples_; }
    std::uint64_t sample_bytes() const { return info_.sample_bytes(); }
    // Storage chunk in samples (0 for .npy, which has none).
    std::uint64_t storage_chunk_samples() const {
        return info_.storage == Storage::zstd_chunked ? info_.chunk_samples : 0;
    }

    // Copies samples [first, first + count) into dst (count * sample_bytes
    // bytes) through the page cache; zstd chunks decoded on `pool` when given
    // (dsconvert's large sequential reads).
    virtual void read(std::uint64_t first, std::uint64_t count, void* dst, ThreadPool* pool = nullptr) const = 0;
    // Re-reads every file and checks its size and checksum against the
    // manifest; throws naming the file (and the first bad chunk where the
    // storage has chunks, decoded on `pool` when given).
    virtual void verify(ThreadPool* pool = nullptr) const = 0;

  protected:
    FieldReader(std::filesystem::path path, FieldInfo info, std::uint64_t samples)
        : path_(std::move(path)), info_(std::move(info)), samples_(samples) {}
    // Throws a runtime error naming the field when [first, first + count) is outside the split.
    void check_range(std::uint64_t first, std::uint64_t count) const;

  private:
    std::filesystem::path path_;
    FieldInfo info_;
    std::uint64_t samples_;
};

// Throws a runtime error naming `path` when [first, first + count) is outside its `samples`.
void check_sample_range(const std::filesystem::path& path, std::uint64_t samples, std::uint64_t first,
                        std::uint64_t count);

// Opens the reader of the field's storage, of its one file or of its parts.
std::unique_ptr<FieldReader> open_field_reader(const std::filesystem::path& dir, const SplitInfo& split,
                                               const FieldInfo& field);

} // namespace dstk
