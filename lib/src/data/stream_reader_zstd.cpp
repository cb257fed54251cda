// The stream placement's reader of zstd-chunked storage.
#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <cstring>
#include <map>
#include <mutex>
#include <utility>
#include <vector>

#include "dstk/error.hpp"
#include "stream_readers.hpp"

namespace dstk::data {
namespace {

// Each file read through its own ChunkedReader (its own descriptors, O_DIRECT
// on them where asked). Gathers share decoded chunks between the reader
// threads: each chunk is decoded by the first reader that needs it while the
// others wait for it; least recently used chunks beyond the capacity are
// dropped once no reader holds them.
class ZstdStreamReader final : public StreamReader {
  public:
    ZstdStreamReader(std::vector<FileSpec> files, const FieldInfo& field, std::uint64_t samples,
                     const StreamSettings& s)
        : StreamReader(files.at(0).path, field, samples), files_(std::move(files)),
          capacity_(std::max<std::uint64_t>(s.decoded_chunks, 2)), warn_(s.warn ? s.warn : s.notice),
          setting_(spell(s.names, "direct")) {
        for (const FileSpec& f : files_.files()) {
            require_file(f); // names a missing or short part as such
            first_chunk_.push_back(chunks_);
            readers_.push_back(open_chunked_part(f, field));
            chunks_ += readers_.back()->chunks();
        }
        if (s.direct) set_direct(s.notice);
    }

    bool direct() const override {
        return direct_on_ && std::all_of(readers_.begin(), readers_.end(), [](const auto& r) { return r->direct(); });
    }
    void drop_pages(std::uint64_t first, std::uint64_t count) override {
        if (direct()) return;
        files_.each(first, count, [&](std::size_t i, std::uint64_t in, std::uint64_t n, std::uint64_t) {
            readers_[i]->drop_pages(in, n);
        });
    }

    // A whole storage chunk is decoded straight into buf; other ranges (and
    // ranges across parts) through each file's own assembly.
    // Counts the frames' bytes as read and only zstd's time as decoding.
    std::uint64_t read_range(std::uint64_t first, std::uint64_t count, std::uint8_t* buf) override {
        check_range(first, count);
        ChunkedReader::Cost cost;
        files_.each(first, count, [&](std::size_t i, std::uint64_t in, std::uint64_t n, std::uint64_t done) {
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
            const std::size_t f = files_.file_of(indices[i]);
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

    // O_DIRECT reads of each frame's 4 KiB-aligned cover, into the reading
    // thread's frame buffer (where zstd decodes it from anyway).
    void set_direct(const Message& notice) {
        for (std::size_t i = 0; i < readers_.size(); ++i) {
            if (readers_[i]->set_direct(true)) continue;
            for (auto& r : readers_) r->set_direct(false);
            if (notice)
                notice(setting_ + ": the filesystem of " + files_[i].where +
                       " refuses O_DIRECT: reading it through the page cache");
            return;
        }
        direct_on_ = true;
    }
    Buffer chunk(std::size_t f, std::uint64_t c_in_file);
    void evict();

    // An O_DIRECT read refused after the probe at open (the reader fell back
    // to the page cache): said once.
    void warn_if_fell_back() {
        if (!direct_on_ || direct() || fell_back_.exchange(true)) return;
        if (warn_)
            warn_(setting_ + ": an O_DIRECT read of " + path().string() +
                  " was refused: reading it through the page cache from now on");
    }

    FilePieces files_;
    std::vector<std::unique_ptr<ChunkedReader>> readers_;
    std::vector<std::uint64_t> first_chunk_; // of each file, in the field's chunks
    std::uint64_t chunks_ = 0, capacity_;
    bool direct_on_ = false;
    std::atomic<bool> fell_back_{false};
    Message warn_;
    std::string setting_; // "direct", as the caller spells it
    std::mutex mutex_;
    std::condition_variable decoded_;
    std::map<std::uint64_t, Entry> entries_;
    std::map<std::uint64_t, std::string> failed_;
    std::uint64_t clock_ = 0;
};

ZstdStreamReader::Buffer ZstdStreamReader::chunk(std::size_t f, std::uint64_t c_in_file) {
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

void ZstdStreamReader::evict() {
    while (entries_.size() > capacity_) {
        auto victim = entries_.end();
        for (auto it = entries_.begin(); it != entries_.end(); ++it)
            if (it->second.data && (victim == entries_.end() || it->second.used < victim->second.used)) victim = it;
        if (victim == entries_.end()) return;
        entries_.erase(victim);
    }
}

} // namespace

std::unique_ptr<StreamReader> zstd_stream_reader(std::vector<FileSpec> files, const FieldInfo& field,
                                                 std::uint64_t samples, const StreamSettings& settings) {
    return std::make_unique<ZstdStreamReader>(std::move(files), field, samples, settings);
}

} // namespace dstk::data
