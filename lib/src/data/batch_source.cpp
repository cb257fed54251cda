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
#include "memory_plan.hpp"
#include "source_fields.hpp"
#include "dstk/data/window_cache.hpp"
#include "clock.hpp"
#if defined(DSTK_HAVE_CUDA)
#include "dstk/data/gpu_ops.hpp"
#endif

namespace dstk::data {
namespace {

void check_config(const Dataset& ds, const SplitInfo& split, const SourceConfig& c) {
    if (split.samples == 0)
        throw usage_error("split '" + split.name + "' of " + ds.dir().string() +
                          " is empty (no samples to train on); regenerate the dataset with samples in it");
    if (c.batch == 0) throw usage_error("invalid --batch 0 (must be positive)");
    if (c.drop_last && std::uint64_t{c.batch} * c.slice.world > split.samples)
        throw usage_error((c.slice.world > 1 ? "the global batch " + std::to_string(c.slice.world) + " x --batch " +
                                                   std::to_string(c.batch)
                                             : "--batch " + std::to_string(c.batch)) +
                          " is larger than split '" + split.name + "' (" + format_count(split.samples) +
                          " samples); use a smaller --batch");
    if (c.prefetch == 0) throw usage_error("invalid --prefetch 0 (the ring needs at least 1 slot)");
    if (c.readers == 0) throw usage_error("invalid --readers 0 (at least 1 reader thread)");
}

// The window cache of a stream source: none for the full order, whose reads
// are single samples wherever they fall. Where the plan drops pages, the bulk
// fields' pages go (source_fields.hpp says why the others stay).
std::unique_ptr<WindowCache> make_cache(const SourceFields& f, const std::vector<FieldReader*>& readers,
                                        const SourceConfig& c, const HostPlan& plan) {
    if (c.order.kind == Order::full) return nullptr;
    std::vector<CachedField> cached;
    for (std::size_t i = 0; i < f.size(); ++i) cached.push_back({readers[i], plan.drop_pages && f.bulk(i)});
    return std::make_unique<WindowCache>(std::move(cached), plan.cache, io_threads_for(c, f.decoded_chunk()));
}

// The dataset's readers of the fields, set to read as the stream source reads:
// their files are the ones the dataset opened, not a second descriptor of each.
// O_DIRECT for the bulk fields alone (source_fields.hpp says why).
std::vector<FieldReader*> stream_readers(const Dataset& ds, const SourceFields& f, const SourceConfig& c) {
    std::vector<FieldReader*> out;
    for (std::size_t i = 0; i < f.size(); ++i) {
        FieldReader& r = ds.reader(f.split().name, f[i].name);
        r.set_decoded_chunks(decoded_chunks_for(c));
        r.set_direct(c.direct && f.bulk(i), c.notice, c.warn);
        (void)r.take_io();
        (void)r.take_decode_seconds();
        out.push_back(&r);
    }
    return out;
}

// What the stream sources share: the fields' readers, the window cache and the ring.
struct StreamParts {
    std::vector<FieldReader*> readers;
    std::size_t lead;
    HostPlan plan;
    std::unique_ptr<WindowCache> cache;
    std::unique_ptr<HostRing> ring;

    StreamParts(const Dataset& ds, const SourceFields& f, const SourceConfig& c, unsigned slots, HostMemory memory)
        : readers(stream_readers(ds, f, c)), lead(f.lead()),
          plan(plan_host_memory(f.split(), f.list(), c, available_host_memory())),
          cache(make_cache(f, readers, c, plan)),
          ring(std::make_unique<HostRing>(readers, c.batch, c.drop_last, c.slice, c.order, slots, c.readers,
                                          std::move(memory), cache.get())) {}

    // Starts the ring at `first_batch` of `epoch` with fresh stage counters:
    // what an abandoned iteration's readers counted up to their stop is dropped.
    void restart(std::uint64_t epoch, std::uint64_t first_batch) {
        ring->stop();
        StageTimes dropped;
        take_times(dropped);
        ring->start(epoch, first_batch);
    }
    // The lead field's reads are the ones reported (StageTimes::io); the
    // others' counters are taken so that they start afresh too.
    void take_times(StageTimes& t) {
        t.read_wait = ring->take_wait_seconds();
        if (cache) {
            const CacheStats cs = cache->take_stats();
            t.decode = 0;
            for (FieldReader* r : readers) t.decode += r->take_decode_seconds();
            t.read = std::max(0.0, cs.io_seconds - t.decode);
            t.io = cs.io[lead];
            t.cache_peak = cs.peak;
        } else {
            t.decode = ring->take_decode_seconds();
            t.read = std::max(0.0, ring->take_read_seconds() - t.decode);
            for (std::size_t i = 0; i < readers.size(); ++i) {
                const IoCounters io = readers[i]->take_io();
                if (i == lead) t.io = io;
            }
        }
    }
    std::uint64_t host_bytes() const { return plan.total(); }
    std::uint64_t host_allocated() const { return ring->host_bytes() + (cache ? cache->allocated_bytes() : 0); }
};

// Points every field of `b` at data_of(field index) and sets the size.
template <typename DataOf> const Batch* point(Batch& b, std::uint32_t size, DataOf&& data_of) {
    b.size = size;
    for (std::size_t f = 0; f < b.fields.size(); ++f) b.fields[f].data = data_of(f);
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
    HostStreamSource(const Dataset& ds, const SourceFields& f, const SourceConfig& c)
        : parts_(ds, f, c, c.prefetch, plain_host_memory()), batch_(f.batch()), row_bytes_(f.row_bytes()) {
        hash_.on = c.hash_batches;
    }

    Placement placement() const override { return Placement::stream; }
    std::uint64_t samples() const override { return parts_.readers[0]->samples(); }
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
        point(batch_, s->size, [&](std::size_t f) { return s->fields[f]; });
        hash_.add(batch_);
        times_.batches += 1;
        times_.samples += s->size;
        times_.bytes += s->size * row_bytes_;
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
    std::uint64_t row_bytes_;
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
    ResidentSource(const SourceFields& f, const SourceConfig& c)
        : config_(c), samples_(f.samples()), row_bytes_(f.row_bytes()),
          batches_(c.slice.batches(samples_, c.batch, c.drop_last)), batch_(f.batch()) {
        for (std::size_t i = 0; i < f.size(); ++i) sample_bytes_.push_back(f[i].sample_bytes());
    }
    // Advances to the next batch of the epoch: its first position and size.
    bool take(std::uint64_t& first, std::uint32_t& count) {
        if (next_ >= batches_) return false;
        first = config_.slice.first_position(next_, config_.batch);
        count = static_cast<std::uint32_t>(std::min<std::uint64_t>(config_.batch, samples_ - first));
        ++next_;
        times_.batches += 1;
        times_.samples += count;
        times_.bytes += count * row_bytes_;
        return true;
    }

    SourceConfig config_;
    std::uint64_t samples_, row_bytes_, batches_, next_ = 0;
    std::vector<std::uint64_t> sample_bytes_; // per field
    std::unique_ptr<EpochOrder> order_;
    StageTimes times_;
    Batch batch_;
};

// ---- device placement, cpu backend: the split in host memory ------------------

class HostResidentSource final : public ResidentSource {
  public:
    HostResidentSource(const Dataset& ds, const SourceFields& f, const SourceConfig& c) : ResidentSource(f, c) {
        hash_.on = c.hash_batches;
        const auto t0 = Clock::now();
        for (std::size_t i = 0; i < f.size(); ++i) {
            data_.emplace_back(checked_mul(samples_, sample_bytes_[i], "split bytes"));
            ds.reader(f.split().name, f[i].name).read(0, samples_, data_.back().data());
            if (c.order.kind != Order::sequential) slot_.emplace_back(std::uint64_t{c.batch} * sample_bytes_[i]);
        }
        times_.read = seconds_since(t0);
    }

    Placement placement() const override { return Placement::device; }
    const Batch* next() override {
        std::uint64_t first;
        std::uint32_t count;
        if (!take(first, count)) return nullptr;
        if (config_.order.kind == Order::sequential) {
            point(batch_, count, [&](std::size_t f) { return data_[f].data() + first * sample_bytes_[f]; });
        } else {
            for (std::uint32_t i = 0; i < count; ++i) {
                const std::uint64_t s = (*order_)[first + i];
                for (std::size_t f = 0; f < data_.size(); ++f) {
                    const std::uint64_t sb = sample_bytes_[f];
                    std::memcpy(slot_[f].data() + i * sb, data_[f].data() + s * sb, sb);
                }
            }
            point(batch_, count, [&](std::size_t f) { return slot_[f].data(); });
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
        std::uint64_t bytes = 0;
        for (const auto& v : data_) bytes += v.size();
        for (const auto& v : slot_) bytes += v.size();
        return bytes;
    }
    std::uint64_t host_bytes() const override { return device_bytes(); }

  private:
    std::vector<std::vector<std::uint8_t>> data_, slot_; // per field: the split, the batch slot (gathering orders)
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
// alone keeps the slot from being overwritten while a step reads it. The
// epoch's indices go up once per batch; each field is one gather launch.
class DeviceGather {
  public:
    DeviceGather(std::uint32_t batch, const std::vector<std::uint64_t>& sample_bytes, void* stream)
        : batch_(batch), sample_bytes_(sample_bytes), stream_(stream),
          idx_dev_(device_mem(std::uint64_t{batch} * 8 * 2)), idx_host_(pinned_mem(std::uint64_t{batch} * 8 * 2)) {
        for (const std::uint64_t sb : sample_bytes_) slot_.push_back(device_mem(std::uint64_t{batch} * sb));
        idx_done_.emplace_back(event(false));
        idx_done_.emplace_back(event(false));
    }
    static std::uint64_t bytes(std::uint32_t batch, std::uint64_t row_bytes) {
        return std::uint64_t{batch} * row_bytes + std::uint64_t{batch} * 16;
    }
    // src[f]: field f of the split, sample-major.
    const Batch* gather(Batch& out, const EpochOrder& order, std::uint64_t first, std::uint32_t count,
                        const std::vector<const void*>& src) {
        const unsigned k = turn_++ % 2;
        if (used_[k]) gpu::event_synchronize(idx_done_[k].p);
        auto* host = static_cast<std::uint64_t*>(idx_host_.p) + std::uint64_t{k} * batch_;
        auto* dev = static_cast<std::uint64_t*>(idx_dev_.p) + std::uint64_t{k} * batch_;
        for (std::uint32_t i = 0; i < count; ++i) host[i] = order[first + i];
        gpu::copy_h2d_async(dev, host, std::uint64_t{count} * 8, stream_);
        gpu::event_record(idx_done_[k].p, stream_);
        used_[k] = true;
        for (std::size_t f = 0; f < slot_.size(); ++f)
            gpu::gather_rows_async(slot_[f].p, src[f], sample_bytes_[f], dev, count, stream_);
        return point(out, count, [&](std::size_t f) { return slot_[f].p; });
    }

  private:
    std::uint32_t batch_;
    std::vector<std::uint64_t> sample_bytes_;
    void* stream_;
    std::vector<DeviceMem> slot_; // per field
    DeviceMem idx_dev_, idx_host_;
    std::vector<DeviceMem> idx_done_;
    bool used_[2] = {false, false};
    unsigned turn_ = 0;
};

// The fields of a split resident in device or managed memory, one allocation
// per field.
struct ResidentFields {
    std::vector<DeviceMem> data;
    std::vector<const void*> pointers() const {
        std::vector<const void*> out;
        for (const DeviceMem& d : data) out.push_back(d.p);
        return out;
    }
};

// ---- device placement, cuda ------------------------------------------------------

// Positions [first, first + count) of a split resident in device or managed
// memory: gathered into the batch buffer in the epoch's order, or, in
// sequential order (no gather), a slice of the split itself.
const Batch* resident_batch(Batch& out, DeviceGather* gather, const EpochOrder& order, std::uint64_t first,
                            std::uint32_t count, const std::vector<const void*>& src,
                            const std::vector<std::uint64_t>& sample_bytes) {
    if (gather) return gather->gather(out, order, first, count, src);
    return point(out, count,
                 [&](std::size_t f) { return static_cast<const std::uint8_t*>(src[f]) + first * sample_bytes[f]; });
}

class DeviceResidentSource final : public ResidentSource {
  public:
    DeviceResidentSource(const Dataset& ds, const SourceFields& f, const SourceConfig& c) : ResidentSource(f, c) {
        const auto t0 = Clock::now();
        for (std::size_t i = 0; i < f.size(); ++i) {
            split_.data.push_back(device_mem(checked_mul(samples_, sample_bytes_[i], "split bytes")));
            load(ds.reader(f.split().name, f[i].name), split_.data.back().p, sample_bytes_[i]);
            staging_ = std::max(staging_, staging_bytes(sample_bytes_[i]));
        }
        src_ = split_.pointers();
        times_.read = seconds_since(t0);
        if (c.order.kind != Order::sequential)
            gather_ = std::make_unique<DeviceGather>(c.batch, sample_bytes_, c.compute_stream);
    }

    Placement placement() const override { return Placement::device; }
    const Batch* next() override {
        std::uint64_t first;
        std::uint32_t count;
        if (!take(first, count)) return nullptr;
        return resident_batch(batch_, gather_.get(), *order_, first, count, src_, sample_bytes_);
    }
    std::uint64_t device_bytes() const override {
        return samples_ * row_bytes_ + (gather_ ? DeviceGather::bytes(config_.batch, row_bytes_) : 0);
    }
    std::uint64_t host_bytes() const override { return staging_; }

  private:
    static void load(const FieldReader& r, void* dst, std::uint64_t sb) {
        std::vector<std::uint8_t> staging(staging_bytes(sb));
        const std::uint64_t per = staging.size() / sb;
        for (std::uint64_t first = 0; first < r.samples(); first += per) {
            throw_if_interrupted();
            const std::uint64_t n = std::min(per, r.samples() - first);
            r.read(first, n, staging.data());
            gpu::copy_h2d(static_cast<std::uint8_t*>(dst) + first * sb, staging.data(), n * sb);
        }
    }

    ResidentFields split_;
    std::vector<const void*> src_;
    std::uint64_t staging_ = 0;
    std::unique_ptr<DeviceGather> gather_;
};

// ---- stream placement, cuda: pinned ring -> copy stream -> device slots ---------

class DeviceStreamSource final : public BatchSource {
  public:
    DeviceStreamSource(const Dataset& ds, const SourceFields& f, const SourceConfig& c)
        : config_(c), row_bytes_(f.row_bytes()),
          parts_(ds, f, c, std::max(c.prefetch, 2u), HostMemory{gpu::pinned_alloc, gpu::pinned_free}),
          ring_(*parts_.ring), copy_stream_(gpu::stream_create(), gpu::stream_destroy), batch_(f.batch()) {
        for (std::size_t i = 0; i < f.size(); ++i) sample_bytes_.push_back(f[i].sample_bytes());
        for (unsigned k = 0; k < std::max(c.prefetch, 2u); ++k) {
            Slot s{{}, event(true), event(true), event(false)};
            for (const std::uint64_t sb : sample_bytes_) s.fields.push_back(device_mem(std::uint64_t{c.batch} * sb));
            slots_.push_back(std::move(s));
        }
    }
    ~DeviceStreamSource() override {
        // Device slots must outlive the copies and steps that use them.
        if (config_.compute_stream) gpu::stream_synchronize(config_.compute_stream);
        gpu::stream_synchronize(copy_stream_.p);
    }

    Placement placement() const override { return Placement::stream; }
    std::uint64_t samples() const override { return parts_.readers[0]->samples(); }
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
        for (std::size_t f = 0; f < d.fields.size(); ++f)
            gpu::copy_h2d_async(d.fields[f].p, h->fields[f], std::uint64_t{h->size} * sample_bytes_[f], copy_stream_.p);
        gpu::event_record(d.copied.p, copy_stream_.p);
        gpu::stream_wait_event(config_.compute_stream, d.copied.p);
        d.used = true;
        pending_.push_back(k);
        current_ = k;
        times_.batches += 1;
        times_.samples += h->size;
        times_.bytes += h->size * row_bytes_;
        return point(batch_, h->size, [&](std::size_t f) { return d.fields[f].p; });
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
    std::uint64_t device_bytes() const override {
        return std::uint64_t{std::max(config_.prefetch, 2u)} * config_.batch * row_bytes_;
    }
    std::uint64_t host_bytes() const override { return parts_.host_bytes(); }
    std::uint64_t host_allocated() const override { return parts_.host_allocated(); }

  private:
    struct Slot {
        std::vector<DeviceMem> fields;
        DeviceMem copy_start, copied, computed;
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
    std::uint64_t row_bytes_;
    std::vector<std::uint64_t> sample_bytes_;
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
    ManagedSource(const Dataset& ds, const SourceFields& f, const SourceConfig& c)
        : ResidentSource(f, c), side_stream_(gpu::stream_create(), gpu::stream_destroy) {
        const auto t0 = Clock::now();
        for (std::size_t i = 0; i < f.size(); ++i) {
            const std::uint64_t bytes = checked_mul(samples_, sample_bytes_[i], "split bytes");
            split_.data.emplace_back(gpu::managed_alloc(bytes), gpu::managed_free);
            read_into(ds.reader(f.split().name, f[i].name), split_.data.back().p);
            if (c.managed_policy == ManagedPolicy::advise)
                gpu::advise_host_preferred(split_.data.back().p, bytes, c.device.index);
        }
        src_ = split_.pointers();
        times_.read = seconds_since(t0);
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
        return resident_batch(batch_, gather_.get(), *order_, first, count, src_, sample_bytes_);
    }
    std::uint64_t device_bytes() const override { return gather_ ? DeviceGather::bytes(config_.batch, row_bytes_) : 0; }
    std::uint64_t host_bytes() const override { return samples_ * row_bytes_; }

  private:
    static void read_into(const FieldReader& r, void* dst) {
        const std::uint64_t per = std::max<std::uint64_t>(1, load_piece_bytes / r.sample_bytes());
        for (std::uint64_t first = 0; first < r.samples(); first += per) {
            throw_if_interrupted();
            const std::uint64_t n = std::min(per, r.samples() - first);
            r.read(first, n, static_cast<std::uint8_t*>(dst) + first * r.sample_bytes());
        }
    }
    // Samples [first, first + count) of every field to the GPU, on the side stream.
    void prefetch_samples(std::uint64_t first, std::uint64_t count) {
        for (std::size_t f = 0; f < src_.size(); ++f)
            gpu::prefetch_to_device(static_cast<const std::uint8_t*>(src_[f]) + first * sample_bytes_[f],
                                    count * sample_bytes_[f], config_.device.index, side_stream_.p);
    }
    // Asks for what the next `prefetch` batches will read: their range in
    // sequential order, their window's chunks in chunk order. A full
    // permutation touches pages everywhere: nothing useful to prefetch.
    void prefetch(std::uint64_t end_position) {
        const std::uint64_t target = std::min(samples_, end_position + std::uint64_t{config_.prefetch} * config_.batch);
        if (config_.order.kind == Order::sequential) {
            if (prefetched_until_ < target) {
                prefetch_samples(prefetched_until_, target - prefetched_until_);
                prefetched_until_ = target;
            }
        } else if (config_.order.kind == Order::chunk) {
            const std::uint64_t cs = config_.order.chunk_samples;
            while (prefetched_until_ < target) {
                for (const std::uint64_t ch : order_->window_chunks(prefetched_until_))
                    prefetch_samples(ch * cs, std::min(cs, samples_ - ch * cs));
                prefetched_until_ = order_->next_window_start(prefetched_until_);
            }
        }
    }

    std::uint64_t prefetched_until_ = 0;
    ResidentFields split_;
    std::vector<const void*> src_;
    DeviceMem side_stream_;
    std::unique_ptr<DeviceGather> gather_;
};

// The managed split must fit the GPU's free memory unless oversubscription was asked for.
void check_managed_fits(const SourceFields& f, const SourceConfig& c) {
    std::uint64_t free_b = 0, total_b = 0;
    gpu::mem_info(c.device.index, free_b, total_b);
    const std::uint64_t need = checked_mul(f.samples(), f.row_bytes(), "split bytes");
    if (need > free_b && !c.oversubscribe)
        throw no_fit_error("--data managed: split '" + f.split().name + "' needs " + format_bytes(need) +
                           " but the GPU has " + format_bytes(free_b) +
                           " free (oversubscribing managed memory can slow training 100x under random "
                           "access); use --data stream, or --oversubscribe to allow it");
    if (need > free_b)
        warning("--oversubscribe: managed split of " + format_bytes(need) + " exceeds the GPU's " +
                format_bytes(free_b) + " free; speed can collapse under random access (--order full)");
}

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

std::unique_ptr<BatchSource> make_batch_source(const Dataset& ds, std::string_view split_name,
                                               const SourceConfig& config) {
    const SplitInfo& split = ds.manifest().split(split_name);
    const SourceFields f(split, source_fields(ds.manifest(), split, config));
    check_config(ds, split, config);
    SourceConfig c = config;
    c.order = f.order(config.order); // every placement visits the same order
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
    case Placement::managed:
        check_managed_fits(f, c);
        return std::make_unique<ManagedSource>(ds, f, c);
    case Placement::automatic:
        break;
    }
    throw std::logic_error("make_batch_source: unreachable");
#else
    throw no_fit_error("--device " + device_name(c.device) + " (built without CUDA support) use --device cpu");
#endif
}

} // namespace dstk::data
