// The sources of the cpu backend (batches in host memory), and the parts the
// stream sources of both backends share.
#include <algorithm>
#include <cstring>
#include <utility>

#include "clock.hpp"
#include "dstk/units.hpp"
#include "memory_plan.hpp"
#include "source_parts.hpp"

namespace dstk::data {
namespace {

// The stream readers of the fields, set to read as this source reads.
std::vector<std::unique_ptr<StreamReader>> open_readers(const Dataset& ds, const SourceFields& f,
                                                        const SourceConfig& c) {
    std::vector<std::unique_ptr<StreamReader>> out;
    for (std::size_t i = 0; i < f.size(); ++i) {
        StreamSettings s;
        s.direct = c.direct && f.bulk(i);
        s.decoded_chunks = decoded_chunks_for(c);
        s.notice = c.notice;
        s.warn = c.warn;
        s.names = c.names;
        out.push_back(StreamReader::open(ds, f.split().name, f[i].name, s));
    }
    return out;
}

std::vector<StreamReader*> pointers(const std::vector<std::unique_ptr<StreamReader>>& readers) {
    std::vector<StreamReader*> out;
    for (const auto& r : readers) out.push_back(r.get());
    return out;
}

// The window cache of a stream source: none for the full order, whose reads
// are single samples wherever they fall. Where the plan drops pages, the bulk
// fields' pages go (source_fields.hpp says why the others stay).
std::unique_ptr<WindowCache> make_cache(const SourceFields& f, const std::vector<StreamReader*>& readers,
                                        const SourceConfig& c) {
    if (c.order.kind == Order::full) return nullptr;
    std::vector<CachedField> cached;
    for (std::size_t i = 0; i < f.size(); ++i) cached.push_back({readers[i], c.host.drop_pages && f.bulk(i)});
    return std::make_unique<WindowCache>(std::move(cached), c.host.cache,
                                         io_threads_for(c.order, c.readers, f.decoded_chunk()));
}

// ---- stream, cpu backend: the host slot is the batch --------------------------

class HostStreamSource final : public BatchSource {
  public:
    HostStreamSource(const Dataset& ds, const SourceFields& f, const SourceConfig& c)
        : parts_(ds, f, c, c.prefetch, plain_host_memory()), batch_(f.batch()), row_bytes_(f.row_bytes()) {
        hash_.on = c.hash_batches;
    }

    Placement placement() const override { return Placement::stream; }
    std::uint64_t samples() const override { return parts_.samples(); }
    std::uint64_t batches_per_epoch() const override { return parts_.ring().batches(); }
    void chain_epochs(std::uint64_t end) override { parts_.ring().chain(end); }
    void start_epoch(std::uint64_t epoch, std::uint64_t first_batch) override {
        parts_.restart(epoch, first_batch);
        times_ = {};
        StageTimes dropped;
        hash_.take(dropped);
    }
    const Batch* next() override {
        const RingSlot* s = parts_.ring().acquire();
        if (!s) return nullptr;
        point(batch_, s->size, [&](std::size_t f) { return s->fields[f]; });
        hash_.add(batch_);
        times_.batches += 1;
        times_.samples += s->size;
        times_.bytes += s->size * row_bytes_;
        return &batch_;
    }
    void release() override { parts_.ring().release(); }
    void stop() override { parts_.ring().stop(); }
    StageTimes take_times() override {
        StageTimes t = std::exchange(times_, {});
        parts_.take_times(t);
        hash_.take(t);
        return t;
    }
    std::uint64_t device_bytes() const override { return parts_.ring().host_bytes(); }
    std::uint64_t host_bytes() const override { return parts_.host_bytes(); }
    std::uint64_t host_resident() const override { return parts_.host_resident(); }

  private:
    StreamParts parts_;
    Batch batch_;
    std::uint64_t row_bytes_;
    StageTimes times_;
    BatchHash hash_;
};

// ---- device placement, cpu backend: the split in host memory ------------------

class HostResidentSource final : public ResidentSource {
  public:
    HostResidentSource(const Dataset& ds, const SourceFields& f, const SourceConfig& c) : ResidentSource(f, c) {
        hash_.on = c.hash_batches;
        const auto t0 = Clock::now();
        for (std::size_t i = 0; i < f.size(); ++i) {
            const std::uint64_t sb = sample_bytes_[i];
            data_.emplace_back(checked_mul(samples_, sb, "split bytes"));
            const FieldReader& r = ds.reader(f.split().name, f[i].name);
            std::uint8_t* dst = data_.back().data();
            for_each_piece(samples_, sb,
                           [&](std::uint64_t first, std::uint64_t n) { r.read(first, n, dst + first * sb); });
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

} // namespace

StreamParts::StreamParts(const Dataset& ds, const SourceFields& f, const SourceConfig& c, unsigned slots,
                         HostMemory memory)
    : readers_(open_readers(ds, f, c)), lead_(f.lead()), plan_(c.host), cache_(make_cache(f, pointers(readers_), c)),
      ring_(std::make_unique<HostRing>(pointers(readers_), c.batch, c.drop_last, c.slice, c.order, slots, c.readers,
                                       std::move(memory), cache_.get())) {}

void StreamParts::restart(std::uint64_t epoch, std::uint64_t first_batch) {
    ring_->stop();
    StageTimes dropped;
    take_times(dropped);
    ring_->start(epoch, first_batch);
}

void StreamParts::take_times(StageTimes& t) {
    t.read_wait = ring_->take_wait_seconds();
    if (cache_) {
        const CacheStats cs = cache_->take_stats();
        t.decode = 0;
        for (const auto& r : readers_) t.decode += r->take_decode_seconds();
        t.read = std::max(0.0, cs.io_seconds - t.decode);
        t.io = cs.io[lead_];
        t.fields_io = cs.io;
        t.cache_peak = cs.peak;
    } else {
        t.decode = ring_->take_decode_seconds();
        t.read = std::max(0.0, ring_->take_read_seconds() - t.decode);
        for (const auto& r : readers_) t.fields_io.push_back(r->take_io());
        t.io = t.fields_io[lead_];
    }
}

std::uint64_t StreamParts::host_resident() const {
    return ring_->host_bytes() + (cache_ ? cache_->resident_bytes() : 0);
}

ResidentSource::ResidentSource(const SourceFields& f, const SourceConfig& c)
    : config_(c), samples_(f.samples()), row_bytes_(f.row_bytes()),
      batches_(c.slice.batches(samples_, c.batch, c.drop_last)), batch_(f.batch()) {
    for (std::size_t i = 0; i < f.size(); ++i) sample_bytes_.push_back(f[i].sample_bytes());
}

void ResidentSource::start_epoch(std::uint64_t epoch, std::uint64_t first_batch) {
    order_ = std::make_unique<EpochOrder>(config_.order, samples_, epoch);
    next_ = std::min(first_batch, batches_);
    times_ = {};
}

bool ResidentSource::take(std::uint64_t& first, std::uint32_t& count) {
    if (next_ >= batches_) return false;
    first = config_.slice.first_position(next_, config_.batch);
    count = static_cast<std::uint32_t>(std::min<std::uint64_t>(config_.batch, samples_ - first));
    ++next_;
    times_.batches += 1;
    times_.samples += count;
    times_.bytes += count * row_bytes_;
    return true;
}

std::unique_ptr<BatchSource> host_stream_source(const Dataset& ds, const SourceFields& f, const SourceConfig& c) {
    return std::make_unique<HostStreamSource>(ds, f, c);
}

std::unique_ptr<BatchSource> host_resident_source(const Dataset& ds, const SourceFields& f, const SourceConfig& c) {
    return std::make_unique<HostResidentSource>(ds, f, c);
}

} // namespace dstk::data
