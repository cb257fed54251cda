// The stream placement's reader of .npy storage (and what every storage's
// stream reader shares: opening, counters).
#include "dstk/data/stream_reader.hpp"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstring>
#include <utility>
#include <vector>

#include "direct_io.hpp"
#include "dstk/atomic_output.hpp"
#include "dstk/error.hpp"
#include "dstk/field_reader.hpp"
#include "stream_readers.hpp"

namespace dstk::data {
namespace {

constexpr std::uint64_t direct_piece = 4ull << 20; // bytes of samples per O_DIRECT read of a gather

// Reads .npy storage with pread (no mmap: a file that shrinks under us gives
// an error, not a SIGBUS), through the page cache or with O_DIRECT.
class NpyStreamReader final : public StreamReader {
  public:
    NpyStreamReader(std::vector<FileSpec> files, const FieldInfo& field, std::uint64_t samples, const StreamSettings& s)
        : StreamReader(files.at(0).path, field, samples), files_(std::move(files)), warn_(s.warn ? s.warn : s.notice),
          setting_(spell(s.names, "direct")) {
        for (const FileSpec& f : files_.files()) {
            File file{open_field_file(f, O_RDONLY), {}, 0};
            file.data_offset = validate_npy_file(file.fd.get(), f, field);
            open_.push_back(std::move(file));
        }
        if (s.direct) direct_ = open_direct_files(s.notice);
    }

    bool direct() const override { return direct_ && !buffered_.load(); }

    std::uint64_t range_buffer_bytes(std::uint64_t count) const override {
        return count * sample_bytes() + (direct() ? 2 * direct_align : 0);
    }

    std::uint64_t read_range(std::uint64_t first, std::uint64_t count, std::uint8_t* buf) override {
        check_range(first, count);
        const std::size_t i = files_.file_of(first);
        const std::uint64_t in = first - files_[i].first;
        if (direct() && in + count <= files_[i].samples) { // one file: one aligned read straight into buf
            const std::uint64_t offset = offset_of(i, in), bytes = count * sample_bytes();
            const std::uint64_t start = offset / direct_align * direct_align, lead = offset - start;
            const std::uint64_t len = (lead + bytes + direct_align - 1) / direct_align * direct_align;
            if (pread_direct(i, buf, start, len, lead + bytes)) {
                count_read(len);
                return lead;
            }
        }
        // Several files (a range across parts): each piece lands at its place in buf.
        files_.each(first, count, [&](std::size_t k, std::uint64_t in_k, std::uint64_t n, std::uint64_t done) {
            read_piece(k, buf + done * sample_bytes(), n * sample_bytes(), offset_of(k, in_k));
        });
        return 0;
    }

    void drop_pages(std::uint64_t first, std::uint64_t count) override {
        if (direct()) return;
        files_.each(first, count, [&](std::size_t i, std::uint64_t in, std::uint64_t n, std::uint64_t) {
            ::posix_fadvise(open_[i].fd.get(), static_cast<off_t>(offset_of(i, in)),
                            static_cast<off_t>(n * sample_bytes()), POSIX_FADV_DONTNEED);
        });
    }

    void read_ahead(bool on) override {
        for (const File& f : open_) ::posix_fadvise(f.fd.get(), 0, 0, on ? POSIX_FADV_NORMAL : POSIX_FADV_RANDOM);
    }

    void gather(std::span<const std::uint64_t> indices, std::uint8_t* dst) override {
        const std::uint64_t sb = sample_bytes();
        std::size_t i = 0;
        while (i < indices.size()) {
            std::size_t j = i + 1;
            while (j < indices.size() && indices[j] == indices[j - 1] + 1) ++j;
            check_range(indices[i], j - i);
            files_.each(indices[i], j - i, [&](std::size_t k, std::uint64_t in, std::uint64_t n, std::uint64_t done) {
                read_piece(k, dst + (i + done) * sb, n * sb, offset_of(k, in));
            });
            i = j;
        }
    }

    void will_need(std::span<const std::uint64_t> chunks, std::uint64_t chunk_samples) override {
        if (direct()) return; // O_DIRECT reads do not go through the page cache
        for (const std::uint64_t c : chunks) {
            if (c * chunk_samples >= samples()) continue;
            const std::uint64_t n = std::min(chunk_samples, samples() - c * chunk_samples);
            files_.each(c * chunk_samples, n, [&](std::size_t i, std::uint64_t in, std::uint64_t m, std::uint64_t) {
                ::posix_fadvise(open_[i].fd.get(), static_cast<off_t>(offset_of(i, in)),
                                static_cast<off_t>(m * sample_bytes()), POSIX_FADV_WILLNEED);
            });
        }
    }

  private:
    static constexpr std::uint64_t bounce_bytes = direct_piece + 2 * direct_align;
    struct File {
        UniqueFd fd, dfd; // dfd: O_DIRECT
        std::uint64_t data_offset = 0;
    };

    bool open_direct_files(const Message& notice);
    std::uint64_t offset_of(std::size_t i, std::uint64_t sample) const {
        return open_[i].data_offset + sample * sample_bytes();
    }
    // [offset, offset + bytes) of file i into dst: O_DIRECT through bounce
    // buffers when direct, else one buffered read.
    void read_piece(std::size_t i, std::uint8_t* dst, std::uint64_t bytes, std::uint64_t offset) {
        if (direct()) {
            read_direct(i, dst, bytes, offset);
        } else { // read_all names the file and reports a short read when the file shrank.
            read_all(open_[i].fd.get(), dst, bytes, static_cast<long long>(offset), files_[i].path);
            count_read(bytes);
        }
    }

    AlignedBuffer take_buffer();
    void give_buffer(AlignedBuffer b);
    void fall_back(int err);
    bool pread_direct(std::size_t i, std::uint8_t* buf, std::uint64_t start, std::uint64_t len, std::uint64_t need);
    void read_direct(std::size_t i, std::uint8_t* dst, std::uint64_t bytes, std::uint64_t offset);

    FilePieces files_;
    std::vector<File> open_;
    bool direct_ = false;               // O_DIRECT asked for and accepted at open
    std::atomic<bool> buffered_{false}; // an O_DIRECT read was refused later
    Message warn_;
    std::string setting_; // "direct", as the caller spells it
    std::mutex pool_mutex_;
    std::vector<AlignedBuffer> pool_;
};

// Opens the O_DIRECT descriptors and proves each with one aligned read; on
// refusal (EINVAL: the filesystem has no O_DIRECT) keeps the page cache.
bool NpyStreamReader::open_direct_files(const Message& notice) {
    for (std::size_t i = 0; i < files_.size(); ++i) {
        int err = 0;
        open_[i].dfd = open_direct(files_[i].path, files_[i].where, &err);
        if (open_[i].dfd) continue;
        for (File& f : open_) f.dfd.reset();
        if (notice)
            notice(setting_ + ": the filesystem of " + files_[i].where + " refuses O_DIRECT (" + std::strerror(err) +
                   "): reading it through the page cache");
        return false;
    }
    return true;
}

AlignedBuffer NpyStreamReader::take_buffer() {
    {
        std::lock_guard lock(pool_mutex_);
        if (!pool_.empty()) {
            AlignedBuffer b = std::move(pool_.back());
            pool_.pop_back();
            return b;
        }
    }
    return aligned_buffer(bounce_bytes);
}

void NpyStreamReader::give_buffer(AlignedBuffer b) {
    std::lock_guard lock(pool_mutex_);
    pool_.push_back(std::move(b));
}

// From now on, reads of this field go through the page cache: an O_DIRECT
// read was refused after the probe passed (a filesystem that accepts O_DIRECT
// only for some ranges or sizes, or a file moved under us).
void NpyStreamReader::fall_back(int err) {
    if (buffered_.exchange(true)) return;
    const std::string line = setting_ + ": an O_DIRECT read of " + path().string() + " failed (" + std::strerror(err) +
                             "): reading it through the page cache from now on";
    if (warn_) warn_(line);
}

// Reads [start, start + len) (aligned) of file i with O_DIRECT into buf until
// at least `need` bytes are in; false where the filesystem refused the read
// (from then on the field is read through the page cache).
bool NpyStreamReader::pread_direct(std::size_t i, std::uint8_t* buf, std::uint64_t start, std::uint64_t len,
                                   std::uint64_t need) {
    const int refused = dstk::pread_direct(open_[i].dfd.get(), buf, start, len, need, files_[i].where);
    if (refused != 0) fall_back(refused);
    return refused == 0;
}

// [offset, offset + bytes) of file i through aligned reads of at most
// direct_piece bytes into a bounce buffer; where the filesystem refuses one
// (EINVAL), the rest through the page cache.
void NpyStreamReader::read_direct(std::size_t i, std::uint8_t* dst, std::uint64_t bytes, std::uint64_t offset) {
    AlignedBuffer buf = take_buffer();
    while (bytes > 0) {
        const std::uint64_t start = offset / direct_align * direct_align;
        const std::uint64_t lead = offset - start;
        const std::uint64_t n = std::min(bytes, direct_piece);
        const std::uint64_t len = (lead + n + direct_align - 1) / direct_align * direct_align;
        if (!pread_direct(i, buf.get(), start, len, lead + n)) {
            give_buffer(std::move(buf));
            read_all(open_[i].fd.get(), dst, bytes, static_cast<long long>(offset), files_[i].path);
            count_read(bytes);
            return;
        }
        count_read(len);
        std::memcpy(dst, buf.get() + lead, n);
        dst += n;
        offset += n;
        bytes -= n;
    }
    give_buffer(std::move(buf));
}

} // namespace

std::unique_ptr<StreamReader> npy_stream_reader(std::vector<FileSpec> files, const FieldInfo& field,
                                                std::uint64_t samples, const StreamSettings& settings) {
    return std::make_unique<NpyStreamReader>(std::move(files), field, samples, settings);
}

std::unique_ptr<StreamReader> StreamReader::open(const Dataset& ds, std::string_view split_name,
                                                 std::string_view field_name, const StreamSettings& settings) {
    const SplitInfo& split = ds.manifest().split(split_name);
    return open(ds.dir(), split, split.field(field_name), settings);
}

std::unique_ptr<StreamReader> StreamReader::open(const std::filesystem::path& dir, const SplitInfo& split,
                                                 const FieldInfo& field, const StreamSettings& settings) {
    std::vector<FileSpec> files = field_files(dir, split, field);
    if (field.storage == Storage::zstd_chunked)
        return zstd_stream_reader(std::move(files), field, split.samples, settings);
    return npy_stream_reader(std::move(files), field, split.samples, settings);
}

void IoCounters::add(std::uint64_t n) {
    ++reads;
    bytes += n;
    smallest = smallest == 0 ? n : std::min(smallest, n);
    largest = std::max(largest, n);
}

void IoCounters::merge(const IoCounters& o) {
    reads += o.reads;
    bytes += o.bytes;
    if (o.smallest != 0) smallest = smallest == 0 ? o.smallest : std::min(smallest, o.smallest);
    largest = std::max(largest, o.largest);
}

void StreamReader::check_range(std::uint64_t first, std::uint64_t count) const {
    check_sample_range(path_, samples_, first, count);
}

void StreamReader::count_read(std::uint64_t bytes) {
    std::lock_guard lock(stats_mutex_);
    io_.add(bytes);
}

void StreamReader::count_decode(double seconds) {
    std::lock_guard lock(stats_mutex_);
    decode_seconds_ += seconds;
}

IoCounters StreamReader::take_io() {
    std::lock_guard lock(stats_mutex_);
    return std::exchange(io_, {});
}

double StreamReader::take_decode_seconds() {
    std::lock_guard lock(stats_mutex_);
    return std::exchange(decode_seconds_, 0.0);
}

} // namespace dstk::data
