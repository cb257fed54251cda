#include "host_ring.hpp"
#include "clock.hpp"

#include <chrono>
#include <algorithm>
#include <cstdlib>
#include <utility>

#include "dstk/data/interrupt.hpp"
#include "dstk/error.hpp"
#include "dstk/thread_pool.hpp"
#include "dstk/units.hpp"

namespace dstk::data {
namespace {

std::uint64_t round_up(std::uint64_t v, std::uint64_t to) {
    return (v + to - 1) / to * to;
}

} // namespace

SlotLayout slot_layout(std::uint32_t batch, std::span<const std::uint64_t> sample_bytes) {
    SlotLayout l;
    std::uint64_t at = 0;
    for (const std::uint64_t sb : sample_bytes) {
        l.offsets.push_back(at);
        l.sample_bytes.push_back(sb);
        at = round_up(at + checked_mul(batch, sb, "batch bytes"), 256);
    }
    l.bytes = round_up(std::max<std::uint64_t>(at, 1), 4096);
    return l;
}

HostMemory plain_host_memory() {
    return {[](std::uint64_t bytes) -> void* {
                void* p = std::aligned_alloc(4096, round_up(std::max<std::uint64_t>(bytes, 1), 4096));
                if (!p)
                    throw no_fit_error("cannot allocate " + format_bytes(bytes) + " of host memory for batch slots");
                return p;
            },
            [](void* p) { std::free(p); }};
}

HostRing::HostRing(std::vector<StreamReader*> fields, std::uint32_t batch, bool drop_last, RankSlice slice,
                   const OrderConfig& order, unsigned slots, unsigned readers, HostMemory memory, WindowCache* cache)
    : fields_(std::move(fields)), batch_(batch), slice_(slice), order_config_(order),
      samples_(fields_.at(0)->samples()), batches_(slice.batches(samples_, batch, drop_last)),
      readers_(std::max(readers, 1u)), memory_(std::move(memory)), cache_(cache) {
    std::vector<std::uint64_t> sample_bytes;
    for (const StreamReader* f : fields_) sample_bytes.push_back(f->sample_bytes());
    layout_ = slot_layout(batch, sample_bytes);
    slots_.resize(std::max(slots, 1u));
    try {
        for (auto& s : slots_) {
            s.buffer = static_cast<std::uint8_t*>(memory_.alloc(layout_.bytes));
            host_bytes_ += layout_.bytes;
            for (const std::uint64_t at : layout_.offsets) s.data.fields.push_back(s.buffer + at);
        }
    } catch (...) {
        free_slots();
        throw;
    }
    host_bytes_ += std::uint64_t{readers_} * batch * sizeof(std::uint64_t); // index buffers
}

HostRing::~HostRing() {
    const InterruptCheck uninterruptible{nullptr}; // the readers use this object: wait for them to the end
    stop();
    free_slots();
}

void HostRing::free_slots() {
    for (auto& s : slots_)
        if (s.buffer) memory_.free(std::exchange(s.buffer, nullptr));
}

void HostRing::stop() {
    std::unique_lock lock(mutex_);
    stop_ = true;
    lock.unlock();
    changed_.notify_all();
    if (cache_) cache_->cancel(); // readers blocked on a chunk
    lock.lock();
    // A reader in a read that never returns keeps this wait from ending: a
    // check on this thread may give it up (interrupt.hpp); the readers stay
    // to be joined by the next stop().
    wait_interruptible(changed_, lock, [&] { return exited_ >= threads_.size(); });
    lock.unlock();
    for (auto& t : threads_) t.join();
    threads_.clear();
    if (cache_) cache_->wait_loads(); // the chunks being read when the readers stopped
}

void HostRing::chain(std::uint64_t end) {
    chained_ = true;
    end_ = end;
}

void HostRing::start(std::uint64_t epoch, std::uint64_t first_batch) {
    stop();
    // The order the cache read ahead in is this epoch's when it is the one chained to.
    if (next_order_ && next_order_->epoch() == epoch)
        order_ = std::move(next_order_);
    else
        order_ = std::make_unique<EpochOrder>(order_config_, samples_, epoch);
    next_order_.reset();
    if (chained_ && cache_) next_order_ = std::make_unique<EpochOrder>(order_config_, samples_, epoch + 1);
    last_ = std::min(batches_, end_);
    first_ = next_acquire_ = next_release_ = std::min(first_batch, last_);
    for (std::size_t s = 0; s < slots_.size(); ++s) {
        slots_[s].state = State::free;
        slots_[s].expect = first_ + s;
    }
    error_ = nullptr;
    hinted_until_ = std::min(slice_.first_position(first_, batch_), samples_);
    if (cache_)
        cache_->start(
            *order_, hinted_until_,
            {chained_ ? std::min(slice_.first_position(last_, batch_), samples_) : samples_, next_order_.get()});
    stop_ = false;
    exited_ = 0;
    start_threads(
        threads_, readers_,
        [this](unsigned r) {
            reader_loop(r);
            {
                std::lock_guard lock(mutex_);
                ++exited_;
            }
            changed_.notify_all();
        },
        [this] {
            {
                std::lock_guard lock(mutex_);
                stop_ = true;
            }
            changed_.notify_all();
            if (cache_) cache_->cancel(); // readers blocked on a chunk
        },
        "the stream's reader threads");
}

void HostRing::reader_loop(unsigned reader) {
    std::vector<std::uint64_t> indices(batch_);
    const std::uint64_t k = slots_.size();
    for (std::uint64_t j = first_ + reader; j < last_; j += readers_) {
        Slot& slot = slots_[(j - first_) % k];
        {
            std::unique_lock lock(mutex_);
            changed_.wait(lock, [&] { return stop_ || (slot.expect == j && slot.state == State::free); });
            if (stop_) return;
            slot.state = State::filling;
        }
        State done = State::ready;
        const auto t0 = Clock::now();
        try {
            fill(slot.data, j, indices);
        } catch (...) {
            std::lock_guard lock(mutex_);
            if (!error_) error_ = std::current_exception();
            done = State::failed;
        }
        {
            std::lock_guard lock(mutex_);
            read_seconds_ += seconds_since(t0);
            slot.state = done;
        }
        changed_.notify_all();
        if (done == State::failed) return;
    }
}

void HostRing::fill(RingSlot& slot, std::uint64_t batch, std::vector<std::uint64_t>& indices) {
    const std::uint64_t first = slice_.first_position(batch, batch_);
    const std::uint64_t count = std::min<std::uint64_t>(batch_, samples_ - first);
    slot.size = static_cast<std::uint32_t>(count);
    slot.batch = batch;
    if (cache_) {
        cache_->gather(first, count, slot.fields);
        return;
    }
    for (std::uint64_t i = 0; i < count; ++i) indices[i] = (*order_)[first + i];
    hint(first + count);
    const std::span<const std::uint64_t> idx(indices.data(), count);
    for (std::size_t f = 0; f < fields_.size(); ++f) fields_[f]->gather(idx, slot.fields[f]);
}

// Chunk order: ask for every window up to one window past what is being read,
// so the kernel reads whole chunks sequentially before the samples are needed.
void HostRing::hint(std::uint64_t end_position) {
    if (order_config_.kind != Order::chunk) return;
    std::lock_guard lock(hint_mutex_);
    const std::uint64_t target =
        std::min(samples_, end_position + order_config_.chunk_samples * order_config_.window_chunks);
    while (hinted_until_ < target) {
        const auto chunks = order_->window_chunks(hinted_until_);
        for (StreamReader* f : fields_) f->will_need(chunks, order_config_.chunk_samples);
        hinted_until_ = order_->next_window_start(hinted_until_);
    }
}

const RingSlot* HostRing::acquire() {
    if (next_acquire_ >= last_) return nullptr;
    Slot& slot = slots_[(next_acquire_ - first_) % slots_.size()];
    const auto t0 = Clock::now();
    std::unique_lock lock(mutex_);
    const auto ready = [&] { return slot.expect == next_acquire_ && slot.state == State::ready; };
    wait_interruptible(changed_, lock, [&] { return error_ || stop_ || ready(); });
    wait_seconds_ += seconds_since(t0);
    if (!ready()) {
        if (error_) std::rethrow_exception(error_);
        throw std::logic_error("HostRing::acquire on a stopped ring (start() did not complete)");
    }
    ++next_acquire_;
    return &slot.data;
}

void HostRing::release() {
    if (next_release_ >= next_acquire_) throw std::logic_error("HostRing::release without a held batch");
    Slot& slot = slots_[(next_release_ - first_) % slots_.size()];
    {
        std::lock_guard lock(mutex_);
        slot.state = State::free;
        slot.expect += slots_.size();
        ++next_release_;
    }
    changed_.notify_all();
    if (cache_) cache_->consumed(std::min(slice_.first_position(next_release_, batch_), samples_));
}

double HostRing::take_wait_seconds() {
    std::lock_guard lock(mutex_);
    return std::exchange(wait_seconds_, 0.0);
}

double HostRing::take_read_seconds() {
    std::lock_guard lock(mutex_);
    return std::exchange(read_seconds_, 0.0);
}

double HostRing::take_decode_seconds() {
    double s = 0;
    for (StreamReader* f : fields_) s += f->take_decode_seconds();
    return s;
}

} // namespace dstk::data
