#pragma once
// The stream placement's reader of one field: one per field per batch source.
// It opens the field's files itself (each part of a field in parts) and owns
// what is particular to one source's reads: its descriptors and their kernel
// readahead setting, O_DIRECT (and its bounce buffers), the decoded chunks its
// gathers share (zstd-chunked storage) and its read counters. Two sources of
// one dataset (dstrain's training and evaluation) therefore never share a
// setting or a count. The dataset's FieldReader (dstk/field_reader.hpp) is
// the immutable reader of everything else.
//
// Every call may come from several threads at once (the ring's readers, the
// window cache's I/O threads).
#include <atomic>
#include <cstdint>
#include <filesystem>
#include <functional>
#include <memory>
#include <mutex>
#include <span>
#include <string>
#include <string_view>

#include "dstk/data/settings.hpp"
#include "dstk/dataset.hpp"

namespace dstk::data {

// Reads issued to the files since the last take_io(): what --log-json reports
// so that a test (or a user) can see the size of the reads.
struct IoCounters {
    std::uint64_t reads = 0, bytes = 0;
    std::uint64_t smallest = 0, largest = 0; // bytes of one read (0: none)
    void add(std::uint64_t n);
    void merge(const IoCounters& o);
};

using Message = std::function<void(const std::string&)>;

struct StreamSettings {
    // Reads (gather, read_range) with O_DIRECT, bypassing the page cache.
    // .npy storage: 4 KiB-aligned reads, into aligned bounce buffers of at
    // most 4 MiB + 8 KiB per reader for gathers; zstd-chunked storage: each
    // frame's 4 KiB-aligned cover, into the reading thread's frame buffer.
    // Where the filesystem refuses O_DIRECT at open (tmpfs before Linux 6.6,
    // some FUSE and network filesystems), reads stay buffered and `notice` is
    // told why. Where an O_DIRECT read fails later with EINVAL or EOPNOTSUPP,
    // that read and every later one go through the page cache and `warn`
    // (else `notice`) is told once.
    bool direct = false;
    // Decoded chunks kept for gathers of zstd-chunked storage (at least the
    // order's window plus one per reader, so that a window is decoded once).
    std::uint64_t decoded_chunks = 2;
    Message notice, warn;
    SettingNames names; // how the messages spell the setting "direct"
};

class StreamReader {
  public:
    // Opens field `field` of split `split` of `ds` for streaming.
    static std::unique_ptr<StreamReader> open(const Dataset& ds, std::string_view split, std::string_view field,
                                              const StreamSettings& settings);
    // The same for a field described apart from a dataset (its files under `dir`).
    static std::unique_ptr<StreamReader> open(const std::filesystem::path& dir, const SplitInfo& split,
                                              const FieldInfo& field, const StreamSettings& settings);
    virtual ~StreamReader() = default;
    StreamReader(const StreamReader&) = delete;
    StreamReader& operator=(const StreamReader&) = delete;

    const FieldInfo& info() const { return info_; }
    const std::filesystem::path& path() const { return path_; } // the first file's, for messages
    std::uint64_t samples() const { return samples_; }
    std::uint64_t sample_bytes() const { return info_.sample_bytes(); }

    // Copies samples[indices[i]] to dst + i * sample_bytes; consecutive
    // indices become one read.
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
    // Whether reads bypass the page cache now (StreamSettings::direct, unless
    // refused).
    virtual bool direct() const { return false; }

    IoCounters take_io();
    // Seconds spent decoding chunks (reading a compressed frame and
    // decompressing it) since the last call; 0 for .npy storage.
    double take_decode_seconds();

  protected:
    StreamReader(std::filesystem::path path, FieldInfo info, std::uint64_t samples)
        : path_(std::move(path)), info_(std::move(info)), samples_(samples) {}
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

} // namespace dstk::data
