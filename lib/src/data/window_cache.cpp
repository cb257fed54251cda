#include "dstk/data/window_cache.hpp"
#include "clock.hpp"

#include <sys/mman.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <utility>

#include "dstk/data/interrupt.hpp"
#include "dstk/error.hpp"
#include "dstk/thread_pool.hpp"
#include "dstk/units.hpp"

namespace dstk::data {
namespace {

constexpr std::uint64_t buffer_align = 4096;

std::uint64_t round_up(std::uint64_t v, std::uint64_t to) {
    return (v + to - 1) / to * to;
}

std::uint64_t direct_slack(bool direct) {
    return direct ? 2 * buffer_align : 0;
}

std::uint64_t group_chunks(const OrderConfig& order) {
    return order.kind == Order::chunk ? std::max<std::uint64_t>(order.window_chunks, 1) : 1;
}

} // namespace

void WindowCache::BufferFree::operator()(std::uint8_t* p) const noexcept {
    ::munmap(p, bytes);
    if (held) *held -= bytes;
    if (filled && resident) *resident -= bytes;
}

// Mapped buffers go back to the kernel when freed: the count is what the
// cache holds now.
std::uint64_t WindowCache::allocated_bytes() const {
    return allocated_.load();
}

std::uint64_t WindowCache::resident_bytes() const {
    return resident_.load();
}

// One chunk of the order, every field of it: field f's samples start at
// data[f] + offset[f] (O_DIRECT reads of unaligned ranges start past the
// buffer's start).
struct WindowCache::Chunk {
    enum class State : std::uint8_t { queued, loading, ready, failed };
    std::uint64_t index = 0, first = 0, count = 0, bytes = 0;
    State state = State::queued;
    std::vector<Buffer> data;
    std::vector<std::uint64_t> offset;
    std::exception_ptr error;
};

std::uint64_t window_group_bytes(const OrderConfig& order, std::span<const CachedBytes> fields) {
    const std::uint64_t c = std::max<std::uint64_t>(order.chunk_samples, 1);
    std::uint64_t chunk = 0;
    for (const CachedBytes& f : fields) chunk += round_up(c * f.sample_bytes + direct_slack(f.direct), buffer_align);
    return group_chunks(order) * chunk;
}

std::uint64_t min_window_cache_bytes(const OrderConfig& order, std::span<const CachedBytes> fields) {
    return 2 * window_group_bytes(order, fields);
}

WindowCache::WindowCache(std::vector<CachedField> fields, std::uint64_t capacity, unsigned io_threads)
    : fields_(std::move(fields)), capacity_(capacity), pool_(fields_.size()), pooled_bytes_(fields_.size(), 0) {
    if (fields_.empty()) throw std::logic_error("WindowCache: no fields");
    start_threads(
        threads_, std::max(io_threads, 1u), [this](unsigned) { io_loop(); },
        [this] {
            std::lock_guard lock(mutex_);
            stop_ = true;
            work_.notify_all();
        },
        "the window cache's I/O threads");
}

// Host bytes of one chunk of `count` samples: each field's aligned buffer,
// with O_DIRECT's alignment slack where its reads are direct.
std::uint64_t WindowCache::chunk_bytes(std::uint64_t count) const {
    std::uint64_t bytes = 0;
    for (const CachedField& f : fields_) bytes += round_up(f.reader->range_buffer_bytes(count), buffer_align);
    return bytes;
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

void WindowCache::start(const EpochOrder& order, std::uint64_t first, CacheChain chain) {
    std::unique_lock lock(mutex_);
    queue_.clear();
    // Loads in flight hold chunks of the previous epoch: let them land first,
    // so that memory never holds two epochs' reads.
    wait_loads_locked(lock);
    const bool kept = keep_ahead_locked(order, first);
    // The abandoned windows' buffers go to the pool, not back to malloc: a
    // restart (every epoch of a mix's members, every resume) would otherwise
    // leave freed chunks in the allocator's arenas while new ones are taken,
    // and the process would outgrow its planned ceiling epoch after epoch.
    for (Group& g : groups_) recycle_locked(g);
    std::optional<Group> ahead = std::exchange(ahead_, std::nullopt);
    reset_locked();
    order_ = &order;
    chain_ = chain;
    const bool in_file_order = order.config().kind != Order::chunk;
    chunk_samples_ = std::max<std::uint64_t>(order.config().chunk_samples, 1);
    for (std::size_t f = 0; f < fields_.size(); ++f) {
        fields_[f].reader->read_ahead(in_file_order);
        const std::uint64_t full = round_up(fields_[f].reader->range_buffer_bytes(chunk_samples_), buffer_align);
        if (full != pooled_bytes_[f]) pool_[f].clear();
        pooled_bytes_[f] = full;
    }
    cancelled_ = false;
    // The group holding `first` starts at or before it: admit from there.
    planned_until_ = consumed_until_ = std::min(first, order.size());
    if (kept) { // read ahead by the previous epoch: its chunks stay, and those not read yet are queued again
        for (const auto& c : ahead->chunks)
            if (c->state == Chunk::State::queued) queue_.push_back(c);
        bytes_ = ahead->bytes;
        planned_until_ = ahead->end;
        groups_.push_back(std::move(*ahead));
        work_.notify_all();
    }
    admit_locked(0);
}

// Whether the group read ahead belongs to `order` and holds position
// `first`; recycles it when not.
bool WindowCache::keep_ahead_locked(const EpochOrder& order, std::uint64_t first) {
    if (!ahead_) return false;
    if (chain_.next == &order && first < ahead_->end) return true;
    recycle_locked(*ahead_);
    ahead_.reset();
    return false;
}

void WindowCache::wait_loads() {
    std::unique_lock lock(mutex_);
    wait_loads_locked(lock);
}

void WindowCache::wait_loads_locked(std::unique_lock<std::mutex>& lock) {
    wait_interruptible(ready_, lock, [&] { return loading_ == 0; });
}

void WindowCache::cancel() {
    {
        std::lock_guard lock(mutex_);
        cancelled_ = true;
        queue_.clear();
    }
    ready_.notify_all();
}

WindowCache::Group WindowCache::make_group(const EpochOrder& order, std::uint64_t position) const {
    const std::uint64_t n = order.size();
    Group g;
    std::vector<std::uint64_t> ids;
    if (order.config().kind == Order::chunk) {
        ids = order.window_chunks(position);
        g.end = order.next_window_start(position);
    } else {
        ids = {position / chunk_samples_};
        g.end = std::min(n, (ids[0] + 1) * chunk_samples_);
    }
    for (const std::uint64_t id : ids) {
        auto c = std::make_shared<Chunk>();
        c->index = id;
        c->first = id * chunk_samples_;
        c->count = std::min(chunk_samples_, n - c->first);
        c->bytes = chunk_bytes(c->count);
        g.bytes += c->bytes;
        g.chunks.push_back(std::move(c));
    }
    return g;
}

// Admits groups in position order while they fit, and those a gather needs
// (positions before force_end) whatever the capacity; then, chained, the
// next order's first group once it fits.
void WindowCache::admit_locked(std::uint64_t force_end) {
    const std::uint64_t n = std::min(order_->size(), chain_.end);
    bool queued = false;
    while (planned_until_ < n) {
        if (!next_) next_ = make_group(*order_, planned_until_);
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
    if (planned_until_ >= n && chain_.next && !ahead_ && chain_.next->size() > 0) {
        Group g = make_group(*chain_.next, 0);
        if (bytes_ + g.bytes <= capacity_) {
            for (const auto& c : g.chunks) queue_.push_back(c);
            bytes_ += g.bytes;
            peak_ = std::max(peak_, bytes_);
            ahead_ = std::move(g);
            queued = true;
        }
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

namespace {

// Copies rows of sb bytes: rows[i] to out + i * sb. Field by field, with the
// row size known to the compiler where it is small: a label of 1, 2, 4 or 8
// bytes is a load and a store, not a call to memcpy per sample.
template <std::uint64_t SB> void copy_rows_of(std::uint8_t* out, const std::vector<const std::uint8_t*>& rows) {
    for (std::size_t i = 0; i < rows.size(); ++i) std::memcpy(out + i * SB, rows[i], SB);
}

void copy_rows(std::uint8_t* out, const std::vector<const std::uint8_t*>& rows, std::uint64_t sb) {
    switch (sb) {
    case 1:
        return copy_rows_of<1>(out, rows);
    case 2:
        return copy_rows_of<2>(out, rows);
    case 4:
        return copy_rows_of<4>(out, rows);
    case 8:
        return copy_rows_of<8>(out, rows);
    default:
        for (std::size_t i = 0; i < rows.size(); ++i) std::memcpy(out + i * sb, rows[i], sb);
    }
}

} // namespace

void WindowCache::gather(std::uint64_t first, std::uint64_t count, std::span<std::uint8_t* const> out) {
    std::vector<std::shared_ptr<Chunk>> held; // the chunks this batch reads, kept alive while copying
    std::vector<const Chunk*> chunk_of(count);
    std::vector<std::uint64_t> row_of(count);
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
        chunk_of[i] = c;
        row_of[i] = s - c->first;
    }
    std::vector<const std::uint8_t*> rows(count);
    for (std::size_t f = 0; f < fields_.size(); ++f) {
        const std::uint64_t sb = fields_[f].reader->sample_bytes();
        for (std::uint64_t i = 0; i < count; ++i)
            rows[i] = chunk_of[i]->data[f].get() + chunk_of[i]->offset[f] + row_of[i] * sb;
        copy_rows(out[f], rows, sb);
    }
}

// Full-size buffers of the group's chunks that nobody else holds go to the
// pool: memory stays the same pages from window to window instead of going
// back to malloc.
void WindowCache::recycle_locked(Group& g) {
    for (auto& c : g.chunks) {
        if (c.use_count() != 1) continue;
        for (std::size_t f = 0; f < c->data.size(); ++f)
            if (c->data[f] && c->data[f].get_deleter().bytes == pooled_bytes_[f])
                pool_[f].push_back(std::move(c->data[f]));
    }
}

void WindowCache::consumed(std::uint64_t end) {
    {
        std::lock_guard lock(mutex_);
        consumed_until_ = std::max(consumed_until_, end);
        while (!groups_.empty() && groups_.front().end <= consumed_until_) {
            recycle_locked(groups_.front());
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
            // Let go of the chunk before anyone sees it ready: a consumer that
            // then finishes its window must find the group's chunks unshared,
            // or their buffers miss the pool and fresh ones are mapped beside
            // them, past the capacity.
            c.reset();
        }
        ready_.notify_all();
    }
}

// A buffer of at least `bytes` for a chunk of `field`: a pooled full-size
// one, else a fresh one. The partial last chunk takes a pooled one too: a
// fresh buffer of its own size would be mapped beside the full one its chunk
// leaves idle in the pool, past the capacity.
WindowCache::Buffer WindowCache::take_buffer(std::size_t field, std::uint64_t bytes) {
    {
        std::lock_guard lock(mutex_);
        if (bytes <= pooled_bytes_[field] && !pool_[field].empty()) {
            Buffer b = std::move(pool_[field].back());
            pool_[field].pop_back();
            return b;
        }
    }
    // Mapped, not malloc'ed: glibc raises its mmap threshold each time it
    // frees a large mapped block, after which blocks of a chunk's size come
    // from its arenas, and the ones freed at every restart (a mix's members
    // restart each epoch mid-stream; tail chunks) stay resident there while
    // new ones are taken: the process outgrew its planned host ceiling epoch
    // after epoch. Mapped pages go back to the kernel when unmapped.
    void* p = ::mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    Buffer b(p == MAP_FAILED ? nullptr : static_cast<std::uint8_t*>(p), BufferFree{bytes, &allocated_, &resident_});
    if (!b)
        throw no_fit_error("cannot allocate " + format_bytes(bytes) +
                           " of host memory for a chunk of the window cache; lower --host-mem or --window");
    allocated_ += bytes;
    return b;
}

// Every field's samples of the chunk, each with one large read. A field's
// pages are dropped only where its CachedField says so (StreamParts drops the
// bulk fields' alone: source_fields.hpp says why).
void WindowCache::load(Chunk& c) {
    c.data.resize(fields_.size());
    c.offset.assign(fields_.size(), 0);
    for (std::size_t f = 0; f < fields_.size(); ++f) {
        StreamReader& r = *fields_[f].reader;
        c.data[f] = take_buffer(f, round_up(r.range_buffer_bytes(c.count), buffer_align));
        c.offset[f] = r.read_range(c.first, c.count, c.data[f].get());
        BufferFree& d = c.data[f].get_deleter();
        if (!std::exchange(d.filled, true)) resident_ += d.bytes;
        if (fields_[f].drop_pages) r.drop_pages(c.first, c.count);
    }
}

CacheStats WindowCache::take_stats() {
    CacheStats s;
    for (const CachedField& f : fields_) s.io.push_back(f.reader->take_io());
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
