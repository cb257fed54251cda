#include "dstk/field_reader.hpp"
#include "clock.hpp"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <condition_variable>
#include <cstdlib>
#include <cstring>
#include <map>
#include <utility>
#include <vector>

#include "dstk/atomic_output.hpp"
#include "dstk/checksum.hpp"
#include "dstk/chunked_file.hpp"
#include "dstk/error.hpp"
#include "dstk/fd.hpp"
#include "dstk/npy.hpp"
#include "direct_io.hpp"

namespace fs = std::filesystem;

namespace dstk {
namespace {

using data::Clock;
using data::seconds_since;

constexpr std::uint64_t direct_piece = 4ull << 20; // bytes of samples per O_DIRECT read of a gather
const std::string redo = "; re-create the dataset (dsgen/dsconvert) or restore the file";

// One file of a field: the whole field, or one of its parts, with what the
// manifest says of it and where its samples start in the field.
struct FileSpec {
    fs::path path;
    std::string where; // the path, and for a part which part of which field
    std::uint64_t first = 0, samples = 0, bytes = 0;
    std::string checksum;
};

std::vector<FileSpec> field_files(const fs::path& dir, const SplitInfo& split, const FieldInfo& field) {
    if (field.parts.empty())
        return {FileSpec{dir / field.file, (dir / field.file).string(), 0, split.samples, field.bytes, field.checksum}};
    std::vector<FileSpec> files;
    std::uint64_t first = 0;
    for (std::size_t i = 0; i < field.parts.size(); ++i) {
        const FieldPart& p = field.parts[i];
        const fs::path path = dir / p.file;
        files.push_back({path,
                         path.string() + " (part " + std::to_string(i + 1) + " of " +
                             std::to_string(field.parts.size()) + " of field '" + field.name + "' of split '" +
                             split.name + "')",
                         first, p.samples, p.bytes, p.checksum});
        first += p.samples;
    }
    if (first != split.samples)
        throw runtime_error((dir / manifest_file_name).string() + ": the parts of field '" + field.name +
                            "' of split '" + split.name + "' hold " + std::to_string(first) +
                            " samples but the split has " + std::to_string(split.samples) +
                            " (manifest edited or a part list incomplete?); re-run dsconvert --merge");
    return files;
}

// Opens one file of a field; a missing part is named as such.
UniqueFd open_field_file(const FileSpec& f) {
    UniqueFd fd = try_open_input_file(f.path, "dataset file");
    if (!fd)
        throw runtime_error("cannot open dataset file " + f.where + " (" + std::strerror(errno) +
                            "); restore the file or re-create the dataset");
    return fd;
}

void check_file_bytes(std::uint64_t size, const FileSpec& f) {
    if (size != f.bytes)
        throw runtime_error(f.where + ": file has " + std::to_string(size) + " bytes but " + manifest_file_name +
                            " says " + std::to_string(f.bytes) + (size < f.bytes ? " (file truncated?)" : "") + redo);
}

// For readers that open the file themselves: the errors open_field_file and
// check_file_bytes give, before the file's own parser reads a truncated tail.
void require_file(const FileSpec& f) {
    struct stat st {};
    if (::stat(f.path.c_str(), &st) != 0)
        throw runtime_error("cannot open dataset file " + f.where + " (" + std::strerror(errno) +
                            "); restore the file or re-create the dataset");
    require_regular_file(st.st_mode, f.path, "dataset file");
    check_file_bytes(static_cast<std::uint64_t>(st.st_size), f);
}

// Size and checksum of one file against the manifest, re-reading it.
void verify_file(const FileSpec& f) {
    std::error_code ec;
    const auto size = fs::file_size(f.path, ec);
    if (ec) throw runtime_error("cannot stat " + f.where + " (" + ec.message() + "); restore the file");
    if (size != f.bytes)
        throw runtime_error(f.where + ": file has " + std::to_string(size) + " bytes but the manifest says " +
                            std::to_string(f.bytes) + "; re-create the dataset");
    if (f.checksum.empty()) return;
    const std::string sum = file_checksum(f.path);
    if (sum != f.checksum)
        throw runtime_error(f.where + ": checksum " + sum + " does not match the manifest's " + f.checksum +
                            " (file corrupted or modified); re-create the dataset");
}

// What the storages share: the files in sample order and the walk of a range
// of samples over them.
class FilesReader : public FieldReader {
  protected:
    FilesReader(std::vector<FileSpec> files, const FieldInfo& field, std::uint64_t samples)
        : FieldReader(files.at(0).path, field, samples), files_(std::move(files)) {}

    // fn(file, first sample in the file, samples, samples of the range before
    // them) for each file that [first, first + count) touches, in order.
    template <class Fn> void pieces(std::uint64_t first, std::uint64_t count, Fn&& fn) const {
        std::size_t i = file_of(first);
        std::uint64_t done = 0;
        while (done < count) {
            const FileSpec& f = files_[i];
            const std::uint64_t in = first + done - f.first, n = std::min(count - done, f.samples - in);
            if (n > 0) fn(i, in, n, done);
            done += n;
            ++i;
        }
    }
    std::size_t file_of(std::uint64_t sample) const {
        const auto it = std::upper_bound(files_.begin(), files_.end(), sample,
                                         [](std::uint64_t s, const FileSpec& f) { return s < f.first; });
        return static_cast<std::size_t>(it - files_.begin()) - 1;
    }

    std::vector<FileSpec> files_;
};

// Reads .npy storage with pread: no mmap, so a file that shrinks under us
// gives an error, not a SIGBUS.
class NpyFieldReader final : public FilesReader {
  public:
    NpyFieldReader(std::vector<FileSpec> files, const FieldInfo& field, std::uint64_t samples)
        : FilesReader(std::move(files), field, samples) {
        for (const FileSpec& f : files_) {
            File file{open_field_file(f), {}, 0};
            file.data_offset = validate(file.fd.get(), f);
            open_.push_back(std::move(file));
        }
    }

    void read(std::uint64_t first, std::uint64_t count, void* dst, ThreadPool*) const override {
        check_range(first, count);
        auto* out = static_cast<std::uint8_t*>(dst);
        pieces(first, count, [&](std::size_t i, std::uint64_t in, std::uint64_t n, std::uint64_t done) {
            read_all(open_[i].fd.get(), out + done * sample_bytes(), n * sample_bytes(), offset_of(i, in),
                     files_[i].path);
        });
    }

    void verify(ThreadPool*) const override {
        for (const FileSpec& f : files_) verify_file(f);
    }

    bool direct() const override { return direct_on_.load() && has_direct_ && !buffered_.load(); }
    void set_direct(bool on, const Message& notice, const Message& warn) override;

    std::uint64_t range_buffer_bytes(std::uint64_t count) const override {
        return count * sample_bytes() + (direct() ? 2 * direct_align : 0);
    }

    std::uint64_t read_range(std::uint64_t first, std::uint64_t count, std::uint8_t* buf) override {
        check_range(first, count);
        const std::size_t i = file_of(first);
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
        pieces(first, count, [&](std::size_t k, std::uint64_t in_k, std::uint64_t n, std::uint64_t done) {
            read_piece(k, buf + done * sample_bytes(), n * sample_bytes(), offset_of(k, in_k));
        });
        return 0;
    }

    void drop_pages(std::uint64_t first, std::uint64_t count) override {
        if (direct()) return;
        pieces(first, count, [&](std::size_t i, std::uint64_t in, std::uint64_t n, std::uint64_t) {
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
            pieces(indices[i], j - i, [&](std::size_t k, std::uint64_t in, std::uint64_t n, std::uint64_t done) {
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
            pieces(c * chunk_samples, n, [&](std::size_t i, std::uint64_t in, std::uint64_t m, std::uint64_t) {
                ::posix_fadvise(open_[i].fd.get(), static_cast<off_t>(offset_of(i, in)),
                                static_cast<off_t>(m * sample_bytes()), POSIX_FADV_WILLNEED);
            });
        }
    }

  private:
    static constexpr std::uint64_t bounce_bytes = direct_piece + 2 * direct_align;
    struct File {
        UniqueFd fd, dfd; // dfd: O_DIRECT, opened by set_direct
        std::uint64_t data_offset = 0;
    };

    std::uint64_t validate(int fd, const FileSpec& f) const;
    bool probe_direct(const Message& notice);
    long long offset_of(std::size_t i, std::uint64_t sample) const {
        return static_cast<long long>(open_[i].data_offset + sample * sample_bytes());
    }
    // [offset, offset + bytes) of file i into dst: O_DIRECT through bounce
    // buffers when direct, else one buffered read.
    void read_piece(std::size_t i, std::uint8_t* dst, std::uint64_t bytes, long long offset) {
        if (direct()) {
            read_direct(i, dst, bytes, static_cast<std::uint64_t>(offset));
        } else { // read_all names the file and reports a short read when the file shrank.
            read_all(open_[i].fd.get(), dst, bytes, offset, files_[i].path);
            count_read(bytes);
        }
    }

    AlignedBuffer take_buffer();
    void give_buffer(AlignedBuffer b);
    void fall_back(int err);
    bool pread_direct(std::size_t i, std::uint8_t* buf, std::uint64_t start, std::uint64_t len, std::uint64_t need);
    void read_direct(std::size_t i, std::uint8_t* dst, std::uint64_t bytes, std::uint64_t offset);

    std::vector<File> open_;
    std::mutex direct_mutex_;                              // set_direct
    std::atomic<bool> direct_on_{false}, buffered_{false}; // buffered_: O_DIRECT was refused mid-run
    std::atomic<bool> has_direct_{false};
    bool probed_ = false;
    Message warn_;
    std::mutex pool_mutex_;
    std::vector<AlignedBuffer> pool_;
};

std::uint64_t NpyFieldReader::validate(int fd, const FileSpec& f) const {
    const FieldInfo& field = info();
    struct stat st {};
    if (::fstat(fd, &st) != 0) throw_errno("cannot stat", f.where);
    const auto size = static_cast<std::uint64_t>(st.st_size);
    check_file_bytes(size, f);
    const NpyHeader h = read_npy_header_fd(fd, f.where);
    const bool dtype_ok = h.dtype == field.dtype || (field.dtype == DType::bf16 && h.dtype == DType::u16);
    if (!dtype_ok)
        throw runtime_error(f.where + ": .npy dtype '" + h.descr + "' disagrees with " + manifest_file_name + " (" +
                            std::string(dtype_name(field.dtype)) + ")" + redo);
    if (h.big_endian || h.fortran_order)
        throw runtime_error(f.where + ": dataset .npy files must be little-endian and C order" + redo);
    std::vector<std::uint64_t> expect{f.samples};
    expect.insert(expect.end(), field.shape.dims.begin(), field.shape.dims.end());
    if (h.shape != expect) {
        Shape got{std::vector<std::uint64_t>(h.shape.begin(), h.shape.end())};
        Shape want{expect};
        throw runtime_error(f.where + ": .npy shape " + got.str() + " disagrees with " + manifest_file_name + " (" +
                            want.str() + ": " + std::to_string(f.samples) + " samples of " + field.shape.str() + ")" +
                            redo);
    }
    const std::uint64_t data = checked_sample_total(field, f.samples);
    if (h.data_offset + data != size)
        throw runtime_error(f.where + ": header and data size disagree with the file size (" +
                            std::to_string(h.data_offset) + " + " + std::to_string(data) +
                            " != " + std::to_string(size) + ")" + redo);
    return h.data_offset;
}

void NpyFieldReader::set_direct(bool on, const Message& notice, const Message& warn) {
    std::lock_guard lock(direct_mutex_);
    if (on) {
        warn_ = warn ? warn : notice;
        if (!probed_) has_direct_ = probe_direct(notice);
    }
    direct_on_ = on;
}

// Opens the O_DIRECT descriptors and proves each with one aligned read; on
// refusal (EINVAL: the filesystem has no O_DIRECT) keeps the page cache.
bool NpyFieldReader::probe_direct(const Message& notice) {
    probed_ = true;
    for (std::size_t i = 0; i < files_.size(); ++i) {
        int err = 0;
        open_[i].dfd = open_direct(files_[i].path, files_[i].where, &err);
        if (open_[i].dfd) continue;
        for (File& f : open_) f.dfd.reset();
        if (notice)
            notice("--direct: the filesystem of " + files_[i].where + " refuses O_DIRECT (" + std::strerror(err) +
                   "): reading it through the page cache");
        return false;
    }
    return true;
}

AlignedBuffer NpyFieldReader::take_buffer() {
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

void NpyFieldReader::give_buffer(AlignedBuffer b) {
    std::lock_guard lock(pool_mutex_);
    pool_.push_back(std::move(b));
}

// From now on, reads of this field go through the page cache: an O_DIRECT
// read was refused after the probe passed (a filesystem that accepts O_DIRECT
// only for some ranges or sizes, or a file moved under us).
void NpyFieldReader::fall_back(int err) {
    if (buffered_.exchange(true)) return;
    const std::string line = "--direct: an O_DIRECT read of " + path().string() + " failed (" + std::strerror(err) +
                             "): reading it through the page cache from now on";
    if (warn_) warn_(line);
}

// Reads [start, start + len) (aligned) of file i with O_DIRECT into buf until
// at least `need` bytes are in; false where the filesystem refused the read
// (from then on the field is read through the page cache).
bool NpyFieldReader::pread_direct(std::size_t i, std::uint8_t* buf, std::uint64_t start, std::uint64_t len,
                                  std::uint64_t need) {
    const int refused = dstk::pread_direct(open_[i].dfd.get(), buf, start, len, need, files_[i].where);
    if (refused != 0) fall_back(refused);
    return refused == 0;
}

// [offset, offset + bytes) of file i through aligned reads of at most
// direct_piece bytes into a bounce buffer; where the filesystem refuses one
// (EINVAL), the rest through the page cache.
void NpyFieldReader::read_direct(std::size_t i, std::uint8_t* dst, std::uint64_t bytes, std::uint64_t offset) {
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

// Reads zstd-chunked storage: each file's chunk index is checked against the
// manifest at open. Gathers share decoded chunks between the reader threads:
// each chunk is decoded by the first reader that needs it while the others
// wait for it; least recently used chunks beyond the capacity are dropped once
// no reader holds them.
class ChunkedFieldReader final : public FilesReader {
  public:
    ChunkedFieldReader(std::vector<FileSpec> files, const FieldInfo& field, std::uint64_t samples)
        : FilesReader(std::move(files), field, samples) {
        for (const FileSpec& f : files_) {
            require_file(f); // names a missing or short part as such
            auto r = std::make_unique<ChunkedReader>(f.path);
            validate(*r, f);
            first_chunk_.push_back(chunks_);
            chunks_ += r->chunks();
            readers_.push_back(std::move(r));
        }
    }

    void read(std::uint64_t first, std::uint64_t count, void* dst, ThreadPool* pool) const override {
        check_range(first, count);
        auto* out = static_cast<std::uint8_t*>(dst);
        pieces(first, count, [&](std::size_t i, std::uint64_t in, std::uint64_t n, std::uint64_t done) {
            readers_[i]->read(in, n, out + done * sample_bytes(), pool);
        });
    }

    // Chunk by chunk first, so that a corruption is reported with its chunk.
    void verify(ThreadPool* pool) const override {
        for (std::size_t i = 0; i < files_.size(); ++i) {
            readers_[i]->verify(pool);
            verify_file(files_[i]);
        }
    }

    // O_DIRECT reads of each frame's 4 KiB-aligned cover, into the reading
    // thread's frame buffer (where zstd decodes it from anyway).
    void set_direct(bool on, const Message& notice, const Message& warn) override {
        std::lock_guard lock(mutex_);
        warn_ = warn ? warn : notice;
        for (std::size_t i = 0; i < readers_.size(); ++i) {
            if (readers_[i]->set_direct(on)) continue;
            for (auto& r : readers_) r->set_direct(false);
            if (notice)
                notice("--direct: the filesystem of " + files_[i].where +
                       " refuses O_DIRECT: reading it through the page cache");
            return;
        }
        direct_on_ = on;
        fell_back_ = false;
    }
    bool direct() const override {
        return direct_on_ && std::all_of(readers_.begin(), readers_.end(), [](const auto& r) { return r->direct(); });
    }
    void drop_pages(std::uint64_t first, std::uint64_t count) override {
        if (direct()) return;
        pieces(first, count, [&](std::size_t i, std::uint64_t in, std::uint64_t n, std::uint64_t) {
            readers_[i]->drop_pages(in, n);
        });
    }
    void set_decoded_chunks(std::uint64_t n) override {
        std::lock_guard lock(mutex_);
        capacity_ = std::max<std::uint64_t>(n, 2);
    }

    // A whole storage chunk is decoded straight into buf; other ranges (and
    // ranges across parts) through each file's own assembly.
    // Counts the frames' bytes as read and only zstd's time as decoding.
    std::uint64_t read_range(std::uint64_t first, std::uint64_t count, std::uint8_t* buf) override {
        check_range(first, count);
        ChunkedReader::Cost cost;
        pieces(first, count, [&](std::size_t i, std::uint64_t in, std::uint64_t n, std::uint64_t done) {
            const ChunkedReader& r = *readers_[i];
            const std::uint64_t c = in / r.chunk_samples();
            std::uint8_t* to = buf + done * sample_bytes();
            if (in % r.chunk_samples() == 0 && c < r.chunks() && n * sample_bytes() == r.chunk_bytes(c))
                r.read_chunk(c, to, &cost);
            else
                r.read(in, n, to, nullptr, &cost);
        });
        count_read(cost.bytes);
        count_decode(cost.decode_seconds);
        warn_if_fell_back();
        return 0;
    }

    void gather(std::span<const std::uint64_t> indices, std::uint8_t* dst) override {
        const std::uint64_t sb = sample_bytes();
        std::uint64_t held_chunk = ~std::uint64_t{0};
        Buffer held;
        for (std::size_t i = 0; i < indices.size(); ++i) {
            check_range(indices[i], 1);
            const std::size_t f = file_of(indices[i]);
            const std::uint64_t in = indices[i] - files_[f].first, cs = readers_[f]->chunk_samples();
            const std::uint64_t c = first_chunk_[f] + in / cs;
            if (c != held_chunk) {
                held = chunk(f, in / cs);
                held_chunk = c;
            }
            std::memcpy(dst + i * sb, held->data() + (in % cs) * sb, sb);
        }
    }

  private:
    using Buffer = std::shared_ptr<const std::vector<std::uint8_t>>;
    struct Entry {
        Buffer data; // null while being decoded
        std::uint64_t used = 0;
    };

    void validate(const ChunkedReader& r, const FileSpec& f) const {
        const FieldInfo& field = info();
        check_file_bytes(r.file_bytes(), f);
        if (r.samples() != f.samples || r.sample_bytes() != field.sample_bytes() ||
            r.chunk_samples() != field.chunk_samples)
            throw runtime_error(f.where + ": chunk index (" + std::to_string(r.samples()) + " samples of " +
                                std::to_string(r.sample_bytes()) + " bytes, " + std::to_string(r.chunk_samples()) +
                                " per chunk) disagrees with " + manifest_file_name + " (" + std::to_string(f.samples) +
                                " samples of " + std::to_string(field.sample_bytes()) + " bytes, " +
                                std::to_string(field.chunk_samples) + " per chunk)" + redo);
    }

    Buffer chunk(std::size_t f, std::uint64_t c_in_file);
    void evict();

    // An O_DIRECT read refused after set_direct's probe (the reader fell back
    // to the page cache): said once.
    void warn_if_fell_back() {
        if (!direct_on_ || direct() || fell_back_.exchange(true)) return;
        std::lock_guard lock(mutex_);
        if (warn_)
            warn_("--direct: an O_DIRECT read of " + path().string() +
                  " was refused: reading it through the page cache from now on");
    }

    std::vector<std::unique_ptr<ChunkedReader>> readers_;
    std::atomic<bool> direct_on_{false}, fell_back_{false};
    Message warn_;
    std::vector<std::uint64_t> first_chunk_; // of each file, in the field's chunks
    std::uint64_t chunks_ = 0;
    std::mutex mutex_;
    std::uint64_t capacity_ = 2;
    std::condition_variable decoded_;
    std::map<std::uint64_t, Entry> entries_;
    std::map<std::uint64_t, std::string> failed_;
    std::uint64_t clock_ = 0;
};

ChunkedFieldReader::Buffer ChunkedFieldReader::chunk(std::size_t f, std::uint64_t c_in_file) {
    const std::uint64_t c = first_chunk_[f] + c_in_file;
    std::unique_lock lock(mutex_);
    for (;;) {
        auto it = entries_.find(c);
        if (it == entries_.end()) break;
        if (it->second.data) {
            it->second.used = ++clock_;
            return it->second.data;
        }
        decoded_.wait(lock);
        if (failed_.count(c)) throw runtime_error(failed_.at(c));
    }
    entries_[c] = Entry{nullptr, ++clock_};
    lock.unlock();
    auto buf = std::make_shared<std::vector<std::uint8_t>>(readers_[f]->chunk_bytes(c_in_file));
    ChunkedReader::Cost cost;
    try {
        readers_[f]->read_chunk(c_in_file, buf->data(), &cost);
        count_read(cost.bytes);
    } catch (const std::exception& e) {
        lock.lock();
        entries_.erase(c);
        failed_[c] = e.what();
        decoded_.notify_all();
        throw;
    }
    count_decode(cost.decode_seconds);
    warn_if_fell_back();
    lock.lock();
    entries_[c].data = buf;
    evict();
    decoded_.notify_all();
    return buf;
}

void ChunkedFieldReader::evict() {
    while (entries_.size() > capacity_) {
        auto victim = entries_.end();
        for (auto it = entries_.begin(); it != entries_.end(); ++it)
            if (it->second.data && (victim == entries_.end() || it->second.used < victim->second.used)) victim = it;
        if (victim == entries_.end()) return;
        entries_.erase(victim);
    }
}

} // namespace

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

void FieldReader::check_range(std::uint64_t first, std::uint64_t count) const {
    if (first > samples_ || count > samples_ - first)
        throw runtime_error("read of samples [" + std::to_string(first) + ", " + std::to_string(first + count) +
                            ") is outside '" + path_.string() + "' (" + std::to_string(samples_) + " samples)");
}

void FieldReader::count_read(std::uint64_t bytes) {
    std::lock_guard lock(stats_mutex_);
    io_.add(bytes);
}

void FieldReader::count_decode(double seconds) {
    std::lock_guard lock(stats_mutex_);
    decode_seconds_ += seconds;
}

IoCounters FieldReader::take_io() {
    std::lock_guard lock(stats_mutex_);
    return std::exchange(io_, {});
}

double FieldReader::take_decode_seconds() {
    std::lock_guard lock(stats_mutex_);
    return std::exchange(decode_seconds_, 0.0);
}

std::unique_ptr<FieldReader> open_field_reader(const fs::path& dir, const SplitInfo& split, const FieldInfo& field) {
    std::vector<FileSpec> files = field_files(dir, split, field);
    switch (field.storage) {
    case Storage::npy:
        return std::make_unique<NpyFieldReader>(std::move(files), field, split.samples);
    case Storage::zstd_chunked:
        return std::make_unique<ChunkedFieldReader>(std::move(files), field, split.samples);
    }
    throw runtime_error(files.front().where + ": unknown storage");
}

} // namespace dstk
