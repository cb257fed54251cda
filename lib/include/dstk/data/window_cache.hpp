#pragma once
// The stream placement's host window cache: whole chunks read with large reads
// by a pool of I/O threads, held in host memory while the epoch's positions
// visit them, and batches gathered from that memory.
//
// An epoch is cut into groups of positions that read a known set of chunks:
// the windows of the chunk order (W chunks each), single chunks in sequential
// order. Groups are admitted in position order while their bytes fit the
// capacity, their chunks queued for the I/O threads in file order within a
// group; a group is freed once the consumer has released every batch that
// reads it. A gather that needs a group not yet admitted admits it whatever
// the capacity (the consumer can only hold the ring's batches, so this never
// goes past the groups those batches span); capacity is sized from
// min_window_cache_bytes so that this does not happen in steady state.
//
// The order is the EpochOrder's: the cache changes which reads are issued,
// never which sample is at which position.
#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <exception>
#include <memory>
#include <mutex>
#include <optional>
#include <thread>
#include <vector>

#include "dstk/data/field_access.hpp"
#include "dstk/data/order.hpp"

namespace dstk::data {

// Bytes of the chunks of one group (a window, or one chunk in sequential
// order), labels and O_DIRECT's alignment slack (`direct`) included.
std::uint64_t window_group_bytes(const OrderConfig& order, std::uint64_t sample_bytes, bool direct);
// The least capacity that keeps reading ahead: the group being consumed and
// the next one loading.
std::uint64_t min_window_cache_bytes(const OrderConfig& order, std::uint64_t sample_bytes, bool direct);

struct CacheStats {
    IoCounters x;           // reads of the input field
    double io_seconds = 0;  // I/O threads reading chunks (decode included), summed over threads
    std::uint64_t peak = 0; // most bytes of chunks held at once, since construction
};

class WindowCache {
  public:
    // x, y: the input and label fields (y read alongside x, chunk by chunk).
    // `drop_pages`: tell the kernel to forget a chunk's input pages once it is read.
    WindowCache(FieldAccess& x, FieldAccess& y, std::uint64_t capacity, unsigned io_threads, bool drop_pages);
    ~WindowCache();
    WindowCache(const WindowCache&) = delete;
    WindowCache& operator=(const WindowCache&) = delete;

    std::uint64_t capacity() const { return capacity_; }
    // Starts reading for `order` (kept by reference: it must outlive the
    // epoch) from position `first`. No gather may be running.
    void start(const EpochOrder& order, std::uint64_t first);
    // Sample order[p] of each position p in [first, first + count) into x
    // (sample_bytes each) and y; blocks until their chunks are read. Rethrows
    // the read error of a chunk it needs (naming the file).
    void gather(std::uint64_t first, std::uint64_t count, std::uint8_t* x, std::int32_t* y);
    // Every position before `end` has been gathered and its batch released.
    void consumed(std::uint64_t end);
    // Wakes gathers blocked on chunks (they throw); the next start() resumes.
    void cancel();
    CacheStats take_stats();
    std::uint64_t held_bytes() const;
    std::uint64_t allocated_bytes() const; // chunk buffers and labels allocated now, pooled ones included

  private:
    struct BufferFree {
        void operator()(std::uint8_t* p) const noexcept;
    };
    using Buffer = std::unique_ptr<std::uint8_t, BufferFree>;
    struct Chunk;
    struct Group {
        std::uint64_t end = 0, bytes = 0;
        std::vector<std::shared_ptr<Chunk>> chunks; // by chunk index
    };
    Group make_group(std::uint64_t position) const;
    void admit_locked(std::uint64_t force_end);
    std::shared_ptr<Chunk> find_locked(std::uint64_t position, std::uint64_t sample) const;
    void io_loop();
    void load(Chunk& c);
    void reset_locked();

    FieldAccess &x_, &y_;
    std::uint64_t capacity_, chunk_samples_ = 0;
    bool drop_pages_;
    const EpochOrder* order_ = nullptr;

    mutable std::mutex mutex_;
    std::condition_variable work_, ready_;
    std::deque<Group> groups_; // admitted, in position order
    std::optional<Group> next_;
    std::deque<std::shared_ptr<Chunk>> queue_;
    std::uint64_t planned_until_ = 0, consumed_until_ = 0, bytes_ = 0, peak_ = 0;
    unsigned loading_ = 0;
    bool stop_ = false, cancelled_ = false;
    double io_seconds_ = 0;
    std::vector<Buffer> pool_; // free chunk buffers of pooled_bytes_
    std::uint64_t pooled_bytes_ = 0;
    std::atomic<std::uint64_t> allocated_{0};
    std::vector<std::thread> threads_;
};

} // namespace dstk::data
