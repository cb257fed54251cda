#pragma once
// Sample access for the stream placement: whole ranges of samples with large
// reads (read_range: what the window cache loads its chunks with), and, for
// the full order, gathers of single samples (pread runs for .npy storage,
// decode-once chunks shared by all readers for zstd-chunked storage).
// Thread-safe.
#include <cstdint>
#include <filesystem>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <span>
#include <vector>

#include "dstk/manifest.hpp"

namespace dstk::data {

// Reads issued to the file since the last take_io(): what --log-json reports
// so that a test (or a user) can see the size of the reads.
struct IoCounters {
    std::uint64_t reads = 0, bytes = 0;
    std::uint64_t smallest = 0, largest = 0; // bytes of one read (0: none)
    void add(std::uint64_t n);
    void merge(const IoCounters& o);
};

class FieldAccess {
  public:
    virtual ~FieldAccess() = default;
    std::uint64_t samples() const { return samples_; }
    std::uint64_t sample_bytes() const { return sample_bytes_; }
    // Storage chunk in samples (0 for .npy, which has none).
    virtual std::uint64_t storage_chunk_samples() const = 0;
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
    IoCounters take_io();
    // The epoch will soon read these chunks of `chunk_samples` samples.
    virtual void will_need(std::span<const std::uint64_t> chunks, std::uint64_t chunk_samples) = 0;
    // Host bytes held for decoded data or O_DIRECT bounce buffers (bounded).
    virtual std::uint64_t cache_bytes() const = 0;
    // Whether reads bypass the page cache (O_DIRECT).
    virtual bool direct() const { return false; }
    // Seconds reader threads spent decoding chunks (reading a compressed
    // frame and decompressing it) since the last call; 0 for .npy storage.
    virtual double take_decode_seconds() { return 0.0; }

  protected:
    void count_read(std::uint64_t bytes);
    FieldAccess(std::uint64_t samples, std::uint64_t sample_bytes) : samples_(samples), sample_bytes_(sample_bytes) {}

  private:
    std::uint64_t samples_, sample_bytes_;
    std::mutex io_mutex_;
    IoCounters io_;
};

// `cache_chunks`: decoded chunks kept for zstd-chunked storage (at least the
// order's window plus one per reader, so a window is decoded once).
// `direct`: read .npy storage with O_DIRECT (4 KiB-aligned reads into aligned
// bounce buffers of at most 4 MiB + 8 KiB per reader, copied out); where the
// filesystem refuses O_DIRECT at open (tmpfs before Linux 6.6, some FUSE and
// network filesystems), or for zstd-chunked storage, reads go through the page
// cache and `notice` is told why. Where an O_DIRECT read fails later with
// EINVAL or EOPNOTSUPP, that read and every later one of the file go through
// the page cache and `warn` (else `notice`) is told once, from a reader thread.
std::unique_ptr<FieldAccess> open_field_access(const std::filesystem::path& dataset_dir, const SplitInfo& split,
                                               const FieldInfo& field, std::uint64_t cache_chunks, bool direct = false,
                                               const std::function<void(const std::string&)>& notice = {},
                                               const std::function<void(const std::string&)>& warn = {});

} // namespace dstk::data
