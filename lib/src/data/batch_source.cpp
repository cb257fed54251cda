#include "dstk/data/batch_source.hpp"

#include <algorithm>
#include <chrono>
#include <cstring>
#include <deque>
#include <fstream>
#include <thread>
#include <utility>
#include <string>
#include <vector>

#include "dstk/enum_names.hpp"
#include "dstk/checksum.hpp"
#include "dstk/error.hpp"
#include "dstk/output.hpp"
#include "dstk/signals.hpp"
#include "dstk/units.hpp"
#include "dstk/field_reader.hpp"
#include "host_ring.hpp"
#include "dstk/data/window_cache.hpp"
#include "dstk/sysinfo.hpp"
#include "clock.hpp"
#if defined(DSTK_HAVE_CUDA)
#include "dstk/data/gpu_ops.hpp"
#endif

namespace dstk::data {
namespace {

constexpr std::uint64_t load_piece_bytes = 64ull << 20;

struct Fields {
    const SplitInfo* split = nullptr;
    const FieldInfo* x = nullptr;
    const FieldInfo* y = nullptr;
};

Fields check_fields(const Dataset& ds, std::string_view split_name, const SourceConfig& c) {
    const Manifest& m = ds.manifest();
    Fields f;
    f.split = &m.split(split_name);
    f.x = &f.split->field(m.input_field);
    f.y = &f.split->field(m.label_field);
    if (f.y->dtype != DType::i32 || f.y->shape.numel() != 1)
        throw runtime_error(ds.dir().string() + ": labels '" + f.y->name + "' of split '" + f.split->name + "' are " +
                            std::string(dtype_name(f.y->dtype)) + " " + f.y->shape.str() +
                            " (training needs one i32 label per sample); convert them with dsconvert");
    if (f.split->samples == 0)
        throw usage_error("split '" + f.split->name + "' of " + ds.dir().string() +
                          " is empty (no samples to train on); regenerate the dataset with samples in it");
    if (c.batch == 0) throw usage_error("invalid --batch 0 (must be positive)");
    if (c.drop_last && std::uint64_t{c.batch} * c.slice.world > f.split->samples)
        throw usage_error((c.slice.world > 1 ? "the global batch " + std::to_string(c.slice.world) + " x --batch " +
                                                   std::to_string(c.batch)
                                             : "--batch " + std::to_string(c.batch)) +
                          " is larger than split '" + f.split->name + "' (" + format_count(f.split->samples) +
                          " samples); use a smaller --batch");
    return f;
}

std::uint64_t round_up_page(std::uint64_t v) {
    return (v + 4095) / 4096 * 4096;
}

// The order's chunk: the storage's chunk for chunked files, else the config's.
OrderConfig effective_order(const SourceConfig& c, std::uint64_t storage_chunk) {
    OrderConfig o = c.order;
    if (storage_chunk != 0) o.chunk_samples = storage_chunk;
    return o;
}

std::uint64_t cache_chunks_for(const SourceConfig& c) {
    return c.order.window_chunks * 2 + c.readers + 1;
}

std::uint64_t storage_chunk_of(const FieldInfo& x) {
    return x.storage == Storage::zstd_chunked ? x.chunk_samples : 0;
}

// The window cache of a stream source: none for the full order, whose reads
// are single samples wherever they fall.
std::unique_ptr<WindowCache> make_cache(FieldReader& x, FieldReader& y, const SourceConfig& c, const HostPlan& plan) {
    if (c.order.kind == Order::full) return nullptr;
    return std::make_unique<WindowCache>(x, y, plan.cache, io_threads_for(c, x.storage_chunk_samples()),
                                         plan.drop_pages);
}

// The dataset's reader of a field, set to read as the stream source reads:
// its files are the ones the dataset opened, not a second descriptor of each.
FieldReader& stream_reader(const Dataset& ds, const Fields& f, const FieldInfo& field, const SourceConfig& c) {
    FieldReader& r = ds.reader(f.split->name, field.name);
    r.set_decoded_chunks(cache_chunks_for(c));
    r.set_direct(c.direct && &field == f.x, c.notice, c.warn); // labels stay buffered
    (void)r.take_io();
    (void)r.take_decode_seconds();
    return r;
}

// What the stream sources share: the fields, the window cache and the ring.
struct StreamParts {
    FieldReader &x, &y;
    HostPlan plan;
    std::unique_ptr<WindowCache> cache;
    std::unique_ptr<HostRing> ring;

    StreamParts(const Dataset& ds, const Fields& f, const SourceConfig& c, unsigned slots, HostMemory memory)
        : x(stream_reader(ds, f, *f.x, c)), y(stream_reader(ds, f, *f.y, c)),
          plan(plan_host_memory(*f.split, *f.x, c, available_host_memory())), cache(make_cache(x, y, c, plan)),
          ring(std::make_unique<HostRing>(x, y, c.batch, c.drop_last, c.slice,
                                          effective_order(c, x.storage_chunk_samples()), slots, c.readers,
                                          std::move(memory), cache.get())) {}

    // Starts the ring at `first_batch` of `epoch` with fresh stage counters:
    // what an abandoned iteration's readers counted up to their stop is dropped.
    void restart(std::uint64_t epoch, std::uint64_t first_batch) {
        ring->stop();
        StageTimes dropped;
        take_times(dropped);
        ring->start(epoch, first_batch);
    }
    void take_times(StageTimes& t) {
        t.read_wait = ring->take_wait_seconds();
        if (cache) {
            const CacheStats cs = cache->take_stats();
            t.decode = x.take_decode_seconds() + y.take_decode_seconds();
            t.read = std::max(0.0, cs.io_seconds - t.decode);
            t.io = cs.x;
            t.cache_peak = cs.peak;
        } else {
            t.decode = ring->take_decode_seconds();
            t.read = std::max(0.0, ring->take_read_seconds() - t.decode);
            t.io = x.take_io();
        }
        (void)y.take_io();
    }
    std::uint64_t host_bytes() const { return plan.total(); }
    std::uint64_t host_allocated() const { return ring->host_bytes() + (cache ? cache->allocated_bytes() : 0); }
};

// The batch a source hands out: the split's input and label fields under
// their names; each batch sets the pointers and the size.
Batch xy_batch(const Fields& f) {
    Batch b;
    for (const FieldInfo* fi : {f.x, f.y}) b.fields.push_back({fi->name, fi->dtype, fi->shape, nullptr});
    return b;
}

const Batch* point(Batch& b, const void* x, const void* y, std::uint32_t size) {
    b.size = size;
    b.fields[0].data = x;
    b.fields[1].data = y;
    return &b;
}

// The running hash of the batches a cpu source delivered (hash_batches).
struct BatchHash {
    bool on = false;
    std::optional<Xxh64> h;
    void add(const Batch& b) {
        if (!on) return;
        if (!h) h.emplace();
        for (const BatchField& f : b.fields) h->update(f.data, std::uint64_t{b.size} * f.sample_bytes());
    }
    void take(StageTimes& t) {
        if (!on) return;
        t.batch_hash = h ? h->digest() : 0;
        h.reset();
    }
};

// ---- stream, cpu backend: the host slot is the batch --------------------------

class HostStreamSource final : public BatchSource {
  public:
    HostStreamSource(const Dataset& ds, const Fields& f, const SourceConfig& c)
        : parts_(ds, f, c, c.prefetch, plain_host_memory()), batch_(xy_batch(f)) {
        hash_.on = c.hash_batches;
    }

    Placement placement() const override { return Placement::stream; }
    std::uint64_t samples() const override { return parts_.x.samples(); }
    std::uint64_t batches_per_epoch() const override { return parts_.ring->batches(); }
    void start_epoch(std::uint64_t epoch, std::uint64_t first_batch) override {
        parts_.restart(epoch, first_batch);
        times_ = {};
        StageTimes dropped;
        hash_.take(dropped);
    }
    const Batch* next() override {
        const RingSlot* s = parts_.ring->acquire();
        if (!s) return nullptr;
        point(batch_, s->x, s->y, s->size);
        hash_.add(batch_);
        times_.batches += 1;
        times_.samples += s->size;
        times_.bytes += s->size * (parts_.x.sample_bytes() + 4);
        return &batch_;
    }
    void release() override { parts_.ring->release(); }
    StageTimes take_times() override {
        StageTimes t = std::exchange(times_, {});
        parts_.take_times(t);
        hash_.take(t);
        return t;
    }
    std::uint64_t device_bytes() const override { return parts_.ring->host_bytes(); }
    std::uint64_t host_bytes() const override { return parts_.host_bytes(); }
    std::uint64_t host_allocated() const override { return parts_.host_allocated(); }

  private:
    StreamParts parts_;
    Batch batch_;
    StageTimes times_;
    BatchHash hash_;
};

// ---- resident sources: the whole split in one memory, batches by position ----

// The epoch bookkeeping the resident placements share: the order of the epoch,
// the next batch, and the stage counters. Subclasses turn (first, count) into
// a batch in their memory.
class ResidentSource : public BatchSource {
  public:
    std::uint64_t samples() const override { return samples_; }
    std::uint64_t batches_per_epoch() const override { return batches_; }
    void start_epoch(std::uint64_t epoch, std::uint64_t first_batch) override {
        order_ = std::make_unique<EpochOrder>(config_.order, samples_, epoch);
        next_ = std::min(first_batch, batches_);
        times_ = {};
    }
    void release() override {}
    StageTimes take_times() override { return std::exchange(times_, {}); }

  protected:
    ResidentSource(const Fields& f, const SourceConfig& c)
        : config_(c), samples_(f.split->samples), sample_bytes_(f.x->sample_bytes()),
          batches_(c.slice.batches(samples_, c.batch, c.drop_last)), batch_(xy_batch(f)) {}
    // Advances to the next batch of the epoch: its first position and size.
    bool take(std::uint64_t& first, std::uint32_t& count) {
        if (next_ >= batches_) return false;
        first = config_.slice.first_position(next_, config_.batch);
        count = static_cast<std::uint32_t>(std::min<std::uint64_t>(config_.batch, samples_ - first));
        ++next_;
        times_.batches += 1;
        times_.samples += count;
        times_.bytes += count * (sample_bytes_ + 4);
        return true;
    }

    SourceConfig config_;
    std::uint64_t samples_, sample_bytes_, batches_, next_ = 0;
    std::unique_ptr<EpochOrder> order_;
    StageTimes times_;
    Batch batch_;
};

// ---- device placement, cpu backend: the split in host memory ------------------

class HostResidentSource final : public ResidentSource {
  public:
    HostResidentSource(const Dataset& ds, const Fields& f, const SourceConfig& c) : ResidentSource(f, c) {
        hash_.on = c.hash_batches;
        const auto t0 = Clock::now();
        x_.resize(checked_mul(samples_, sample_bytes_, "split bytes"));
        y_.resize(samples_);
        ds.reader(f.split->name, f.x->name).read(0, samples_, x_.data());
        ds.reader(f.split->name, f.y->name).read(0, samples_, y_.data());
        times_.read = seconds_since(t0);
        if (c.order.kind != Order::sequential) {
            slot_x_.resize(std::uint64_t{c.batch} * sample_bytes_);
            slot_y_.resize(c.batch);
        }
    }

    Placement placement() const override { return Placement::device; }
    const Batch* next() override {
        std::uint64_t first;
        std::uint32_t count;
        if (!take(first, count)) return nullptr;
        if (config_.order.kind == Order::sequential) {
            point(batch_, x_.data() + first * sample_bytes_, y_.data() + first, count);
        } else {
            for (std::uint32_t i = 0; i < count; ++i) {
                const std::uint64_t s = (*order_)[first + i];
                std::memcpy(slot_x_.data() + i * sample_bytes_, x_.data() + s * sample_bytes_, sample_bytes_);
                slot_y_[i] = y_[s];
            }
            point(batch_, slot_x_.data(), slot_y_.data(), count);
        }
        hash_.add(batch_);
        return &batch_;
    }
    StageTimes take_times() override {
        StageTimes t = ResidentSource::take_times();
        hash_.take(t);
        return t;
    }
    std::uint64_t device_bytes() const override {
        return x_.size() + y_.size() * 4 + slot_x_.size() + slot_y_.size() * 4;
    }
    std::uint64_t host_bytes() const override { return device_bytes(); }

  private:
    std::vector<std::uint8_t> x_, slot_x_;
    std::vector<std::int32_t> y_, slot_y_;
    BatchHash hash_;
};

#if defined(DSTK_HAVE_CUDA)

template <typename Free> struct GpuPtr {
    void* p = nullptr;
    Free free;
    GpuPtr(void* ptr, Free f) : p(ptr), free(f) {}
    ~GpuPtr() {
        if (p) free(p);
    }
    GpuPtr(GpuPtr&& o) noexcept : p(std::exchange(o.p, nullptr)), free(o.free) {}
    GpuPtr(const GpuPtr&) = delete;
    GpuPtr& operator=(const GpuPtr&) = delete;
    GpuPtr& operator=(GpuPtr&&) = delete;
};
using DeviceMem = GpuPtr<void (*)(void*)>;

DeviceMem device_mem(std::uint64_t bytes) {
    return DeviceMem(gpu::device_alloc(bytes), gpu::device_free);
}
DeviceMem pinned_mem(std::uint64_t bytes) {
    return DeviceMem(gpu::pinned_alloc(bytes), gpu::pinned_free);
}
DeviceMem event(bool timing) {
    return DeviceMem(gpu::event_create(timing), gpu::event_destroy);
}

// Gathers batches in order from a split the GPU can read (device or managed
// memory) into one device batch slot, on the compute stream: stream order
// alone keeps the slot from being overwritten while a step reads it.
class DeviceGather {
  public:
    DeviceGather(std::uint32_t batch, std::uint64_t sample_bytes, void* stream)
        : batch_(batch), sample_bytes_(sample_bytes), stream_(stream), x_(device_mem(batch * sample_bytes)),
          y_(device_mem(std::uint64_t{batch} * 4)), idx_dev_(device_mem(std::uint64_t{batch} * 8 * 2)),
          idx_host_(pinned_mem(std::uint64_t{batch} * 8 * 2)) {
        idx_done_.emplace_back(event(false));
        idx_done_.emplace_back(event(false));
    }
    static std::uint64_t bytes(std::uint32_t batch, std::uint64_t sample_bytes) {
        return batch * sample_bytes + std::uint64_t{batch} * 4 + std::uint64_t{batch} * 16;
    }
    const Batch* gather(Batch& out, const EpochOrder& order, std::uint64_t first, std::uint32_t count,
                        const void* src_x, const std::int32_t* src_y) {
        const unsigned k = turn_++ % 2;
        if (used_[k]) gpu::event_synchronize(idx_done_[k].p);
        auto* host = static_cast<std::uint64_t*>(idx_host_.p) + std::uint64_t{k} * batch_;
        auto* dev = static_cast<std::uint64_t*>(idx_dev_.p) + std::uint64_t{k} * batch_;
        for (std::uint32_t i = 0; i < count; ++i) host[i] = order[first + i];
        gpu::copy_h2d_async(dev, host, std::uint64_t{count} * 8, stream_);
        gpu::event_record(idx_done_[k].p, stream_);
        used_[k] = true;
        gpu::gather_rows_async(x_.p, src_x, sample_bytes_, static_cast<std::int32_t*>(y_.p), src_y, dev, count,
                               stream_);
        return point(out, x_.p, y_.p, count);
    }

  private:
    std::uint32_t batch_;
    std::uint64_t sample_bytes_;
    void* stream_;
    DeviceMem x_, y_, idx_dev_, idx_host_;
    std::vector<DeviceMem> idx_done_;
    bool used_[2] = {false, false};
    unsigned turn_ = 0;
};

// ---- device placement, cuda ------------------------------------------------------

// Positions [first, first + count) of a split resident in device or managed
// memory: gathered into the batch buffer in the epoch's order, or, in
// sequential order (no gather), a slice of the split itself.
const Batch* resident_batch(Batch& out, DeviceGather* gather, const EpochOrder& order, std::uint64_t first,
                            std::uint32_t count, const void* x, const void* y, std::uint64_t sample_bytes) {
    const auto* xs = static_cast<const std::uint8_t*>(x);
    const auto* ys = static_cast<const std::int32_t*>(y);
    return gather ? gather->gather(out, order, first, count, xs, ys)
                  : point(out, xs + first * sample_bytes, ys + first, count);
}

class DeviceResidentSource final : public ResidentSource {
  public:
    DeviceResidentSource(const Dataset& ds, const Fields& f, const SourceConfig& c)
        : ResidentSource(f, c), x_(device_mem(checked_mul(samples_, sample_bytes_, "split bytes"))),
          y_(device_mem(samples_ * 4)) {
        const auto t0 = Clock::now();
        load(ds.reader(f.split->name, f.x->name), x_.p, sample_bytes_);
        load(ds.reader(f.split->name, f.y->name), y_.p, 4);
        times_.read = seconds_since(t0);
        if (c.order.kind != Order::sequential)
            gather_ = std::make_unique<DeviceGather>(c.batch, sample_bytes_, c.compute_stream);
    }

    Placement placement() const override { return Placement::device; }
    const Batch* next() override {
        std::uint64_t first;
        std::uint32_t count;
        if (!take(first, count)) return nullptr;
        return resident_batch(batch_, gather_.get(), *order_, first, count, x_.p, y_.p, sample_bytes_);
    }
    std::uint64_t device_bytes() const override {
        return samples_ * (sample_bytes_ + 4) + (gather_ ? DeviceGather::bytes(config_.batch, sample_bytes_) : 0);
    }
    std::uint64_t host_bytes() const override { return load_piece_bytes; }

  private:
    static void load(const FieldReader& r, void* dst, std::uint64_t sb) {
        std::vector<std::uint8_t> staging(std::max<std::uint64_t>(sb, load_piece_bytes / sb * sb));
        const std::uint64_t per = staging.size() / sb;
        for (std::uint64_t first = 0; first < r.samples(); first += per) {
            throw_if_interrupted();
            const std::uint64_t n = std::min(per, r.samples() - first);
            r.read(first, n, staging.data());
            gpu::copy_h2d(static_cast<std::uint8_t*>(dst) + first * sb, staging.data(), n * sb);
        }
    }

    DeviceMem x_, y_;
    std::unique_ptr<DeviceGather> gather_;
};

// ---- stream placement, cuda: pinned ring -> copy stream -> device slots ---------

class DeviceStreamSource final : public BatchSource {
  public:
    DeviceStreamSource(const Dataset& ds, const Fields& f, const SourceConfig& c)
        : config_(c), sample_bytes_(f.x->sample_bytes()),
          parts_(ds, f, c, std::max(c.prefetch, 2u), HostMemory{gpu::pinned_alloc, gpu::pinned_free}),
          ring_(*parts_.ring), copy_stream_(gpu::stream_create(), gpu::stream_destroy), batch_(xy_batch(f)) {
        for (unsigned k = 0; k < std::max(c.prefetch, 2u); ++k) {
            Slot s{device_mem(std::uint64_t{c.batch} * sample_bytes_), device_mem(std::uint64_t{c.batch} * 4),
                   event(true), event(true), event(false)};
            slots_.push_back(std::move(s));
        }
    }
    ~DeviceStreamSource() override {
        // Device slots must outlive the copies and steps that use them.
        if (config_.compute_stream) gpu::stream_synchronize(config_.compute_stream);
        gpu::stream_synchronize(copy_stream_.p);
    }

    static std::uint64_t bytes(const SourceConfig& c, std::uint64_t sample_bytes) {
        return std::max(c.prefetch, 2u) * (std::uint64_t{c.batch} * sample_bytes + std::uint64_t{c.batch} * 4);
    }

    Placement placement() const override { return Placement::stream; }
    std::uint64_t samples() const override { return parts_.x.samples(); }
    std::uint64_t batches_per_epoch() const override { return ring_.batches(); }
    void start_epoch(std::uint64_t epoch, std::uint64_t first_batch) override {
        drain();
        parts_.restart(epoch, first_batch);
        times_ = {};
    }
    const Batch* next() override {
        const RingSlot* h = ring_.acquire();
        if (!h) return nullptr;
        const std::size_t k = turn_++ % slots_.size();
        Slot& d = slots_[k];
        if (d.used) gpu::stream_wait_event(copy_stream_.p, d.computed.p);
        gpu::event_record(d.copy_start.p, copy_stream_.p);
        gpu::copy_h2d_async(d.x.p, h->x, std::uint64_t{h->size} * sample_bytes_, copy_stream_.p);
        gpu::copy_h2d_async(d.y.p, h->y, std::uint64_t{h->size} * 4, copy_stream_.p);
        gpu::event_record(d.copied.p, copy_stream_.p);
        gpu::stream_wait_event(config_.compute_stream, d.copied.p);
        d.used = true;
        pending_.push_back(k);
        current_ = k;
        times_.batches += 1;
        times_.samples += h->size;
        times_.bytes += h->size * (sample_bytes_ + 4);
        return point(batch_, d.x.p, d.y.p, h->size);
    }
    void release() override {
        gpu::event_record(slots_[current_].computed.p, config_.compute_stream);
        // A host slot is free once its copy has landed; keep one copy in flight.
        while (!pending_.empty() && (pending_.size() > 1 || gpu::event_done(slots_[pending_.front()].copied.p)))
            retire();
    }
    StageTimes take_times() override {
        StageTimes t = std::exchange(times_, {});
        parts_.take_times(t);
        return t;
    }
    std::uint64_t device_bytes() const override { return bytes(config_, sample_bytes_); }
    std::uint64_t host_bytes() const override { return parts_.host_bytes(); }
    std::uint64_t host_allocated() const override { return parts_.host_allocated(); }

  private:
    struct Slot {
        DeviceMem x, y, copy_start, copied, computed;
        bool used = false;
    };
    void retire() {
        Slot& s = slots_[pending_.front()];
        gpu::event_synchronize(s.copied.p);
        times_.h2d += gpu::event_elapsed_ms(s.copy_start.p, s.copied.p) / 1000.0;
        pending_.pop_front();
        ring_.release();
    }
    void drain() {
        while (!pending_.empty()) retire();
    }

    SourceConfig config_;
    std::uint64_t sample_bytes_;
    StreamParts parts_;
    HostRing& ring_;
    DeviceMem copy_stream_;
    std::vector<Slot> slots_;
    std::deque<std::size_t> pending_;
    std::size_t turn_ = 0, current_ = 0;
    StageTimes times_;
    Batch batch_;
};

// ---- managed placement, cuda -----------------------------------------------------

class ManagedSource final : public ResidentSource {
  public:
    ManagedSource(const Dataset& ds, const Fields& f, const SourceConfig& c)
        : ResidentSource(f, c),
          x_(gpu::managed_alloc(checked_mul(samples_, sample_bytes_, "split bytes")), gpu::managed_free),
          y_(gpu::managed_alloc(samples_ * 4), gpu::managed_free),
          side_stream_(gpu::stream_create(), gpu::stream_destroy) {
        const auto t0 = Clock::now();
        read_into(ds.reader(f.split->name, f.x->name), x_.p);
        read_into(ds.reader(f.split->name, f.y->name), y_.p);
        times_.read = seconds_since(t0);
        if (c.managed_policy == ManagedPolicy::advise) {
            gpu::advise_host_preferred(x_.p, samples_ * sample_bytes_, c.device.index);
            gpu::advise_host_preferred(y_.p, samples_ * 4, c.device.index);
        }
        if (c.order.kind != Order::sequential)
            gather_ = std::make_unique<DeviceGather>(c.batch, sample_bytes_, c.compute_stream);
    }
    ~ManagedSource() override {
        if (config_.compute_stream) gpu::stream_synchronize(config_.compute_stream);
        gpu::stream_synchronize(side_stream_.p);
    }

    Placement placement() const override { return Placement::managed; }
    void start_epoch(std::uint64_t epoch, std::uint64_t first_batch) override {
        ResidentSource::start_epoch(epoch, first_batch);
        prefetched_until_ = config_.slice.first_position(next_, config_.batch);
    }
    const Batch* next() override {
        std::uint64_t first;
        std::uint32_t count;
        if (!take(first, count)) return nullptr;
        if (config_.managed_policy == ManagedPolicy::prefetch) prefetch(first + count);
        return resident_batch(batch_, gather_.get(), *order_, first, count, x_.p, y_.p, sample_bytes_);
    }
    std::uint64_t device_bytes() const override {
        return gather_ ? DeviceGather::bytes(config_.batch, sample_bytes_) : 0;
    }
    std::uint64_t host_bytes() const override { return samples_ * (sample_bytes_ + 4); }

  private:
    static void read_into(const FieldReader& r, void* dst) {
        const std::uint64_t per = std::max<std::uint64_t>(1, load_piece_bytes / r.sample_bytes());
        for (std::uint64_t first = 0; first < r.samples(); first += per) {
            throw_if_interrupted();
            const std::uint64_t n = std::min(per, r.samples() - first);
            r.read(first, n, static_cast<std::uint8_t*>(dst) + first * r.sample_bytes());
        }
    }
    // Asks for what the next `prefetch` batches will read: their range in
    // sequential order, their window's chunks in chunk order. A full
    // permutation touches pages everywhere: nothing useful to prefetch.
    void prefetch(std::uint64_t end_position) {
        const std::uint64_t target = std::min(samples_, end_position + std::uint64_t{config_.prefetch} * config_.batch);
        const int dev = config_.device.index;
        if (config_.order.kind == Order::sequential) {
            if (prefetched_until_ < target) {
                gpu::prefetch_to_device(static_cast<std::uint8_t*>(x_.p) + prefetched_until_ * sample_bytes_,
                                        (target - prefetched_until_) * sample_bytes_, dev, side_stream_.p);
                gpu::prefetch_to_device(static_cast<std::int32_t*>(y_.p) + prefetched_until_,
                                        (target - prefetched_until_) * 4, dev, side_stream_.p);
                prefetched_until_ = target;
            }
        } else if (config_.order.kind == Order::chunk) {
            const std::uint64_t cs = config_.order.chunk_samples;
            while (prefetched_until_ < target) {
                for (const std::uint64_t ch : order_->window_chunks(prefetched_until_)) {
                    const std::uint64_t n = std::min(cs, samples_ - ch * cs);
                    gpu::prefetch_to_device(static_cast<std::uint8_t*>(x_.p) + ch * cs * sample_bytes_,
                                            n * sample_bytes_, dev, side_stream_.p);
                    gpu::prefetch_to_device(static_cast<std::int32_t*>(y_.p) + ch * cs, n * 4, dev, side_stream_.p);
                }
                prefetched_until_ = order_->next_window_start(prefetched_until_);
            }
        }
    }

    std::uint64_t prefetched_until_ = 0;
    DeviceMem x_, y_, side_stream_;
    std::unique_ptr<DeviceGather> gather_;
};

#endif

} // namespace

constexpr EnumNames<Placement, 4> placement_names{{{{Placement::automatic, "auto"},
                                                    {Placement::device, "device"},
                                                    {Placement::stream, "stream"},
                                                    {Placement::managed, "managed"}}}};

constexpr EnumNames<ManagedPolicy, 3> managed_policy_names{
    {{{ManagedPolicy::prefetch, "prefetch"}, {ManagedPolicy::advise, "advise"}, {ManagedPolicy::fault, "fault"}}}};

Placement parse_placement(std::string_view text) {
    return placement_names.parse(text, "--data");
}

std::string_view placement_name(Placement p) {
    return placement_names.name(p);
}

ManagedPolicy parse_managed_policy(std::string_view text) {
    return managed_policy_names.parse(text, "--managed-policy");
}

std::string_view managed_policy_name(ManagedPolicy p) {
    return managed_policy_names.name(p);
}

// Chunk reads in flight. A disk reaches its random-chunk rate only with a deep
// queue (a few reads leave it idle between completions), so raw chunks get as
// many threads as the capacity's two groups hold chunks, up to 16: the threads
// wait in pread, and the cache's capacity, not the thread count, bounds the
// bytes in flight. zstd chunks are decoded by the same threads, so there they
// are also held to the cores (more would only add compressed frames).
unsigned io_threads_for(const SourceConfig& c, std::uint64_t storage_chunk) {
    const std::uint64_t group = c.order.kind == Order::chunk ? std::max<std::uint64_t>(c.order.window_chunks, 1) : 1;
    std::uint64_t want = std::clamp<std::uint64_t>(2 * group, 4, 16);
    if (storage_chunk) want = std::min<std::uint64_t>(want, std::max(4u, std::thread::hardware_concurrency()));
    return std::max(c.readers, static_cast<unsigned>(want));
}

std::string_view stage_name(Stage s) {
    static constexpr EnumNames<Stage, 4> names{{{{Stage::compute, "compute"},
                                                 {Stage::read, "read (disk)"},
                                                 {Stage::decode, "decode (zstd)"},
                                                 {Stage::h2d, "h2d (host to device)"}}}};
    return names.name(s);
}

std::string_view limiting_stage(const StageTimes& t) {
    const double loop = t.read_wait + t.compute;
    if (loop <= 0 || t.read_wait < 0.1 * loop) return stage_name(Stage::compute);
    if (t.decode > t.read && t.decode >= t.h2d) return stage_name(Stage::decode);
    if (t.h2d > t.read) return stage_name(Stage::h2d);
    return stage_name(Stage::read);
}

std::uint64_t planned_device_bytes(const SplitInfo& split, const FieldInfo& x, const SourceConfig& c) {
    const std::uint64_t sb = x.sample_bytes();
    const std::uint64_t slot = std::uint64_t{c.batch} * (sb + 4);
    const std::uint64_t gather = c.order.kind == Order::sequential ? 0 : slot + std::uint64_t{c.batch} * 16;
    switch (c.placement) {
    case Placement::device:
        return checked_mul(split.samples, sb + 4, "split bytes") + gather;
    case Placement::managed:
        return gather;
    case Placement::stream:
        return c.device.backend == Backend::cpu ? std::uint64_t{std::max(c.prefetch, 1u)} * slot
                                                : std::uint64_t{std::max(c.prefetch, 2u)} * slot;
    case Placement::automatic:
        break;
    }
    throw std::logic_error("planned_device_bytes: unresolved placement");
}

HostPlan plan_host_memory(const SplitInfo& split, const FieldInfo& x, const SourceConfig& c, std::uint64_t available) {
    const bool cuda = c.device.backend == Backend::cuda;
    const std::uint64_t sb = x.sample_bytes();
    const std::uint64_t slots = cuda ? std::max(c.prefetch, 2u) : std::max(c.prefetch, 1u);
    HostPlan p;
    p.ring = slots * (round_up_page(std::uint64_t{c.batch} * sb) + round_up_page(std::uint64_t{c.batch} * 4)) +
             std::uint64_t{std::max(c.readers, 1u)} * c.batch * sizeof(std::uint64_t);
    const std::uint64_t storage_chunk = storage_chunk_of(x);
    const OrderConfig order = effective_order(c, storage_chunk);
    if (c.order.kind == Order::full) {
        // Sample gathers: O_DIRECT bounce buffers per reader, decoded chunks for zstd storage.
        if (c.direct) p.other += std::uint64_t{c.readers} * ((4ull << 20) + 8192);
        if (storage_chunk) // and each reader's frame buffer
            p.other +=
                cache_chunks_for(c) * storage_chunk * sb + std::uint64_t{c.readers} * (storage_chunk * sb + 3 * 4096);
    } else {
        // Two windows, or the whole split where it is smaller: every chunk read once and held.
        const bool slack = c.direct && x.storage == Storage::npy;
        const std::uint64_t cs = std::max<std::uint64_t>(order.chunk_samples, 1);
        const std::uint64_t whole =
            split.samples * (sb + 4) + (split.samples + cs - 1) / cs * (slack ? 3 * 4096 : 4096);
        p.min_cache = std::min(min_window_cache_bytes(order, sb, slack), whole);
        if (storage_chunk)
            p.other += std::uint64_t{io_threads_for(c, storage_chunk)} * // compressed frames, O_DIRECT's slack
                       (storage_chunk * sb + 3 * 4096);
        const std::uint64_t fixed = p.ring + p.other;
        if (c.host_mem != 0) {
            if (c.host_mem < fixed + p.min_cache)
                throw no_fit_error("--host-mem " + format_bytes(c.host_mem) + " is below the " +
                                   format_bytes(fixed + p.min_cache) + " the stream needs (ring " +
                                   format_bytes(p.ring) + " + two windows of " + std::to_string(order.window_chunks) +
                                   " chunks of " + format_count(order.chunk_samples) +
                                   " samples, read whole); raise --host-mem or lower --window or --prefetch");
            p.cache = c.host_mem - fixed;
        } else {
            const std::uint64_t share = available / 4 > fixed ? available / 4 - fixed : 0;
            p.cache = std::min(std::max(p.min_cache, std::min(share, 2 * p.min_cache)), whole);
            if (fixed + p.cache > available)
                throw no_fit_error("--data stream needs " + format_bytes(fixed + p.cache) + " of host memory (ring " +
                                   format_bytes(p.ring) + " + two windows of " + std::to_string(order.window_chunks) +
                                   " chunks) but " + format_bytes(available) +
                                   " is available; lower --window or --batch, or free memory");
        }
    }
    const std::uint64_t split_bytes = split.samples * (sb + 4);
    p.drop_pages = !c.direct && split_bytes + p.total() > available;
    return p;
}

std::uint64_t available_host_memory() {
    const MemoryReading m = read_host_memory();
    if (!m.cgroup_limit) return m.available;
    return std::min(m.available, *m.cgroup_limit > m.cgroup_anon ? *m.cgroup_limit - m.cgroup_anon : 0);
}

std::unique_ptr<BatchSource> make_batch_source(const Dataset& ds, std::string_view split, const SourceConfig& c) {
    const Fields f = check_fields(ds, split, c);
    if (c.prefetch == 0) throw usage_error("invalid --prefetch 0 (the ring needs at least 1 slot)");
    if (c.readers == 0) throw usage_error("invalid --readers 0 (at least 1 reader thread)");
    const bool cuda = c.device.backend == Backend::cuda;
    switch (c.placement) {
    case Placement::automatic:
        throw std::logic_error("make_batch_source: resolve --data auto first");
    case Placement::stream:
        if (!cuda) return std::make_unique<HostStreamSource>(ds, f, c);
        break;
    case Placement::device:
        if (!cuda) return std::make_unique<HostResidentSource>(ds, f, c);
        break;
    case Placement::managed:
        if (!cuda)
            throw usage_error("--data managed needs a CUDA device (managed memory is GPU memory); use --data stream "
                              "or --data device with --device cpu");
        break;
    }
#if defined(DSTK_HAVE_CUDA)
    gpu::set_device(c.device.index);
    switch (c.placement) {
    case Placement::stream:
        return std::make_unique<DeviceStreamSource>(ds, f, c);
    case Placement::device:
        return std::make_unique<DeviceResidentSource>(ds, f, c);
    case Placement::managed: {
        std::uint64_t free_b = 0, total_b = 0;
        gpu::mem_info(c.device.index, free_b, total_b);
        const std::uint64_t need = f.split->samples * (f.x->sample_bytes() + 4);
        if (need > free_b && !c.oversubscribe)
            throw no_fit_error("--data managed: split '" + f.split->name + "' needs " + format_bytes(need) +
                               " but the GPU has " + format_bytes(free_b) +
                               " free (oversubscribing managed memory can slow training 100x under random "
                               "access); use --data stream, or --oversubscribe to allow it");
        if (need > free_b)
            warning("--oversubscribe: managed split of " + format_bytes(need) + " exceeds the GPU's " +
                    format_bytes(free_b) + " free; speed can collapse under random access (--order full)");
        return std::make_unique<ManagedSource>(ds, f, c);
    }
    case Placement::automatic:
        break;
    }
    throw std::logic_error("make_batch_source: unreachable");
#else
    throw no_fit_error("--device " + device_name(c.device) + " (built without CUDA support) use --device cpu");
#endif
}

} // namespace dstk::data
