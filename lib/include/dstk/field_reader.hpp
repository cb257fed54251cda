#pragma once
// The reader of one field of one dataset split: the one place where a field's
// bytes are read, by the dataset API (Dataset::read, dsconvert, dsplan, the
// Python bindings) and by the stream placement (whole ranges with large reads
// for the window cache, sample gathers for the full order) alike, so that a
// run opens each file once.
//
// A field is one file, or several parts (FieldInfo::parts: each part a file of
// consecutive samples in the field's storage); the reader joins them, so a
// caller sees one run of samples whatever the layout. Opening validates every
// file against the manifest (existence, size, npy header or chunk index) and
// names the file (and the part) on a mismatch. Thread-safe.
#include <cstdint>
#include <filesystem>
#include <functional>
#include <memory>
#include <mutex>
#include <span>
#include <string>

#include "dstk/manifest.hpp"

namespace dstk {

class ThreadPool;

// Reads issued to the files since the last take_io(): what --log-json reports
// so that a test (or a user) can see the size of the reads.
struct IoCounters {
    std::uint64_t reads = 0, bytes = 0;
    std::uint64_t smallest = 0, largest = 0; // bytes of one read (0: none)
    void add(std::uint64_t n);
    void merge(const IoCounters& o);
};

using Message = std::function<void(const std::string&)>;

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
    // bytes), through the page cache whatever set_direct says; zstd chunks
    // decoded on `pool` when given (dsconvert's large sequential reads).
    virtual void read(std::uint64_t first, std::uint64_t count, void* dst, ThreadPool* pool = nullptr) const = 0;
    // Re-reads every file and checks its size and checksum against the
    // manifest; throws naming the file (and the first bad chunk where the
    // storage has chunks, decoded on `pool` when given).
    virtual void verify(ThreadPool* pool = nullptr) const = 0;

    // --- The stream placement's reads (counted in take_io) ---
    // Copies samples[indices[i]] to dst + i * sample_bytes; consecutive indices
    // become one read.
    virtual void gather(std::span<const std::uint64_t> indices, std::uint8_t* dst) = 0;
    // Bytes of buffer read_range needs for `count` samples: the samples plus
    // slack for O_DIRECT's alignment.
    virtual std::uint64_t range_buffer_bytes(std::uint64_t count) const { return count * sample_bytes(); }
    // Reads samples [first, first + count) with large reads into `buf` (4096-
    // aligned, range_buffer_bytes(count) bytes); returns the offset in buf of
    // sample `first` (non-zero only for O_DIRECT reads of unaligned ranges).
    virtual std::uint64_t read_range(std::uint64_t first, std::uint64_t count, std::uint8_t* buf) = 0;
    // Samples [first, first + count) have been copied out: their pages may
    // leave the page cache (POSIX_FADV_DONTNEED), so that the kernel's cache
    // does not compete with the window cache for memory.
    virtual void drop_pages(std::uint64_t, std::uint64_t) {}
    // Whether the kernel reads ahead of buffered reads. Off where the reads
    // are whole chunks at random offsets: readahead would fetch past each
    // chunk (up to read_ahead_kb more per read), bytes the disk spends
    // bandwidth on and nobody uses.
    virtual void read_ahead(bool) {}
    // The epoch will soon read these chunks of `chunk_samples` samples.
    virtual void will_need(std::span<const std::uint64_t>, std::uint64_t) {}
    // Stream reads (gather, read_range) with O_DIRECT (on) or through the page
    // cache (off, the default). .npy storage: 4 KiB-aligned reads, into
    // aligned bounce buffers of at most 4 MiB + 8 KiB per reader for gathers;
    // zstd-chunked storage: each frame's 4 KiB-aligned cover, into the
    // reading thread's frame buffer. Where the filesystem refuses O_DIRECT at
    // the probe (tmpfs before Linux 6.6, some FUSE and network filesystems),
    // reads stay buffered and `notice` is told why. Where an O_DIRECT read
    // fails later with EINVAL or EOPNOTSUPP, that read and every later one go
    // through the page cache and `warn` (else `notice`) is told once.
    virtual void set_direct(bool, const Message& = {}, const Message& = {}) {}
    // Whether stream reads bypass the page cache now.
    virtual bool direct() const { return false; }
    // Decoded chunks kept for gathers of zstd-chunked storage (at least the
    // order's window plus one per reader, so that a window is decoded once).
    virtual void set_decoded_chunks(std::uint64_t) {}
    // The counters are the reader's: with two stream sources on one reader
    // at once, each takes the other's reads too.
    IoCounters take_io();
    // Seconds spent decoding chunks (reading a compressed frame and
    // decompressing it) since the last call; 0 for .npy storage.
    double take_decode_seconds();

  protected:
    FieldReader(std::filesystem::path path, FieldInfo info, std::uint64_t samples)
        : path_(std::move(path)), info_(std::move(info)), samples_(samples) {}
    // Throws a runtime error naming the field when [first, first + count) is outside the split.
    void check_range(std::uint64_t first, std::uint64_t count) const;
    void count_read(std::uint64_t bytes);
    void count_decode(double seconds);

  private:
    std::filesystem::path path_;
    FieldInfo info_;
    std::uint64_t samples_;
    std::mutex stats_mutex_;
    IoCounters io_;
    double decode_seconds_ = 0;
};

// Opens the reader of the field's storage, of its one file or of its parts.
std::unique_ptr<FieldReader> open_field_reader(const std::filesystem::path& dir, const SplitInfo& split,
                                               const FieldInfo& field);

} // namespace dstk
