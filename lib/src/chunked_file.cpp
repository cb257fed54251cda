#include "dstk/chunked_file.hpp"

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <exception>
#include <mutex>
#include <cstring>
#include <fcntl.h>
#include <memory>
#include <sys/stat.h>
#include <unistd.h>
#include <zstd.h>

#include "dstk/atomic_output.hpp"
#include "dstk/error.hpp"
#include "dstk/signals.hpp"
#include "dstk/thread_pool.hpp"
#include "direct_io.hpp"

namespace fs = std::filesystem;

namespace dstk {
namespace {

constexpr char header_tag[8] = {'D', 'S', 'T', 'K', 'Z', 'C', 'H', 'K'};
constexpr char index_tag[8] = {'D', 'S', 'T', 'K', 'Z', 'I', 'D', 'X'};
constexpr char end_tag[8] = {'D', 'S', 'T', 'K', 'Z', 'E', 'N', 'D'};
constexpr std::size_t index_fixed_payload = 8 + 4 * 8 + 8 + 8 + 8; // tag, 4 fields, xxh64, frame bytes, end tag
constexpr std::size_t entry_bytes = 24;
// Uncompressed bytes in flight per writer batch: bounds memory whatever the chunk size.
constexpr std::uint64_t batch_target_bytes = 16ull << 20; // also what an interrupted --resume run can lose
constexpr std::uint64_t batch_limit_bytes = 128ull << 20;

void put_u32(std::vector<std::uint8_t>& b, std::uint32_t v) {
    for (int i = 0; i < 4; ++i) b.push_back(static_cast<std::uint8_t>(v >> (8 * i)));
}
void put_u64(std::vector<std::uint8_t>& b, std::uint64_t v) {
    for (int i = 0; i < 8; ++i) b.push_back(static_cast<std::uint8_t>(v >> (8 * i)));
}
void put_tag(std::vector<std::uint8_t>& b, const char (&tag)[8]) {
    b.insert(b.end(), tag, tag + 8);
}
std::uint32_t get_u32(const std::uint8_t* p) {
    std::uint32_t v = 0;
    for (int i = 3; i >= 0; --i) v = (v << 8) | p[i];
    return v;
}
std::uint64_t get_u64(const std::uint8_t* p) {
    std::uint64_t v = 0;
    for (int i = 7; i >= 0; --i) v = (v << 8) | p[i];
    return v;
}

const std::string redo = "; the file is corrupted or was not written by dsconvert: re-create it (dsconvert)";

[[noreturn]] void corrupt(const std::string& source, const std::string& why) {
    throw runtime_error(source + ": " + why + redo);
}

struct DCtxDeleter {
    void operator()(ZSTD_DCtx* c) const { ZSTD_freeDCtx(c); }
};
struct CCtxDeleter {
    void operator()(ZSTD_CCtx* c) const { ZSTD_freeCCtx(c); }
};

ZSTD_DCtx* thread_dctx() {
    thread_local std::unique_ptr<ZSTD_DCtx, DCtxDeleter> ctx(ZSTD_createDCtx());
    if (!ctx) throw std::bad_alloc();
    return ctx.get();
}

ZSTD_CCtx* thread_cctx(int level) {
    thread_local std::unique_ptr<ZSTD_CCtx, CCtxDeleter> ctx(ZSTD_createCCtx());
    if (!ctx) throw std::bad_alloc();
    ZSTD_CCtx_reset(ctx.get(), ZSTD_reset_session_and_parameters);
    ZSTD_CCtx_setParameter(ctx.get(), ZSTD_c_compressionLevel, level);
    ZSTD_CCtx_setParameter(ctx.get(), ZSTD_c_checksumFlag, 1);
    ZSTD_CCtx_setParameter(ctx.get(), ZSTD_c_contentSizeFlag, 1);
    return ctx.get();
}

std::string chunk_name(std::uint64_t i, std::uint64_t n, SampleRange r, std::uint64_t offset) {
    return "chunk " + std::to_string(i) + " of " + std::to_string(n) + " (samples " + std::to_string(r.first) + ".." +
           std::to_string(r.first + r.count - 1) + ", at byte " + std::to_string(offset) + ")";
}

// Decompresses one frame (already read into `frame`) into dst, checking sizes
// and the zstd content checksum; returns an empty string or the reason it failed.
std::string decode_frame(std::span<const std::uint8_t> frame, void* dst, std::uint64_t expect_bytes) {
    if (frame.size() < 5 || get_u32(frame.data()) != ZSTD_MAGICNUMBER) return "not a zstd frame";
    // Our frames always carry a content checksum (bit 2 of the frame header
    // descriptor, RFC 8878 3.1.1.1.1): a header without one is damaged.
    if (!(frame[4] & 0x04)) return "frame has no content checksum";
    const unsigned long long content = ZSTD_getFrameContentSize(frame.data(), frame.size());
    if (content == ZSTD_CONTENTSIZE_ERROR) return "not a zstd frame";
    if (content != ZSTD_CONTENTSIZE_UNKNOWN && content != expect_bytes)
        return "frame holds " + std::to_string(content) + " bytes, expected " + std::to_string(expect_bytes);
    const std::size_t n = ZSTD_decompressDCtx(thread_dctx(), dst, expect_bytes, frame.data(), frame.size());
    if (ZSTD_isError(n)) return std::string("zstd: ") + ZSTD_getErrorName(n);
    if (n != expect_bytes)
        return "frame decompressed to " + std::to_string(n) + " bytes, expected " + std::to_string(expect_bytes);
    return {};
}

void check_geometry(std::uint64_t sample_bytes, std::uint64_t chunk_samples, const std::string& source) {
    if (sample_bytes == 0) corrupt(source, "sample size is 0");
    if (chunk_samples == 0) corrupt(source, "samples per chunk is 0");
    if (chunk_samples > (std::uint64_t{1} << 62) / sample_bytes ||
        chunk_samples * sample_bytes > std::uint64_t(ZSTD_CONTENTSIZE_ERROR - 1) / 2)
        corrupt(source, "chunk size " + std::to_string(chunk_samples) + " x " + std::to_string(sample_bytes) +
                            " bytes is out of range");
}

} // namespace

std::uint64_t chunk_count(std::uint64_t samples, std::uint64_t chunk_samples) {
    return chunk_samples == 0 ? 0 : samples / chunk_samples + (samples % chunk_samples != 0);
}

SampleRange chunk_sample_range(std::uint64_t i, std::uint64_t samples, std::uint64_t chunk_samples) {
    const std::uint64_t first = i * chunk_samples;
    if (first >= samples) return {samples, 0};
    return {first, std::min(chunk_samples, samples - first)};
}

std::vector<std::uint8_t> serialize_chunked_header(std::uint64_t sample_bytes, std::uint64_t chunk_samples) {
    std::vector<std::uint8_t> b;
    put_u32(b, chunked_header_magic);
    put_u32(b, 32);
    put_tag(b, header_tag);
    put_u32(b, chunked_format_version);
    put_u32(b, 0);
    put_u64(b, sample_bytes);
    put_u64(b, chunk_samples);
    return b;
}

std::vector<std::uint8_t> serialize_chunk_index(const ChunkIndex& index) {
    const std::uint64_t payload = index_fixed_payload + entry_bytes * index.chunks.size();
    if (payload > 0xFFFFFFFFull)
        throw runtime_error("chunk index of " + std::to_string(index.chunks.size()) +
                            " chunks does not fit a zstd skippable frame; use larger chunks (--chunk-size)");
    std::vector<std::uint8_t> b;
    b.reserve(8 + payload);
    put_u32(b, chunked_index_magic);
    put_u32(b, static_cast<std::uint32_t>(payload));
    put_tag(b, index_tag);
    put_u64(b, index.samples);
    put_u64(b, index.sample_bytes);
    put_u64(b, index.chunk_samples);
    put_u64(b, index.chunks.size());
    for (const ChunkEntry& e : index.chunks) {
        put_u64(b, e.offset);
        put_u64(b, e.compressed_bytes);
        put_u64(b, e.checksum);
    }
    put_u64(b, xxh64(b.data() + 8, b.size() - 8));
    put_u64(b, 8 + payload);
    put_tag(b, end_tag);
    return b;
}

ChunkIndex parse_chunk_index(std::span<const std::uint8_t> frame, std::uint64_t file_bytes, const std::string& source) {
    if (frame.size() < 8 + index_fixed_payload) corrupt(source, "chunk index is too short");
    const std::uint8_t* p = frame.data();
    if (get_u32(p) != chunked_index_magic) corrupt(source, "chunk index has the wrong magic");
    const std::uint64_t payload = get_u32(p + 4);
    if (payload != frame.size() - 8) corrupt(source, "chunk index size disagrees with its frame header");
    if (std::memcmp(p + 8, index_tag, 8) != 0) corrupt(source, "chunk index has the wrong tag");
    const std::uint8_t* end = p + frame.size();
    if (std::memcmp(end - 8, end_tag, 8) != 0) corrupt(source, "chunk index trailer is missing");
    if (get_u64(end - 16) != frame.size()) corrupt(source, "chunk index trailer gives the wrong index size");
    if (get_u64(end - 24) != xxh64(p + 8, frame.size() - 8 - 24)) corrupt(source, "chunk index checksum mismatch");
    ChunkIndex ix;
    ix.samples = get_u64(p + 16);
    ix.sample_bytes = get_u64(p + 24);
    ix.chunk_samples = get_u64(p + 32);
    const std::uint64_t n = get_u64(p + 40);
    check_geometry(ix.sample_bytes, ix.chunk_samples, source);
    if ((payload - index_fixed_payload) % entry_bytes != 0 || (payload - index_fixed_payload) / entry_bytes != n)
        corrupt(source, "chunk index declares " + std::to_string(n) + " chunks but holds " +
                            std::to_string((payload - index_fixed_payload) / entry_bytes));
    if (chunk_count(ix.samples, ix.chunk_samples) != n)
        corrupt(source, std::to_string(ix.samples) + " samples in chunks of " + std::to_string(ix.chunk_samples) +
                            " need " + std::to_string(chunk_count(ix.samples, ix.chunk_samples)) +
                            " chunks, the index has " + std::to_string(n));
    if (file_bytes < chunked_header_bytes + frame.size()) corrupt(source, "file is shorter than its chunk index");
    const std::uint64_t data_end = file_bytes - frame.size();
    ix.chunks.resize(n);
    std::uint64_t expect_offset = chunked_header_bytes;
    for (std::uint64_t i = 0; i < n; ++i) {
        const std::uint8_t* e = p + 48 + i * entry_bytes;
        ChunkEntry& c = ix.chunks[i];
        c.offset = get_u64(e);
        c.compressed_bytes = get_u64(e + 8);
        c.checksum = get_u64(e + 16);
        if (c.offset != expect_offset || c.compressed_bytes == 0 || c.compressed_bytes > data_end - c.offset)
            corrupt(source, "chunk index entry " + std::to_string(i) + " (offset " + std::to_string(c.offset) + ", " +
                                std::to_string(c.compressed_bytes) + " bytes) is outside the chunk data");
        expect_offset = c.offset + c.compressed_bytes;
    }
    if (expect_offset != data_end)
        corrupt(source, "chunk data ends at byte " + std::to_string(expect_offset) + " but the index starts at " +
                            std::to_string(data_end));
    return ix;
}

ChunkedReader::ChunkedReader(fs::path path) : path_(std::move(path)), fd_(open_input_file(path_, "chunked file")) {
    const std::string where = path_.string();
    struct stat st {};
    if (::fstat(fd_.get(), &st) != 0) throw_errno("cannot stat", where);
    file_bytes_ = static_cast<std::uint64_t>(st.st_size);
    if (file_bytes_ < chunked_header_bytes + chunked_trailer_bytes)
        corrupt(where, "file has " + std::to_string(file_bytes_) + " bytes, too short for zstd-chunked storage");
    std::uint8_t head[chunked_header_bytes];
    read_all(fd_.get(), head, sizeof head, 0, path_);
    if (get_u32(head) != chunked_header_magic || get_u32(head + 4) != 32 || std::memcmp(head + 8, header_tag, 8))
        corrupt(where, "wrong magic (not a zstd-chunked dataset file)");
    if (get_u32(head + 16) != chunked_format_version)
        throw runtime_error(where + ": zstd-chunked format version " + std::to_string(get_u32(head + 16)) +
                            " is not supported by this build (version " + std::to_string(chunked_format_version) +
                            "); upgrade dstk");
    std::uint8_t tail[chunked_trailer_bytes];
    read_all(fd_.get(), tail, sizeof tail, static_cast<long long>(file_bytes_ - sizeof tail), path_);
    if (std::memcmp(tail + 8, end_tag, 8) != 0)
        corrupt(where, "the chunk index trailer is missing (file truncated, or its writer was interrupted?)");
    const std::uint64_t index_bytes = get_u64(tail);
    if (index_bytes < 8 + index_fixed_payload || index_bytes > file_bytes_ - chunked_header_bytes)
        corrupt(where, "chunk index size " + std::to_string(index_bytes) + " is out of range");
    std::vector<std::uint8_t> frame(index_bytes);
    read_all(fd_.get(), frame.data(), frame.size(), static_cast<long long>(file_bytes_ - index_bytes), path_);
    index_ = parse_chunk_index(frame, file_bytes_, where);
    for (const ChunkEntry& e : index_.chunks) max_frame_bytes_ = std::max(max_frame_bytes_, e.compressed_bytes);
    if (index_.sample_bytes != get_u64(head + 24) || index_.chunk_samples != get_u64(head + 32))
        corrupt(where, "header and chunk index disagree on the sample or chunk size");
}

ChunkedReader::~ChunkedReader() = default;

SampleRange ChunkedReader::chunk_range(std::uint64_t i) const {
    return chunk_sample_range(i, index_.samples, index_.chunk_samples);
}

std::uint64_t ChunkedReader::chunk_bytes(std::uint64_t i) const {
    return chunk_range(i).count * index_.sample_bytes;
}

void ChunkedReader::read_chunk(std::uint64_t i, void* dst, Cost* cost) const {
    decode_chunk(i, dst, false, cost);
}

bool ChunkedReader::set_direct(bool on) {
    if (on && !dfd_) {
        int refused = 0;
        dfd_ = open_direct(path_, path_.string(), &refused);
        if (!dfd_) return false;
    }
    direct_ = on;
    return true;
}

void ChunkedReader::drop_pages(std::uint64_t first, std::uint64_t count) const {
    if (count == 0 || first >= samples()) return;
    const std::uint64_t c0 = first / chunk_samples();
    const std::uint64_t c1 = std::min(first + count - 1, samples() - 1) / chunk_samples();
    const ChunkEntry &a = index_.chunks[c0], &b = index_.chunks[c1];
    ::posix_fadvise(fd_.get(), static_cast<off_t>(a.offset),
                    static_cast<off_t>(b.offset + b.compressed_bytes - a.offset), POSIX_FADV_DONTNEED);
}

// The frame of chunk entry e, read into this thread's frame buffer: sized at
// once for the file's largest frame (plus O_DIRECT's alignment), never
// zero-filled. Grown frame by frame, each freed buffer raised glibc's mmap
// threshold and left a hole in the thread's arena: RSS above the host plan.
const std::uint8_t* ChunkedReader::read_frame(const ChunkEntry& e, Cost* cost) const {
    thread_local AlignedBuffer frame_buf;
    thread_local std::uint64_t frame_cap = 0;
    const std::uint64_t need = std::max(e.compressed_bytes, max_frame_bytes_) + 2 * direct_align;
    if (frame_cap < need) {
        frame_buf.reset(); // before the new one: never both at once
        frame_cap = 0;
        const std::uint64_t cap = (need + direct_align - 1) / direct_align * direct_align;
        frame_buf = aligned_buffer(cap);
        frame_cap = cap;
    }
    const std::uint8_t* frame = frame_buf.get();
    std::uint64_t bytes = e.compressed_bytes;
    bool done = false;
    if (direct()) {
        const std::uint64_t start = e.offset / direct_align * direct_align, lead = e.offset - start;
        const std::uint64_t len = (lead + e.compressed_bytes + direct_align - 1) / direct_align * direct_align;
        done = pread_direct(dfd_.get(), frame_buf.get(), start, len, lead + e.compressed_bytes, path_.string()) == 0;
        if (done) {
            frame += lead;
            bytes = len;
        } else {
            direct_ = false; // the filesystem refused this read: the page cache from now on
        }
    }
    if (!done) read_all(fd_.get(), frame_buf.get(), e.compressed_bytes, static_cast<long long>(e.offset), path_);
    if (cost) cost->bytes += bytes;
    return frame;
}

void ChunkedReader::decode_chunk(std::uint64_t i, void* dst, bool check_frame, Cost* cost) const {
    if (i >= chunks())
        throw runtime_error(path_.string() + ": chunk " + std::to_string(i) + " requested, the file has " +
                            std::to_string(chunks()));
    const ChunkEntry& e = index_.chunks[i];
    const std::span<const std::uint8_t> frame(read_frame(e, cost), e.compressed_bytes);
    const auto t0 = std::chrono::steady_clock::now();
    // The hot path trusts zstd's content checksum (checked on every decode;
    // decode_frame refuses frames without one), which covers the decoded
    // bytes; the frame's XXH64 from the index is computed only when decoding
    // fails, to say which of the two broke, and always by verify().
    const std::string why = decode_frame(frame, dst, chunk_bytes(i));
    if (cost) cost->decode_seconds += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    if (why.empty() && !check_frame) return;
    const bool hash_ok = xxh64(frame.data(), frame.size()) == e.checksum;
    if (why.empty() && hash_ok) return;
    const std::string where = path_.string() + ": " + chunk_name(i, chunks(), chunk_range(i), e.offset);
    if (!hash_ok) throw runtime_error(where + ": checksum mismatch (data corrupted)" + redo);
    throw runtime_error(where + ": " + why + redo);
}

void ChunkedReader::read(std::uint64_t first, std::uint64_t count, void* dst, ThreadPool* pool, Cost* cost) const {
    if (first > samples() || count > samples() - first)
        throw runtime_error("read of samples [" + std::to_string(first) + ", " + std::to_string(first + count) +
                            ") is outside '" + path_.string() + "' (" + std::to_string(samples()) + " samples)");
    if (count == 0) return;
    const std::uint64_t c0 = first / chunk_samples(), c1 = (first + count - 1) / chunk_samples();
    auto* out = static_cast<std::uint8_t*>(dst);
    std::mutex cost_mutex;
    auto one = [&](std::uint64_t k) {
        const std::uint64_t c = c0 + k;
        const SampleRange r = chunk_range(c);
        const std::uint64_t lo = std::max(first, r.first), hi = std::min(first + count, r.first + r.count);
        std::uint8_t* to = out + (lo - first) * sample_bytes();
        Cost mine;
        if (lo == r.first && hi == r.first + r.count) {
            read_chunk(c, to, &mine);
        } else {
            thread_local std::vector<std::uint8_t> tmp;
            tmp.resize(chunk_bytes(c));
            read_chunk(c, tmp.data(), &mine);
            std::memcpy(to, tmp.data() + (lo - r.first) * sample_bytes(), (hi - lo) * sample_bytes());
        }
        if (!cost) return;
        std::lock_guard lock(cost_mutex);
        cost->bytes += mine.bytes;
        cost->decode_seconds += mine.decode_seconds;
    };
    if (pool && c1 > c0)
        pool->parallel_for(c1 - c0 + 1, one);
    else
        for (std::uint64_t k = 0; k <= c1 - c0; ++k) one(k);
}

void ChunkedReader::verify(ThreadPool* pool) const {
    // Batches of chunks, so that the error names the first bad chunk whatever
    // the thread timing, with memory bounded by the batch.
    const std::uint64_t batch = pool ? std::max<std::uint64_t>(1, pool->size()) * 2 : 1;
    for (std::uint64_t start = 0; start < chunks(); start += batch) {
        throw_if_interrupted();
        const std::uint64_t n = std::min(batch, chunks() - start);
        std::vector<std::string> errors(n);
        auto one = [&](std::uint64_t k) {
            std::vector<std::uint8_t> buf(chunk_bytes(start + k));
            try {
                decode_chunk(start + k, buf.data(), true, nullptr);
            } catch (const Error& e) {
                errors[k] = e.what();
            }
        };
        if (pool)
            pool->parallel_for(n, one);
        else
            for (std::uint64_t k = 0; k < n; ++k) one(k);
        for (const std::string& e : errors)
            if (!e.empty()) throw runtime_error(e);
    }
}

ChunkedWriter::ChunkedWriter(fs::path path, std::uint64_t sample_bytes, std::uint64_t chunk_samples, int level,
                             ThreadPool& pool, UniqueFd fd)
    : path_(std::move(path)), sample_bytes_(sample_bytes), chunk_samples_(chunk_samples), level_(level), pool_(&pool),
      fd_(std::move(fd)) {
    const std::uint64_t chunk = sample_bytes_ * chunk_samples_;
    batch_chunks_ = std::max<std::uint64_t>(
        1, std::min<std::uint64_t>(std::max<std::uint64_t>(pool.size(), batch_target_bytes / chunk),
                                   batch_limit_bytes / chunk));
}

ChunkedWriter::ChunkedWriter(fs::path path, std::uint64_t sample_bytes, std::uint64_t chunk_samples, int level,
                             ThreadPool& pool)
    : ChunkedWriter(path, sample_bytes, chunk_samples, level, pool, UniqueFd()) {
    check_geometry(sample_bytes, chunk_samples, path_.string());
    fd_ = UniqueFd::open(path_, O_WRONLY | O_CREAT | O_TRUNC, "create");
    const auto head = serialize_chunked_header(sample_bytes_, chunk_samples_);
    write_all(fd_.get(), head.data(), head.size(), -1, path_);
    hash_.update(head.data(), head.size());
    file_bytes_ = head.size();
}

namespace {

// The complete chunks at the start of a partial zstd-chunked file (an
// interrupted writer's output): frames after the header, each decoding to a
// whole chunk, up to `max_chunks`. `why` says what stopped the walk short.
struct FrameWalk {
    std::uint64_t chunks = 0, end = 0; // good frames and the byte after the last
    std::vector<ChunkEntry> entries;
    std::string why; // empty: header fine and max_chunks reached or the file ended cleanly
};

FrameWalk walk_frames(int fd, const fs::path& path, std::uint64_t size, std::uint64_t sample_bytes,
                      std::uint64_t chunk_samples, std::uint64_t max_chunks, Xxh64* hash) {
    FrameWalk w;
    const auto head = serialize_chunked_header(sample_bytes, chunk_samples);
    std::vector<std::uint8_t> buf(head.size());
    if (size < head.size()) {
        w.why = "partial output is shorter than its header";
        return w;
    }
    read_all(fd, buf.data(), buf.size(), 0, path);
    if (buf != head) {
        w.why = "partial output has a different header";
        return w;
    }
    if (hash) hash->update(head.data(), head.size());
    w.end = head.size();
    const std::uint64_t chunk = sample_bytes * chunk_samples;
    std::vector<std::uint8_t> plain(chunk);
    const std::uint64_t max_frame = ZSTD_compressBound(chunk) + 64;
    while (w.chunks < max_chunks && w.end < size) {
        throw_if_interrupted();
        const std::string which = "partial output: chunk " + std::to_string(w.chunks);
        buf.resize(std::min(max_frame, size - w.end));
        read_all(fd, buf.data(), buf.size(), static_cast<long long>(w.end), path);
        const std::size_t n = ZSTD_findFrameCompressedSize(buf.data(), buf.size());
        if (ZSTD_isError(n)) {
            w.why = which + " is incomplete";
            return w;
        }
        const std::span<const std::uint8_t> frame(buf.data(), n);
        const std::string bad = decode_frame(frame, plain.data(), chunk);
        if (!bad.empty()) {
            w.why = which + ": " + bad;
            return w;
        }
        w.entries.push_back({w.end, n, xxh64(frame.data(), n)});
        if (hash) hash->update(frame.data(), n);
        w.end += n;
        ++w.chunks;
    }
    if (w.chunks < max_chunks && max_chunks != ~std::uint64_t{0})
        w.why = "partial output ends before chunk " + std::to_string(w.chunks);
    return w;
}

std::uint64_t file_size_of(int fd, const std::string& where) {
    struct stat st {};
    if (::fstat(fd, &st) != 0) throw_errno("cannot stat", where);
    return static_cast<std::uint64_t>(st.st_size);
}

} // namespace

ChunkedWriter ChunkedWriter::resume(fs::path path, std::uint64_t sample_bytes, std::uint64_t chunk_samples, int level,
                                    ThreadPool& pool, std::uint64_t keep_samples) {
    const std::string where = path.string();
    check_geometry(sample_bytes, chunk_samples, where);
    if (keep_samples % chunk_samples != 0)
        throw runtime_error("internal: resume point " + std::to_string(keep_samples) +
                            " is not on a chunk boundary of " + where);
    UniqueFd fd = UniqueFd::open(path, O_RDWR, "reopen");
    const int raw = fd.get();
    ChunkedWriter w(path, sample_bytes, chunk_samples, level, pool, std::move(fd));
    const std::uint64_t size = file_size_of(raw, where);
    FrameWalk walk = walk_frames(raw, path, size, sample_bytes, chunk_samples, keep_samples / chunk_samples, &w.hash_);
    if (!walk.why.empty()) corrupt(where, walk.why);
    w.entries_ = std::move(walk.entries);
    w.file_bytes_ = walk.end;
    if (::ftruncate(raw, static_cast<off_t>(w.file_bytes_)) != 0) throw_errno("cannot truncate", where);
    if (::lseek(raw, static_cast<off_t>(w.file_bytes_), SEEK_SET) < 0) throw_errno("cannot seek", where);
    w.written_ = keep_samples;
    return w;
}

std::uint64_t ChunkedWriter::complete_samples(const fs::path& path, std::uint64_t sample_bytes,
                                              std::uint64_t chunk_samples) {
    const UniqueFd fd = try_open_input_file(path, "chunked file");
    if (!fd) return 0;
    struct stat st {};
    if (::fstat(fd.get(), &st) != 0) return 0;
    try {
        const FrameWalk walk = walk_frames(fd.get(), path, static_cast<std::uint64_t>(st.st_size), sample_bytes,
                                           chunk_samples, ~std::uint64_t{0}, nullptr);
        return walk.chunks * chunk_samples;
    } catch (const Error& e) {
        if (e.code() == ExitCode::interrupted) throw;
        return 0;
    }
}

// A batch of whole chunks being compressed on the pool. The tasks touch only
// the batch, never the writer, so the writer can be moved meanwhile.
struct ChunkedWriter::Batch {
    std::vector<std::uint8_t> data; // uncompressed samples
    std::uint64_t chunks = 0, samples = 0, chunk_bytes = 0, last_bytes = 0;
    std::vector<std::unique_ptr<std::uint8_t[]>> frames; // reused across batches, never zero-filled
    std::vector<std::size_t> caps, sizes;
    std::vector<std::uint64_t> sums;
    std::vector<std::exception_ptr> errors;
    std::mutex m;
    std::condition_variable cv;
    std::uint64_t left = 0;

    void wait() {
        std::unique_lock lock(m);
        cv.wait(lock, [&] { return left == 0; });
    }
};

ChunkedWriter::ChunkedWriter(ChunkedWriter&& o) noexcept
    : path_(std::move(o.path_)), sample_bytes_(o.sample_bytes_), chunk_samples_(o.chunk_samples_), level_(o.level_),
      pool_(o.pool_), fd_(std::move(o.fd_)), batch_chunks_(o.batch_chunks_), buffer_(std::move(o.buffer_)),
      buffered_samples_(o.buffered_samples_), written_(o.written_), file_bytes_(o.file_bytes_),
      entries_(std::move(o.entries_)), hash_(o.hash_), pending_(std::move(o.pending_)), spare_(std::move(o.spare_)) {}

ChunkedWriter::~ChunkedWriter() {
    if (pending_) pending_->wait(); // its tasks use the batch's buffers
}

void ChunkedWriter::append(const void* data, std::uint64_t count) {
    auto* p = static_cast<const std::uint8_t*>(data);
    const std::uint64_t batch_samples = batch_chunks_ * chunk_samples_;
    while (count > 0) {
        const std::uint64_t take = std::min(count, batch_samples - buffered_samples_);
        if (buffer_.capacity() < batch_samples * sample_bytes_) buffer_.reserve(batch_samples * sample_bytes_);
        buffer_.insert(buffer_.end(), p, p + take * sample_bytes_); // no zero-fill before the copy
        buffered_samples_ += take;
        p += take * sample_bytes_;
        count -= take;
        if (buffered_samples_ == batch_samples) launch(false);
    }
}

void ChunkedWriter::limit_batch_samples(std::uint64_t samples) {
    if (buffered_samples_ != 0) throw std::logic_error("ChunkedWriter::limit_batch_samples after append");
    batch_chunks_ = std::clamp<std::uint64_t>(samples / chunk_samples_, 1, batch_chunks_);
}

void ChunkedWriter::flush() {
    launch(false);
    collect();
}

void ChunkedWriter::collect() {
    if (!pending_) return;
    std::unique_ptr<Batch> b = std::move(pending_);
    b->wait();
    for (std::uint64_t i = 0; i < b->chunks; ++i)
        if (b->errors[i]) std::rethrow_exception(b->errors[i]);
    for (std::uint64_t i = 0; i < b->chunks; ++i) {
        write_all(fd_.get(), b->frames[i].get(), b->sizes[i], -1, path_);
        hash_.update(b->frames[i].get(), b->sizes[i]);
        entries_.push_back({file_bytes_, b->sizes[i], b->sums[i]});
        file_bytes_ += b->sizes[i];
    }
    written_ += b->samples;
    spare_ = std::move(b);
}

void ChunkedWriter::launch(bool include_partial) {
    collect();
    const std::uint64_t full = buffered_samples_ / chunk_samples_;
    const std::uint64_t rest = buffered_samples_ % chunk_samples_;
    const std::uint64_t n = full + (include_partial && rest > 0);
    if (n == 0) return;
    std::unique_ptr<Batch> b = spare_ ? std::move(spare_) : std::make_unique<Batch>();
    const std::uint64_t taken = n == full ? full * chunk_samples_ : buffered_samples_;
    b->data.clear();
    std::swap(b->data, buffer_); // the batch takes the samples; the buffer reuses the old storage
    const std::uint64_t left = buffered_samples_ - taken;
    buffer_.insert(buffer_.end(), b->data.begin() + static_cast<std::ptrdiff_t>(taken * sample_bytes_), b->data.end());
    buffered_samples_ = left;
    b->chunks = n;
    b->samples = taken;
    b->chunk_bytes = chunk_samples_ * sample_bytes_;
    b->last_bytes = n == full ? b->chunk_bytes : rest * sample_bytes_;
    b->frames.resize(std::max<std::size_t>(b->frames.size(), n));
    b->caps.resize(b->frames.size(), 0);
    b->sizes.assign(n, 0);
    b->sums.assign(n, 0);
    b->errors.assign(n, nullptr);
    b->left = n;
    const int level = level_;
    const std::string where = path_.string();
    Batch* raw = b.get();
    pending_ = std::move(b);
    for (std::uint64_t i = 0; i < n; ++i) {
        pool_->submit([raw, i, level, where] {
            Batch& bt = *raw;
            try {
                throw_if_interrupted(); // a batch at a high level can take seconds
                const std::uint64_t bytes = i + 1 < bt.chunks ? bt.chunk_bytes : bt.last_bytes;
                const std::size_t bound = ZSTD_compressBound(bytes);
                if (bt.caps[i] < bound) {
                    bt.frames[i].reset(new std::uint8_t[bound]);
                    bt.caps[i] = bound;
                }
                const std::size_t r = ZSTD_compress2(thread_cctx(level), bt.frames[i].get(), bt.caps[i],
                                                     bt.data.data() + i * bt.chunk_bytes, bytes);
                if (ZSTD_isError(r))
                    throw runtime_error(where + ": zstd compression failed (" + ZSTD_getErrorName(r) + ")");
                bt.sizes[i] = r;
                bt.sums[i] = xxh64(bt.frames[i].get(), r);
            } catch (...) {
                bt.errors[i] = std::current_exception();
            }
            std::lock_guard lock(bt.m);
            if (--bt.left == 0) bt.cv.notify_all();
        });
    }
}

std::string ChunkedWriter::finish() {
    launch(true);
    collect();
    ChunkIndex ix;
    ix.samples = written_;
    ix.sample_bytes = sample_bytes_;
    ix.chunk_samples = chunk_samples_;
    ix.chunks = entries_;
    const auto frame = serialize_chunk_index(ix);
    write_all(fd_.get(), frame.data(), frame.size(), -1, path_);
    hash_.update(frame.data(), frame.size());
    file_bytes_ += frame.size();
    if (::close(fd_.release()) != 0) throw_errno("cannot close", path_.string());
    return hash_.hex();
}

int zstd_min_level() {
    return ZSTD_minCLevel();
}
int zstd_max_level() {
    return ZSTD_maxCLevel();
}

} // namespace dstk
