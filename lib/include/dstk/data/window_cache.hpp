#pragma once
// The stream placement's host window cache: whole chunks read with large reads
// by a pool of I/O threads, held in host memory while the epoch's positions
// visit them, and batches gathered from that memory. Every field the source
// delivers is read chunk by chunk the same way (one large read per field per
// chunk, whatever its sample size): a chunk is ready once all its fields are
// in. A zstd field whose storage chunks differ from the order's chunks is read
// the same way (read_range decodes whichever storage chunks a range touches).
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
#include <span>
#include <thread>
#include <vector>

#include "dstk/data/stream_reader.hpp"
#include "dstk/data/order.hpp"

namespace dstk::data {

// What a field costs the cache per chunk: its bytes per sample, and whether
// its reads are O_DIRECT (alignment slack around each chunk).
struct CachedBytes {
    std::uint64_t sample_bytes = 0;
    bool direct = false;
};
// Bytes of the chunks of one group (a window, or one chunk in sequential
// order) over every field, each field's buffer page-aligned with O_DIRECT's
// slack where its reads are direct.
std::uint64_t window_group_bytes(const OrderConfig& order, std::span<const CachedBytes> fields);
// The least capacity that keeps reading ahead: the group being consumed and
// the next one loading.
std::uint64_t min_window_cache_bytes(const OrderConfig& order, std::span<const CachedBytes> fields);

// A field the cache reads.
struct CachedField {
    StreamReader* reader = nullptr;
    bool drop_pages = false; // its pages leave the page cache once a chunk of it is read
};

struct CacheStats {
    std::vector<IoCounters> io; // reads of each field, in the cache's field order
    double io_seconds = 0;      // I/O threads reading chunks (decode included), summed over threads
    std::uint64_t peak = 0;     // most bytes of chunks held at once, since construction
};

// Where an epoch's reads stop, and what follows it: with `next`, the first
// group of that order (its position 0) is read once every group before `end`
// is admitted and it fits the capacity; a start() on that order at a
// position of the group keeps it.
struct CacheChain {
    std::uint64_t end = UINT64_MAX;
    const EpochOrder* next = nullptr; // kept by reference until the next start()
};

class WindowCache {
  public:
    // `fields`: at least one, all of the same samples.
    WindowCache(std::vector<CachedField> fields, std::uint64_t capacity, unsigned io_threads);
    ~WindowCache();
    WindowCache(const WindowCache&) = delete;
    WindowCache& operator=(const WindowCache&) = delete;

    std::uint64_t capacity() const { return capacity_; }
    // Starts reading for `order` (kept by reference: it must outlive the
    // epoch) from position `first`. No gather may be running. It first waits
    // for the reads in flight, as wait_loads does.
    void start(const EpochOrder& order, std::uint64_t first, CacheChain chain = {});
    // Sample order[p] of each position p in [first, first + count) into
    // out[f] (the field's sample_bytes each) for every field f; blocks until
    // their chunks are read. Rethrows the read error of a chunk it needs
    // (naming the file).
    void gather(std::uint64_t first, std::uint64_t count, std::span<std::uint8_t* const> out);
    // Every position before `end` has been gathered and its batch released.
    void consumed(std::uint64_t end);
    // Wakes gathers blocked on chunks (they throw); the next start() resumes.
    void cancel();
    // Waits until no chunk is being read (after cancel(): the reads in
    // flight have landed). Interruptible (interrupt.hpp): a read that never
    // returns keeps it waiting until this thread's check says to stop.
    void wait_loads();
    CacheStats take_stats();
    std::uint64_t held_bytes() const;
    std::uint64_t allocated_bytes() const; // chunk buffers mapped now, pooled ones included
    // Of those, the buffers a read has filled: resident pages. One being read
    // into is not counted yet (dstrain's ceiling takes what else the process
    // holds as its RSS less this).
    std::uint64_t resident_bytes() const;

  private:
    void wait_loads_locked(std::unique_lock<std::mutex>& lock); // wait_loads, mutex_ held
    // Chunk buffers are pages mapped for them and unmapped when freed (the
    // deleter knows their size): window_cache.cpp says why not malloc.
    struct BufferFree {
        std::uint64_t bytes = 0;
        std::atomic<std::uint64_t>* held = nullptr;     // the cache's count of mapped bytes
        std::atomic<std::uint64_t>* resident = nullptr; // ... and of those filled
        bool filled = false;
        void operator()(std::uint8_t* p) const noexcept;
    };
    using Buffer = std::unique_ptr<std::uint8_t, BufferFree>;
    struct Chunk;
    struct Group {
        std::uint64_t end = 0, bytes = 0;
        std::vector<std::shared_ptr<Chunk>> chunks; // by chunk index
    };
    Group make_group(const EpochOrder& order, std::uint64_t position) const;
    bool keep_ahead_locked(const EpochOrder& order, std::uint64_t first);
    void admit_locked(std::uint64_t force_end);
    std::shared_ptr<Chunk> find_locked(std::uint64_t position, std::uint64_t sample) const;
    void io_loop();
    void load(Chunk& c);
    void reset_locked();
    void recycle_locked(Group& g);
    std::uint64_t chunk_bytes(std::uint64_t count) const;
    Buffer take_buffer(std::size_t field, std::uint64_t bytes);

    std::vector<CachedField> fields_;
    std::uint64_t capacity_, chunk_samples_ = 0;
    const EpochOrder* order_ = nullptr;

    mutable std::mutex mutex_;
    std::condition_variable work_, ready_;
    // Mapped chunk bytes; declared before the buffers' owners, which count
    // down into it as they go.
    std::atomic<std::uint64_t> allocated_{0}, resident_{0};
    std::deque<Group> groups_; // admitted, in position order
    std::optional<Group> next_;
    CacheChain chain_;
    std::optional<Group> ahead_; // the chained order's first group
    std::deque<std::shared_ptr<Chunk>> queue_;
    std::uint64_t planned_until_ = 0, consumed_until_ = 0, bytes_ = 0, peak_ = 0;
    unsigned loading_ = 0;
    bool stop_ = false, cancelled_ = false;
    double io_seconds_ = 0;
    std::vector<std::vector<Buffer>> pool_; // per field: free chunk buffers of pooled_bytes_[field]
    std::vector<std::uint64_t> pooled_bytes_;
    std::vector<std::thread> threads_;
};

} // namespace dstk::data
