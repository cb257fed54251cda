#pragma once
// The zstd-chunked storage of one dataset field (man/dstk-format.5, section
// ZSTD-CHUNKED STORAGE). A file is a sequence of zstd frames:
//
//   header   skippable frame (magic 0x184D2A50): "DSTKZCHK", version, sample
//            bytes, samples per chunk
//   chunk i  one standard zstd frame (content size and content checksum on)
//            holding samples [i*C, min((i+1)*C, N)) in sample-major order
//   index    skippable frame (magic 0x184D2A5E): "DSTKZIDX", N, sample bytes,
//            C, chunk count, then per chunk (offset, compressed bytes, XXH64 of
//            the frame's bytes), the XXH64 of the index, and a 16-byte trailer
//            (index frame bytes, "DSTKZEND") that ends the file
//
// `zstd -d FILE` skips the skippable frames and prints the raw samples; a
// reader finds the index from the last 16 bytes and then reaches any chunk
// with one pread. Chunks are compressed independently at one level, so the
// file is byte-identical whatever the number of threads.
#include <atomic>
#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "dstk/checksum.hpp"

#include "dstk/fd.hpp"

namespace dstk {

class ThreadPool;

inline constexpr std::uint32_t chunked_header_magic = 0x184D2A50; // zstd skippable frame, nibble 0
inline constexpr std::uint32_t chunked_index_magic = 0x184D2A5E;  // zstd skippable frame, nibble 0xE
inline constexpr std::uint32_t chunked_format_version = 1;
inline constexpr std::size_t chunked_header_bytes = 8 + 32; // frame header + payload
inline constexpr std::size_t chunked_trailer_bytes = 16;    // u64 index frame bytes + "DSTKZEND"
inline constexpr int chunked_default_level = 3;
inline constexpr std::uint64_t chunked_default_chunk_bytes = 4ull << 20;

struct ChunkEntry {
    std::uint64_t offset = 0;           // of the zstd frame, from the start of the file
    std::uint64_t compressed_bytes = 0; // the whole frame
    std::uint64_t checksum = 0;         // XXH64 of the frame's bytes
};

struct ChunkIndex {
    std::uint64_t samples = 0;
    std::uint64_t sample_bytes = 0;
    std::uint64_t chunk_samples = 0;
    std::vector<ChunkEntry> chunks;
};

struct SampleRange {
    std::uint64_t first = 0, count = 0;
};

// Samples of chunk i in a field of `samples` samples, `chunk_samples` per chunk.
SampleRange chunk_sample_range(std::uint64_t i, std::uint64_t samples, std::uint64_t chunk_samples);
std::uint64_t chunk_count(std::uint64_t samples, std::uint64_t chunk_samples);

// The index frame's bytes (from its skippable-frame magic to the end of the
// trailer), and its parser. parse_chunk_index checks every field against
// `file_bytes` (the size of the whole file) and throws Error(failure) naming
// `source` on anything inconsistent; it never trusts a count before checking
// it against the bytes present.
std::vector<std::uint8_t> serialize_chunk_index(const ChunkIndex& index);
ChunkIndex parse_chunk_index(std::span<const std::uint8_t> frame, std::uint64_t file_bytes, const std::string& source);
std::vector<std::uint8_t> serialize_chunked_header(std::uint64_t sample_bytes, std::uint64_t chunk_samples);

// Random access to a zstd-chunked file at chunk granularity. Thread-safe: any
// number of threads may call read_chunk / read at once (pread, one zstd
// decompression context per thread).
class ChunkedReader {
  public:
    explicit ChunkedReader(std::filesystem::path path);
    ~ChunkedReader();
    ChunkedReader(const ChunkedReader&) = delete;
    ChunkedReader& operator=(const ChunkedReader&) = delete;

    const std::filesystem::path& path() const { return path_; }
    const ChunkIndex& index() const { return index_; }
    std::uint64_t file_bytes() const { return file_bytes_; }
    std::uint64_t samples() const { return index_.samples; }
    std::uint64_t sample_bytes() const { return index_.sample_bytes; }
    std::uint64_t chunk_samples() const { return index_.chunk_samples; }
    std::uint64_t chunks() const { return index_.chunks.size(); }
    SampleRange chunk_range(std::uint64_t i) const;
    // Uncompressed bytes of chunk i (chunk_range(i).count * sample_bytes()).
    std::uint64_t chunk_bytes(std::uint64_t i) const;
    // The largest chunk, for sizing buffers.
    std::uint64_t max_chunk_bytes() const { return index_.chunk_samples * index_.sample_bytes; }

    // What read_chunk calls cost (added up): the bytes read from the file
    // (the frame, or its 4 KiB-aligned cover with O_DIRECT) and the seconds in
    // zstd, for the stream's stage times (reading is the rest).
    struct Cost {
        std::uint64_t bytes = 0;
        double decode_seconds = 0;
    };
    // Decompresses chunk i into dst (chunk_bytes(i) bytes), checking zstd's
    // content checksum of the decoded bytes (the frame's XXH64 from the index
    // only when that fails, to name the damage); errors name the file and chunk.
    void read_chunk(std::uint64_t i, void* dst, Cost* cost = nullptr) const;
    // Frames read with O_DIRECT from now on (on) or through the page cache.
    // Opens and proves an O_DIRECT descriptor the first time; false where the
    // filesystem refuses O_DIRECT (reads stay buffered). Where an O_DIRECT read
    // fails later with EINVAL or EOPNOTSUPP, that read and every later one go
    // through the page cache (direct() turns false).
    bool set_direct(bool on);
    bool direct() const { return direct_.load(std::memory_order_relaxed); }
    // Samples [first, first + count) were read: the pages of their chunks'
    // frames may leave the page cache (POSIX_FADV_DONTNEED).
    void drop_pages(std::uint64_t first, std::uint64_t count) const;
    // Samples [first, first + count) into dst; chunks decoded on `pool` when
    // given; their cost added to `cost` when given.
    void read(std::uint64_t first, std::uint64_t count, void* dst, ThreadPool* pool = nullptr,
              Cost* cost = nullptr) const;
    // Decodes every chunk (on `pool` when given), checking the frames' XXH64
    // too; throws naming the first bad one.
    void verify(ThreadPool* pool = nullptr) const;

  private:
    void decode_chunk(std::uint64_t i, void* dst, bool check_frame, Cost* cost) const;
    const std::uint8_t* read_frame(const ChunkEntry& e, Cost* cost) const;
    std::filesystem::path path_;
    UniqueFd fd_;
    UniqueFd dfd_; // O_DIRECT, opened by set_direct
    mutable std::atomic<bool> direct_{false};
    std::uint64_t file_bytes_ = 0;
    ChunkIndex index_;
    std::uint64_t max_frame_bytes_ = 0; // the largest frame: one decode buffer per thread fits all
};

// Sequential writer of a zstd-chunked file. Samples are buffered; every batch
// of whole chunks is compressed in parallel on `pool` while the caller goes on
// filling the next batch (double buffering), and written in order when that
// next batch is full (or at flush/finish). Errors of a batch surface at the
// next append/flush/finish.
class ChunkedWriter {
  public:
    // Creates (truncates) `path`. level: zstd level 1..19 (negative: fast levels).
    ChunkedWriter(std::filesystem::path path, std::uint64_t sample_bytes, std::uint64_t chunk_samples, int level,
                  ThreadPool& pool);
    // Reopens a file left by an interrupted run: keeps its first
    // `keep_samples` samples (a multiple of chunk_samples whose frames must
    // all be present and valid), truncates the rest and continues after them.
    static ChunkedWriter resume(std::filesystem::path path, std::uint64_t sample_bytes, std::uint64_t chunk_samples,
                                int level, ThreadPool& pool, std::uint64_t keep_samples);
    // Samples held by the complete, valid chunk frames at the start of a
    // partial file (0 when it is missing or its header differs): where
    // resume() can continue. Stops at the first torn or corrupt frame.
    static std::uint64_t complete_samples(const std::filesystem::path& path, std::uint64_t sample_bytes,
                                          std::uint64_t chunk_samples);
    ~ChunkedWriter();
    ChunkedWriter(ChunkedWriter&&) noexcept;
    ChunkedWriter& operator=(ChunkedWriter&&) = delete;

    // Appends whole samples in order.
    void append(const void* data, std::uint64_t count);
    // Compresses and writes every whole chunk buffered so far (a partial last
    // chunk stays buffered); after it the file holds written() / chunk_samples
    // complete chunks.
    void flush();
    std::uint64_t written() const { return written_; }
    // Samples buffered before a batch of chunks is compressed and written:
    // about 16 MiB of input by default, so a field of small samples (labels)
    // writes rarely. limit_batch_samples(n), before the first append, caps it
    // at n rounded down to whole chunks (at least one), so that fields written
    // side by side reach the disk, and a --resume point, together.
    std::uint64_t batch_samples() const { return batch_chunks_ * chunk_samples_; }
    void limit_batch_samples(std::uint64_t samples);
    std::uint64_t file_bytes() const { return file_bytes_; }
    // Writes the last chunk and the index, closes the file; returns the XXH64
    // of the whole file ("xxh64:<hex>") and sets file_bytes().
    std::string finish();

  private:
    ChunkedWriter(std::filesystem::path path, std::uint64_t sample_bytes, std::uint64_t chunk_samples, int level,
                  ThreadPool& pool, UniqueFd fd);
    struct Batch;
    // Waits for the batch in flight, writes its frames in order.
    void collect();
    // collect(), then starts compressing the buffered whole chunks (and the
    // partial last one when include_partial) on the pool.
    void launch(bool include_partial);

    std::filesystem::path path_;
    std::uint64_t sample_bytes_, chunk_samples_;
    int level_;
    ThreadPool* pool_;
    UniqueFd fd_;
    std::uint64_t batch_chunks_;
    std::vector<std::uint8_t> buffer_; // samples not yet compressed
    std::uint64_t buffered_samples_ = 0;
    std::uint64_t written_ = 0;
    std::uint64_t file_bytes_ = 0;
    std::vector<ChunkEntry> entries_;
    Xxh64 hash_; // of the bytes written, in file order
    std::unique_ptr<Batch> pending_, spare_;
};

// zstd's level range, for option validation.
int zstd_min_level();
int zstd_max_level();

} // namespace dstk
