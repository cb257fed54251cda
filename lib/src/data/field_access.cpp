#include "dstk/data/field_access.hpp"
#include "clock.hpp"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <utility>
#include <atomic>
#include <condition_variable>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <map>
#include <mutex>

#include "dstk/atomic_output.hpp"
#include "dstk/chunked_file.hpp"
#include "dstk/error.hpp"
#include "dstk/fd.hpp"
#include "dstk/npy.hpp"

namespace fs = std::filesystem;

namespace dstk::data {
namespace {

constexpr std::uint64_t direct_align = 4096;
constexpr std::uint64_t direct_piece = 4ull << 20; // bytes of samples per O_DIRECT read

struct AlignedFree {
    void operator()(std::uint8_t* p) const { std::free(p); }
};
using AlignedBuffer = std::unique_ptr<std::uint8_t, AlignedFree>;

class NpyAccess final : public FieldAccess {
  public:
    NpyAccess(fs::path path, std::uint64_t samples, std::uint64_t sample_bytes, bool direct,
              const std::function<void(const std::string&)>& notice, std::function<void(const std::string&)> warn)
        : FieldAccess(samples, sample_bytes), path_(std::move(path)), warn_(std::move(warn)),
          fd_(UniqueFd::open(path_, O_RDONLY, "open dataset file")) {
        data_offset_ = read_npy_header_fd(fd_.get(), path_.string()).data_offset;
        if (direct) open_direct(notice);
    }

    std::uint64_t storage_chunk_samples() const override { return 0; }
    std::uint64_t cache_bytes() const override {
        std::lock_guard lock(pool_mutex_);
        return buffers_made_ * bounce_bytes;
    }
    bool direct() const override { return dfd_ && !buffered_.load(); }

    std::uint64_t range_buffer_bytes(std::uint64_t count) const override {
        return count * sample_bytes() + (direct() ? 2 * direct_align : 0);
    }

    std::uint64_t read_range(std::uint64_t first, std::uint64_t count, std::uint8_t* buf) override {
        check_range(first, count);
        const std::uint64_t offset = data_offset_ + first * sample_bytes(), bytes = count * sample_bytes();
        if (direct()) {
            const std::uint64_t start = offset / direct_align * direct_align, lead = offset - start;
            const std::uint64_t len = (lead + bytes + direct_align - 1) / direct_align * direct_align;
            if (pread_direct(buf, start, len, lead + bytes)) {
                count_read(len);
                return lead;
            }
        }
        read_all(fd_.get(), buf, bytes, static_cast<long long>(offset), path_);
        count_read(bytes);
        return 0;
    }

    void drop_pages(std::uint64_t first, std::uint64_t count) override {
        if (direct()) return;
        ::posix_fadvise(fd_.get(), static_cast<off_t>(data_offset_ + first * sample_bytes()),
                        static_cast<off_t>(count * sample_bytes()), POSIX_FADV_DONTNEED);
    }

    void read_ahead(bool on) override { ::posix_fadvise(fd_.get(), 0, 0, on ? POSIX_FADV_NORMAL : POSIX_FADV_RANDOM); }

    void gather(std::span<const std::uint64_t> indices, std::uint8_t* dst) override {
        const std::uint64_t sb = sample_bytes();
        std::size_t i = 0;
        while (i < indices.size()) {
            std::size_t j = i + 1;
            while (j < indices.size() && indices[j] == indices[j - 1] + 1) ++j;
            check_range(indices[j - 1], 1);
            const std::uint64_t offset = data_offset_ + indices[i] * sb;
            if (direct()) {
                read_direct(dst + i * sb, (j - i) * sb, offset);
            } else { // read_all names the file and reports a short read when the file shrank.
                read_all(fd_.get(), dst + i * sb, (j - i) * sb, static_cast<long long>(offset), path_);
                count_read((j - i) * sb);
            }
            i = j;
        }
    }

    void will_need(std::span<const std::uint64_t> chunks, std::uint64_t chunk_samples) override {
        if (direct()) return; // O_DIRECT reads do not go through the page cache
        const std::uint64_t sb = sample_bytes();
        for (const std::uint64_t c : chunks)
            ::posix_fadvise(fd_.get(), static_cast<off_t>(data_offset_ + c * chunk_samples * sb),
                            static_cast<off_t>(chunk_samples * sb), POSIX_FADV_WILLNEED);
    }

  private:
    static constexpr std::uint64_t bounce_bytes = direct_piece + 2 * direct_align;

    void check_range(std::uint64_t first, std::uint64_t count) const {
        if (first + count > samples())
            throw runtime_error("sample " + std::to_string(first + count - 1) + " is outside '" + path_.string() +
                                "' (" + std::to_string(samples()) + " samples)");
    }

    // Opens the O_DIRECT descriptor and proves it with one aligned read; on
    // refusal (EINVAL: the filesystem has no O_DIRECT) keeps the page cache.
    void open_direct(const std::function<void(const std::string&)>& notice) {
        UniqueFd fd = UniqueFd::try_open(path_, O_RDONLY | O_DIRECT);
        int err = fd ? 0 : errno;
        if (fd) {
            AlignedBuffer probe(static_cast<std::uint8_t*>(std::aligned_alloc(direct_align, direct_align)));
            if (!probe) throw std::bad_alloc();
            if (::pread(fd.get(), probe.get(), direct_align, 0) < 0) err = errno;
            if (err == 0) {
                dfd_ = std::move(fd);
                return;
            }
        }
        if (err != EINVAL && err != EOPNOTSUPP) throw_errno("cannot open with O_DIRECT", path_.string());
        if (notice)
            notice("--direct: the filesystem of " + path_.string() + " refuses O_DIRECT (" + std::strerror(err) +
                   "): reading it through the page cache");
    }

    AlignedBuffer take_buffer() {
        {
            std::lock_guard lock(pool_mutex_);
            if (!pool_.empty()) {
                AlignedBuffer b = std::move(pool_.back());
                pool_.pop_back();
                return b;
            }
            ++buffers_made_;
        }
        AlignedBuffer b(static_cast<std::uint8_t*>(std::aligned_alloc(direct_align, bounce_bytes)));
        if (!b) throw std::bad_alloc();
        return b;
    }
    void give_buffer(AlignedBuffer b) {
        std::lock_guard lock(pool_mutex_);
        pool_.push_back(std::move(b));
    }

    // From now on, reads of this file go through the page cache: an O_DIRECT
    // read was refused after the probe passed (a filesystem that accepts
    // O_DIRECT only for some ranges or sizes, or a file moved under us).
    void fall_back(int err) {
        if (buffered_.exchange(true)) return;
        const std::string line = "--direct: an O_DIRECT read of " + path_.string() + " failed (" + std::strerror(err) +
                                 "): reading it through the page cache from now on";
        if (warn_) warn_(line);
    }

    // Reads [start, start + len) (aligned) with O_DIRECT into buf until at
    // least `need` bytes are in; false where the filesystem refused the read
    // (from then on the file is read through the page cache). Errors name the
    // file; a file that ends before `need` shrank under us.
    bool pread_direct(std::uint8_t* buf, std::uint64_t start, std::uint64_t len, std::uint64_t need) {
        std::uint64_t got = 0;
        while (got < need) {
            const ssize_t r = ::pread(dfd_.get(), buf + got, len - got, static_cast<off_t>(start + got));
            if (r < 0 && errno == EINTR) continue;
            if (r < 0 && (errno == EINVAL || errno == EOPNOTSUPP)) {
                fall_back(errno);
                return false;
            }
            if (r < 0) throw_errno("cannot read (O_DIRECT)", path_.string());
            if (r == 0) break;
            got += static_cast<std::uint64_t>(r);
            if (got % direct_align != 0) break; // end of file: a short tail
        }
        if (got < need)
            throw runtime_error("cannot read " + path_.string() + ": it ends at byte " + std::to_string(start + got) +
                                ", before byte " + std::to_string(start + need) +
                                " (the file shrank while training?) re-create or restore the dataset");
        return true;
    }

    // [offset, offset + bytes) of the file through aligned reads of at most
    // direct_piece bytes into a bounce buffer; where the filesystem refuses
    // one (EINVAL), the rest through the page cache.
    void read_direct(std::uint8_t* dst, std::uint64_t bytes, std::uint64_t offset) {
        AlignedBuffer buf = take_buffer();
        while (bytes > 0) {
            const std::uint64_t start = offset / direct_align * direct_align;
            const std::uint64_t lead = offset - start;
            const std::uint64_t n = std::min(bytes, direct_piece);
            const std::uint64_t len = (lead + n + direct_align - 1) / direct_align * direct_align;
            if (!pread_direct(buf.get(), start, len, lead + n)) {
                give_buffer(std::move(buf));
                read_all(fd_.get(), dst, bytes, static_cast<long long>(offset), path_);
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

    fs::path path_;
    std::function<void(const std::string&)> warn_;
    std::atomic<bool> buffered_{false}; // O_DIRECT was refused mid-run
    UniqueFd fd_, dfd_;
    std::uint64_t data_offset_ = 0;
    mutable std::mutex pool_mutex_;
    std::vector<AlignedBuffer> pool_;
    std::uint64_t buffers_made_ = 0;
};

// Decoded chunks shared by the reader threads: each chunk is decoded by the
// first reader that needs it while the others wait for it; least recently
// used chunks beyond the capacity are dropped once no reader holds them.
class ChunkedAccess final : public FieldAccess {
  public:
    ChunkedAccess(const fs::path& path, std::uint64_t samples, std::uint64_t sample_bytes, std::uint64_t capacity)
        : FieldAccess(samples, sample_bytes), reader_(path), capacity_(std::max<std::uint64_t>(capacity, 2)) {
        if (reader_.samples() != samples || reader_.sample_bytes() != sample_bytes)
            throw runtime_error(path.string() + ": chunk index holds " + std::to_string(reader_.samples()) +
                                " samples of " + std::to_string(reader_.sample_bytes()) + " bytes but " +
                                manifest_file_name + " says " + std::to_string(samples) + " of " +
                                std::to_string(sample_bytes) + "; re-create the dataset");
    }

    std::uint64_t storage_chunk_samples() const override { return reader_.chunk_samples(); }
    std::uint64_t cache_bytes() const override { return capacity_ * reader_.max_chunk_bytes(); }

    void gather(std::span<const std::uint64_t> indices, std::uint8_t* dst) override {
        const std::uint64_t sb = sample_bytes(), cs = reader_.chunk_samples();
        std::uint64_t held_chunk = ~std::uint64_t{0};
        std::shared_ptr<const std::vector<std::uint8_t>> held;
        for (std::size_t i = 0; i < indices.size(); ++i) {
            if (indices[i] >= samples())
                throw runtime_error("sample " + std::to_string(indices[i]) + " is outside '" + reader_.path().string() +
                                    "'");
            const std::uint64_t c = indices[i] / cs;
            if (c != held_chunk) {
                held = chunk(c);
                held_chunk = c;
            }
            std::memcpy(dst + i * sb, held->data() + (indices[i] - c * cs) * sb, sb);
        }
    }

    void will_need(std::span<const std::uint64_t>, std::uint64_t) override {}

    // A whole storage chunk is decoded straight into buf; other ranges
    // through the reader's own assembly.
    std::uint64_t read_range(std::uint64_t first, std::uint64_t count, std::uint8_t* buf) override {
        const auto t0 = Clock::now();
        const std::uint64_t cs = reader_.chunk_samples(), c = first / cs;
        if (first % cs == 0 && c < reader_.chunks() && count * sample_bytes() == reader_.chunk_bytes(c))
            reader_.read_chunk(c, buf);
        else
            reader_.read(first, count, buf);
        count_read(count * sample_bytes());
        std::lock_guard lock(mutex_);
        decode_seconds_ += seconds_since(t0);
        return 0;
    }

    double take_decode_seconds() override {
        std::lock_guard lock(mutex_);
        return std::exchange(decode_seconds_, 0.0);
    }

  private:
    using Buffer = std::shared_ptr<const std::vector<std::uint8_t>>;
    struct Entry {
        Buffer data; // null while being decoded
        std::uint64_t used = 0;
    };

    Buffer chunk(std::uint64_t c) {
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
        auto buf = std::make_shared<std::vector<std::uint8_t>>(reader_.chunk_bytes(c));
        const auto t0 = Clock::now();
        try {
            reader_.read_chunk(c, buf->data());
            count_read(buf->size());
        } catch (const std::exception& e) {
            lock.lock();
            entries_.erase(c);
            failed_[c] = e.what();
            decoded_.notify_all();
            throw;
        }
        lock.lock();
        decode_seconds_ += seconds_since(t0);
        entries_[c].data = buf;
        evict();
        decoded_.notify_all();
        return buf;
    }

    void evict() {
        while (entries_.size() > capacity_) {
            auto victim = entries_.end();
            for (auto it = entries_.begin(); it != entries_.end(); ++it)
                if (it->second.data && (victim == entries_.end() || it->second.used < victim->second.used)) victim = it;
            if (victim == entries_.end()) return;
            entries_.erase(victim);
        }
    }

    ChunkedReader reader_;
    std::uint64_t capacity_;
    std::mutex mutex_;
    std::condition_variable decoded_;
    std::map<std::uint64_t, Entry> entries_;
    std::map<std::uint64_t, std::string> failed_;
    std::uint64_t clock_ = 0;
    double decode_seconds_ = 0;
};

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

void FieldAccess::count_read(std::uint64_t bytes) {
    std::lock_guard lock(io_mutex_);
    io_.add(bytes);
}

IoCounters FieldAccess::take_io() {
    std::lock_guard lock(io_mutex_);
    return std::exchange(io_, {});
}

std::unique_ptr<FieldAccess> open_field_access(const fs::path& dataset_dir, const SplitInfo& split,
                                               const FieldInfo& field, std::uint64_t cache_chunks, bool direct,
                                               const std::function<void(const std::string&)>& notice,
                                               const std::function<void(const std::string&)>& warn) {
    const fs::path path = dataset_dir / field.file;
    switch (field.storage) {
    case Storage::npy:
        return std::make_unique<NpyAccess>(path, split.samples, field.sample_bytes(), direct, notice,
                                           warn ? warn : notice);
    case Storage::zstd_chunked:
        if (direct && notice)
            notice("--direct: " + path.string() +
                   " is zstd-chunked: its compressed frames are read through the page cache");
        return std::make_unique<ChunkedAccess>(path, split.samples, field.sample_bytes(), cache_chunks);
    }
    throw runtime_error(path.string() + ": unknown storage");
}

} // namespace dstk::data
