#include "dstk/data/window_cache.hpp"
#include "clock.hpp"

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <new>
#include <utility>

#include "dstk/error.hpp"
#include "dstk/units.hpp"

namespace dstk::data {
namespace {

constexpr std::uint64_t buffer_align = 4096;

std::uint64_t round_up(std::uint64_t v, std::uint64_t to) {
    return (v + to - 1) / to * to;
}

// Host bytes of one chunk of `count` samples: its aligned x buffer (with
// O_DIRECT's alignment slack where reads are direct) and its labels.
std::uint64_t chunk_bytes(std::uint64_t x_buffer, std::uint64_t count) {
    return round_up(x_buffer, buffer_align) + count * sizeof(std::int32_t);
}

std::uint64_t direct_slack(bool direct) {
    return direct ? 2 * buffer_align : 0;
}

std::uint64_t group_chunks(const OrderConfig& order) {
    return order.kind == Order::chunk ? std::max<std::uint64_t>(order.window_chunks, 1) : 1;
}

} // namespace

void WindowCache::BufferFree::operator()(std::uint8_t* p) const noexcept {
    std::free(p);
}

// Buffers are counted when allocated and never uncounted: freed ones (the
// tail chunk's, an epoch's leftovers) may stay in the allocator's pools.
std::uint64_t WindowCache::allocated_bytes() const {
    return allocated_.load();
}

struct WindowCache::Chunk {
    enum class State : std::uint8_t { queued, loading, ready, failed };
    std::uint64_t index = 0, first = 0, count = 0, bytes = 0, x_bytes = 0;
    State state = State::queued;
    Buffer x;
    std::uint64_t x_offset = 0;
    std::vector<std::int32_t> y;
    std::exception_ptr error;
};

std::uint64_t window_group_bytes(const OrderConfig& order, std::uint64_t sample_bytes, bool direct) {
    const std::uint64_t c = std::max<std::uint64_t>(order.chunk_samples, 1);
    return group_chunks(order) * chunk_bytes(c * sample_bytes + direct_slack(direct), c);
}

std::uint64_t min_window_cache_bytes(const OrderConfig& order, std::uint64_t sample_bytes, bool direct) {
    return 2 * window_group_bytes(order, sample_bytes, direct);
}

WindowCache::WindowCache(FieldAccess& x, FieldAccess& y, std::uint64_t capacity, unsigned io_threads, bool drop_pages)
    : x_(x), y_(y), capacity_(capacity), drop_pages_(drop_pages) {
    for (unsigned t = 0; t < std::max(io_threads, 1u); ++t) threads_.emplace_back([this] { io_loop(); });
}

WindowCache::~WindowCache() {
    {
        std::lock_guard lock(mutex_);
        stop_ = true;
    }
    work_.notify_all();
    ready_.notify_all();
    for (auto& t : threads_) t.join();
}

void WindowCache::reset_locked() {
    queue_.clear();
    groups_.clear();
    next_.reset();
    bytes_ = 0;
}

void WindowCache::start(const EpochOrder& order, std::uint64_t first) {
    std::unique_lock lock(mutex_);
    reset_locked();
    // Loads in flight hold chunks of the previous epoch: let them land first,
    // so that memory never holds two epochs' reads.
    ready_.wait(lock, [&] { return loading_ == 0; });
    order_ = &order;
    const bool in_file_order = order.config().kind != Order::chunk;
    x_.read_ahead(in_file_order);
    y_.read_ahead(in_file_order);
    chunk_samples_ = std::max<std::uint64_t>(order.config().chunk_samples, 1);
    const std::uint64_t full = round_up(x_.range_buffer_bytes(chunk_samples_), buffer_align);
    if (full != pooled_bytes_) pool_.clear();
    pooled_bytes_ = full;
    cancelled_ = false;
    // The group holding `first` starts at or before it: admit from there.
    planned_until_ = consumed_until_ = std::min(first, order.size());
    admit_locked(0);
}

void WindowCache::cancel() {
    {
        std::lock_guard lock(mutex_);
        cancelled_ = true;
        queue_.clear();
    }
    ready_.notify_all();
}

WindowCache::Group WindowCache::make_group(std::uint64_t position) const {
    const std::uint64_t n = order_->size();
    Group g;
    std::vector<std::uint64_t> ids;
    if (order_->config().kind == Order::chunk) {
        ids = order_->window_chunks(position);
        g.end = order_->next_window_start(position);
    } else {
        ids = {position / chunk_samples_};
        g.end = std::min(n, (ids[0] + 1) * chunk_samples_);
    }
    for (const std::uint64_t id : ids) {
        auto c = std::make_shared<Chunk>();
        c->index = id;
        c->first = id * chunk_samples_;
        c->count = std::min(chunk_samples_, n - c->first);
        c->bytes = chunk_bytes(x_.range_buffer_bytes(c->count), c->count);
        g.bytes += c->bytes;
        g.chunks.push_back(std::move(c));
    }
    return g;
}

// Admits groups in position order while they fit, and those a gather needs
// (positions before force_end) whatever the capacity.
void WindowCache::admit_locked(std::uint64_t force_end) {
    const std::uint64_t n = order_->size();
    bool queued = false;
    while (planned_until_ < n) {
        if (!next_) next_ = make_group(planned_until_);
        if (next_->end <= consumed_until_) { // consumed already: nothing to read
            planned_until_ = next_->end;
            next_.reset();
            continue;
        }
        const bool forced = planned_until_ < force_end;
        if (!forced && bytes_ + next_->bytes > capacity_) break;
        for (const auto& c : next_->chunks) queue_.push_back(c);
        bytes_ += next_->bytes;
        peak_ = std::max(peak_, bytes_);
        planned_until_ = next_->end;
        groups_.push_back(std::move(*next_));
        next_.reset();
        queued = true;
    }
    if (queued) work_.notify_all();
}

std::shared_ptr<WindowCache::Chunk> WindowCache::find_locked(std::uint64_t position, std::uint64_t sample) const {
    for (const Group& g : groups_) {
        if (g.end <= position) continue;
        const std::uint64_t id = sample / chunk_samples_;
        const auto it = std::lower_bound(g.chunks.begin(), g.chunks.end(), id,
                                         [](const std::shared_ptr<Chunk>& c, std::uint64_t v) { return c->index < v; });
        if (it == g.chunks.end() || (*it)->index != id) break;
        return *it;
    }
    throw std::logic_error("WindowCache: sample " + std::to_string(sample) + " at position " +
                           std::to_string(position) + " is in no admitted window");
}

void WindowCache::gather(std::uint64_t first, std::uint64_t count, std::uint8_t* x, std::int32_t* y) {
    const std::uint64_t sb = x_.sample_bytes();
    std::vector<std::shared_ptr<Chunk>> held; // the chunks this batch reads, kept alive while copying
    for (std::uint64_t i = 0; i < count; ++i) {
        const std::uint64_t p = first + i, s = (*order_)[p];
        const Chunk* c = nullptr;
        for (const auto& h : held)
            if (h->index == s / chunk_samples_) c = h.get();
        if (!c) {
            std::unique_lock lock(mutex_);
            admit_locked(first + count);
            std::shared_ptr<Chunk> found = find_locked(p, s);
            ready_.wait(lock, [&] {
                return stop_ || cancelled_ || found->state == Chunk::State::ready ||
                       found->state == Chunk::State::failed;
            });
            if (found->state == Chunk::State::failed) std::rethrow_exception(found->error);
            if (found->state != Chunk::State::ready) throw runtime_error("the stream was stopped");
            c = found.get();
            held.push_back(std::move(found));
        }
        std::memcpy(x + i * sb, c->x.get() + c->x_offset + (s - c->first) * sb, sb);
        y[i] = c->y[s - c->first];
    }
}

void WindowCache::consumed(std::uint64_t end) {
    {
        std::lock_guard lock(mutex_);
        consumed_until_ = std::max(consumed_until_, end);
        while (!groups_.empty() && groups_.front().end <= consumed_until_) {
            // Full-size buffers nobody holds are reused: memory stays the
            // same pages from window to window instead of going back to malloc.
            for (auto& c : groups_.front().chunks)
                if (c.use_count() == 1 && c->x && c->x_bytes == pooled_bytes_) pool_.push_back(std::move(c->x));
            bytes_ -= groups_.front().bytes;
            groups_.pop_front();
        }
        if (order_) admit_locked(0);
    }
}

void WindowCache::io_loop() {
    for (;;) {
        std::shared_ptr<Chunk> c;
        {
            std::unique_lock lock(mutex_);
            work_.wait(lock, [&] { return stop_ || !queue_.empty(); });
            if (stop_) return;
            c = std::move(queue_.front());
            queue_.pop_front();
            c->state = Chunk::State::loading;
            ++loading_;
        }
        const auto t0 = Clock::now();
        Chunk::State done = Chunk::State::ready;
        try {
            load(*c);
        } catch (...) {
            c->error = std::current_exception();
            done = Chunk::State::failed;
        }
        {
            std::lock_guard lock(mutex_);
            io_seconds_ += seconds_since(t0);
            c->state = done;
            --loading_;
        }
        ready_.notify_all();
    }
}

void WindowCache::load(Chunk& c) {
    const std::uint64_t buf_bytes = round_up(x_.range_buffer_bytes(c.count), buffer_align);
    c.x_bytes = buf_bytes;
    {
        std::lock_guard lock(mutex_);
        if (buf_bytes == pooled_bytes_ && !pool_.empty()) {
            c.x = std::move(pool_.back());
            pool_.pop_back();
        }
    }
    if (!c.x) {
        c.x.reset(static_cast<std::uint8_t*>(std::aligned_alloc(buffer_align, buf_bytes)));
        if (c.x) allocated_ += buf_bytes;
    }
    if (!c.x)
        throw no_fit_error("cannot allocate " + format_bytes(buf_bytes) +
                           " of host memory for a chunk of the window cache; lower --host-mem or --window");
    c.x_offset = x_.read_range(c.first, c.count, c.x.get());
    c.y.resize(c.count);
    const std::uint64_t y_bytes = y_.range_buffer_bytes(c.count);
    if (y_bytes == c.count * sizeof(std::int32_t)) {
        y_.read_range(c.first, c.count, reinterpret_cast<std::uint8_t*>(c.y.data()));
    } else { // labels read with alignment slack (not the case today: labels stay buffered)
        Buffer tmp(static_cast<std::uint8_t*>(std::aligned_alloc(buffer_align, round_up(y_bytes, buffer_align))));
        if (!tmp) throw std::bad_alloc();
        const std::uint64_t off = y_.read_range(c.first, c.count, tmp.get());
        std::memcpy(c.y.data(), tmp.get() + off, c.count * sizeof(std::int32_t));
    }
    // Only the input's pages: labels take 4 B a sample of page cache, and a
    // label page holds the labels of several chunks, so dropping it would make
    // the next chunk's label read a disk read of its own (a small read queued
    // behind the large ones).
    if (drop_pages_) x_.drop_pages(c.first, c.count);
}

CacheStats WindowCache::take_stats() {
    CacheStats s;
    s.x = x_.take_io();
    std::lock_guard lock(mutex_);
    s.io_seconds = std::exchange(io_seconds_, 0.0);
    s.peak = peak_;
    return s;
}

std::uint64_t WindowCache::held_bytes() const {
    std::lock_guard lock(mutex_);
    return bytes_;
}

} // namespace dstk::data
