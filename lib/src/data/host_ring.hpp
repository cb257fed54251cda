#pragma once
// The host half of the stream placement: R reader threads fill a ring of K
// host batch slots in batch order, every slot one buffer per field. Batch j of an epoch goes to slot j mod K
// and is filled by reader j mod R; a slot is refilled once the consumer has
// released the batch it held. With a window cache (sequential and chunk
// orders) batches are gathered from the cache's chunks in host memory, and
// the cache learns from release() which chunks it may free; without one (the
// full order) readers gather single samples from the files. Host memory: K
// slots plus the cache's capacity, whatever the split size.
#include <condition_variable>
#include <cstdint>
#include <exception>
#include <functional>
#include <mutex>
#include <span>
#include <thread>
#include <vector>

#include "dstk/data/order.hpp"
#include "dstk/data/stream_reader.hpp"
#include "dstk/data/window_cache.hpp"

namespace dstk::data {

struct HostMemory {
    std::function<void*(std::uint64_t)> alloc; // page-aligned; pinned for cuda
    std::function<void(void*)> free;
};
HostMemory plain_host_memory();

struct RingSlot {
    std::vector<std::uint8_t*> fields; // per field: batch samples of its sample_bytes, inside one buffer
    std::uint32_t size = 0;
    std::uint64_t batch = 0;
};

// Where each field's rows sit in a slot: one buffer per slot, the fields one
// after another (each at a 256-byte boundary, as device buffers are), so
// that a slot crosses to the GPU in one copy whatever the number of fields.
struct SlotLayout {
    std::vector<std::uint64_t> offsets; // per field
    std::vector<std::uint64_t> sample_bytes;
    std::uint64_t bytes = 0; // the buffer, whole pages
    // The bytes from the buffer's start to the end of the last field's first
    // `size` rows: one copy of them carries every field of a batch of `size`.
    std::uint64_t span(std::uint32_t size) const { return offsets.back() + size * sample_bytes.back(); }
};
SlotLayout slot_layout(std::uint32_t batch, std::span<const std::uint64_t> sample_bytes);

class HostRing {
  public:
    // `fields`: the readers of the delivered fields, in batch order (the
    // cache's fields, when there is one).
    HostRing(std::vector<StreamReader*> fields, std::uint32_t batch, bool drop_last, RankSlice slice,
             const OrderConfig& order, unsigned slots, unsigned readers, HostMemory memory,
             WindowCache* cache = nullptr);
    ~HostRing();
    HostRing(const HostRing&) = delete;
    HostRing& operator=(const HostRing&) = delete;

    std::uint64_t batches() const { return batches_; }
    const SlotLayout& layout() const { return layout_; }
    unsigned slots() const { return static_cast<unsigned>(slots_.size()); }
    void start(std::uint64_t epoch, std::uint64_t first_batch);
    // Epochs started from now on end at batch `end`, and the window cache
    // reads ahead into epoch + 1 (BatchSource::chain_epochs).
    void chain(std::uint64_t end);
    // Joins the readers and lets the window cache's reads in flight land
    // (start() does so first); their counters stay to be taken. Those waits
    // are interruptible (interrupt.hpp): interrupted, the ring stays stopped
    // and the next stop() or start() waits for the readers again.
    void stop();
    // The next batch in order, or nullptr at the end of the epoch. Several may
    // be held at once; release() frees the oldest held. An interruptible wait:
    // interrupted, no batch is taken.
    const RingSlot* acquire();
    void release();
    double take_wait_seconds();
    double take_read_seconds();   // reader threads filling slots, decode included
    double take_decode_seconds(); // of which decoding zstd chunks
    std::uint64_t host_bytes() const { return host_bytes_; }

  private:
    enum class State : std::uint8_t { free, filling, ready, failed };
    struct Slot {
        RingSlot data;
        std::uint8_t* buffer = nullptr;
        State state = State::free;
        std::uint64_t expect = 0; // the batch this slot takes next
    };
    void reader_loop(unsigned reader);
    void fill(RingSlot& slot, std::uint64_t batch, std::vector<std::uint64_t>& indices);
    void hint(std::uint64_t end_position);
    void free_slots();

    std::vector<StreamReader*> fields_;
    std::uint32_t batch_;
    SlotLayout layout_;
    RankSlice slice_;
    OrderConfig order_config_;
    std::uint64_t samples_, batches_;
    unsigned readers_;
    HostMemory memory_;
    WindowCache* cache_;
    std::uint64_t host_bytes_ = 0;

    std::unique_ptr<EpochOrder> order_;
    std::unique_ptr<EpochOrder> next_order_; // chained: the epoch the cache reads ahead into
    bool chained_ = false;
    std::uint64_t end_ = UINT64_MAX, last_ = 0; // the chained end; this epoch's end (batches)
    std::vector<Slot> slots_;
    std::vector<std::thread> threads_;
    std::mutex mutex_;
    std::condition_variable changed_;
    bool stop_ = false;
    std::size_t exited_ = 0; // readers returned since start()
    std::uint64_t first_ = 0, next_acquire_ = 0, next_release_ = 0;
    std::exception_ptr error_;
    double wait_seconds_ = 0, read_seconds_ = 0;

    std::mutex hint_mutex_;
    std::uint64_t hinted_until_ = 0;
};

} // namespace dstk::data
