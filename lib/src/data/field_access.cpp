#include "field_access.hpp"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <condition_variable>
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

class NpyAccess final : public FieldAccess {
  public:
    NpyAccess(fs::path path, std::uint64_t samples, std::uint64_t sample_bytes)
        : FieldAccess(samples, sample_bytes), path_(std::move(path)) {
        fd_ = ::open(path_.c_str(), O_RDONLY | O_CLOEXEC);
        if (fd_ < 0) throw_errno("cannot open dataset file", path_.string());
        try {
            data_offset_ = read_npy_header_fd(fd_, path_.string()).data_offset;
        } catch (...) {
            ::close(fd_);
            throw;
        }
    }
    ~NpyAccess() override { ::close(fd_); }

    std::uint64_t storage_chunk_samples() const override { return 0; }
    std::uint64_t cache_bytes() const override { return 0; }

    void gather(std::span<const std::uint64_t> indices, std::uint8_t* dst) override {
        const std::uint64_t sb = sample_bytes();
        std::size_t i = 0;
        while (i < indices.size()) {
            std::size_t j = i + 1;
            while (j < indices.size() && indices[j] == indices[j - 1] + 1) ++j;
            if (indices[j - 1] >= samples())
                throw runtime_error("sample " + std::to_string(indices[j - 1]) + " is outside '" + path_.string() +
                                    "' (" + std::to_string(samples()) + " samples)");
            // read_all names the file and reports a short read when the file shrank.
            read_all(fd_, dst + i * sb, (j - i) * sb, static_cast<long long>(data_offset_ + indices[i] * sb), path_);
            i = j;
        }
    }

    void will_need(std::span<const std::uint64_t> chunks, std::uint64_t chunk_samples) override {
        const std::uint64_t sb = sample_bytes();
        for (const std::uint64_t c : chunks)
            ::posix_fadvise(fd_, static_cast<off_t>(data_offset_ + c * chunk_samples * sb),
                            static_cast<off_t>(chunk_samples * sb), POSIX_FADV_WILLNEED);
    }

  private:
    fs::path path_;
    int fd_ = -1;
    std::uint64_t data_offset_ = 0;
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
};

} // namespace

std::unique_ptr<FieldAccess> open_field_access(const fs::path& dataset_dir, const SplitInfo& split,
                                               const FieldInfo& field, std::uint64_t cache_chunks) {
    const fs::path path = dataset_dir / field.file;
    switch (field.storage) {
    case Storage::npy:
        return std::make_unique<NpyAccess>(path, split.samples, field.sample_bytes());
    case Storage::zstd_chunked:
        return std::make_unique<ChunkedAccess>(path, split.samples, field.sample_bytes(), cache_chunks);
    }
    throw runtime_error(path.string() + ": unknown storage");
}

} // namespace dstk::data
