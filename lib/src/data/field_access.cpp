#include "field_access.hpp"
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
        : FieldAccess(samples, sample_bytes), path_(std::move(path)), warn_(std::move(warn)) {
        fd_ = ::open(path_.c_str(), O_RDONLY | O_CLOEXEC);
        if (fd_ < 0) throw_errno("cannot open dataset file", path_.string());
        try {
            data_offset_ = read_npy_header_fd(fd_, path_.string()).data_offset;
            if (direct) open_direct(notice);
        } catch (...) {
            close_all();
            throw;
        }
    }
    ~NpyAccess() override { close_all(); }

    std::uint64_t storage_chunk_samples() const override { return 0; }
    std::uint64_t cache_bytes() const override {
        std::lock_guard lock(pool_mutex_);
        return buffers_made_ * bounce_bytes;
    }
    bool direct() const override { return dfd_ >= 0 && !buffered_.load(); }

    void gather(std::span<const std::uint64_t> indices, std::uint8_t* dst) override {
        const std::uint64_t sb = sample_bytes();
        std::size_t i = 0;
        while (i < indices.size()) {
            std::size_t j = i + 1;
            while (j < indices.size() && indices[j] == indices[j - 1] + 1) ++j;
            if (indices[j - 1] >= samples())
                throw runtime_error("sample " + std::to_string(indices[j - 1]) + " is outside '" + path_.string() +
                                    "' (" + std::to_string(samples()) + " samples)");
            const std::uint64_t offset = data_offset_ + indices[i] * sb;
            if (direct())
                read_direct(dst + i * sb, (j - i) * sb, offset);
            else // read_all names the file and reports a short read when the file shrank.
                read_all(fd_, dst + i * sb, (j - i) * sb, static_cast<long long>(offset), path_);
            i = j;
        }
    }

    void will_need(std::span<const std::uint64_t> chunks, std::uint64_t chunk_samples) override {
        if (direct()) return; // O_DIRECT reads do not go through the page cache
        const std::uint64_t sb = sample_bytes();
        for (const std::uint64_t c : chunks)
            ::posix_fadvise(fd_, static_cast<off_t>(data_offset_ + c * chunk_samples * sb),
                            static_cast<off_t>(chunk_samples * sb), POSIX_FADV_WILLNEED);
    }

  private:
    static constexpr std::uint64_t bounce_bytes = direct_piece + 2 * direct_align;

    void close_all() {
        if (dfd_ >= 0) ::close(dfd_);
        if (fd_ >= 0) ::close(fd_);
        dfd_ = fd_ = -1;
    }

    // Opens the O_DIRECT descriptor and proves it with one aligned read; on
    // refusal (EINVAL: the filesystem has no O_DIRECT) keeps the page cache.
    void open_direct(const std::function<void(const std::string&)>& notice) {
        const int fd = ::open(path_.c_str(), O_RDONLY | O_CLOEXEC | O_DIRECT);
        int err = fd < 0 ? errno : 0;
        if (fd >= 0) {
            AlignedBuffer probe(static_cast<std::uint8_t*>(std::aligned_alloc(direct_align, direct_align)));
            if (!probe) throw std::bad_alloc();
            if (::pread(fd, probe.get(), direct_align, 0) < 0) err = errno;
            if (err == 0) {
                dfd_ = fd;
                return;
            }
            ::close(fd);
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
            std::uint64_t got = 0;
            while (got < lead + n) {
                const ssize_t r = ::pread(dfd_, buf.get() + got, len - got, static_cast<off_t>(start + got));
                if (r < 0 && errno == EINTR) continue;
                if (r < 0 && (errno == EINVAL || errno == EOPNOTSUPP)) {
                    fall_back(errno);
                    give_buffer(std::move(buf));
                    read_all(fd_, dst, bytes, static_cast<long long>(offset), path_);
                    return;
                }
                if (r < 0) throw_errno("cannot read (O_DIRECT)", path_.string());
                if (r == 0)
                    throw runtime_error("cannot read " + path_.string() + ": it ends at byte " +
                                        std::to_string(start + got) + ", before byte " + std::to_string(offset + n) +
                                        " (the file shrank while training?) re-create or restore the dataset");
                got += static_cast<std::uint64_t>(r);
                if (got % direct_align != 0) break; // end of file: a short tail
            }
            if (got < lead + n)
                throw runtime_error("cannot read " + path_.string() + ": it ends at byte " +
                                    std::to_string(start + got) + ", before byte " + std::to_string(offset + n) +
                                    " (the file shrank while training?) re-create or restore the dataset");
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
    int fd_ = -1, dfd_ = -1;
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
