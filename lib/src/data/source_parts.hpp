#pragma once
// What the batch sources (host_sources.cpp, device_sources.cpp,
// device_stream.cpp) share: the stream placement's readers, window cache and
// ring; the epoch bookkeeping of the resident placements; and the factory of
// each source, which make_batch_source (batch_source.cpp) picks from.
#include <algorithm>
#include <cstdint>
#include <memory>
#include <optional>
#include <utility>
#include <vector>

#include "dstk/checksum.hpp"
#include "dstk/data/batch_source.hpp"
#include "dstk/data/interrupt.hpp"
#include "dstk/data/stream_reader.hpp"
#include "dstk/data/window_cache.hpp"
#include "host_ring.hpp"
#include "memory_plan.hpp"
#include "source_fields.hpp"

namespace dstk::data {

// The sources, from a resolved configuration (placement, device, order with
// its chunk) over the fields it delivers.
std::unique_ptr<BatchSource> host_stream_source(const Dataset& ds, const SourceFields& f, const SourceConfig& c);
std::unique_ptr<BatchSource> host_resident_source(const Dataset& ds, const SourceFields& f, const SourceConfig& c);
std::unique_ptr<BatchSource> device_stream_source(const Dataset& ds, const SourceFields& f, const SourceConfig& c);
std::unique_ptr<BatchSource> device_resident_source(const Dataset& ds, const SourceFields& f, const SourceConfig& c);
std::unique_ptr<BatchSource> managed_source(const Dataset& ds, const SourceFields& f, const SourceConfig& c);

// Points every field of `b` at data_of(field index), its samples in order (no
// rows), and sets the size.
template <typename DataOf> const Batch* point(Batch& b, std::uint32_t size, DataOf&& data_of) {
    b.size = size;
    for (std::size_t f = 0; f < b.fields.size(); ++f) {
        b.fields[f].data = data_of(f);
        b.fields[f].rows = nullptr;
    }
    return &b;
}

// The pieces a resident placement reads a field of `samples` by (whole
// samples, staging_bytes each): piece(first, count) for each, with an
// interruption point (interrupt.hpp) before each and after the last. A split
// read into memory may take minutes, or wait on a read that never returns.
template <typename Piece> void for_each_piece(std::uint64_t samples, std::uint64_t sample_bytes, Piece&& piece) {
    const std::uint64_t per = staging_bytes(sample_bytes) / sample_bytes;
    for (std::uint64_t first = 0; first < samples; first += per) {
        interruption_point();
        piece(first, std::min(per, samples - first));
    }
    interruption_point();
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

// What the stream sources share: a stream reader per field (O_DIRECT for the
// bulk fields alone: source_fields.hpp says why), the window cache and the
// ring of `slots` host slots in `memory`.
class StreamParts {
  public:
    StreamParts(const Dataset& ds, const SourceFields& f, const SourceConfig& c, unsigned slots, HostMemory memory);

    HostRing& ring() { return *ring_; }
    const HostRing& ring() const { return *ring_; }
    std::uint64_t samples() const { return readers_[0]->samples(); }
    // Starts the ring at `first_batch` of `epoch` with fresh stage counters:
    // what an abandoned iteration's readers counted up to their stop is dropped.
    void restart(std::uint64_t epoch, std::uint64_t first_batch);
    // The lead field's reads are the ones reported (StageTimes::io); the
    // others' counters are taken so that they start afresh too.
    void take_times(StageTimes& t);
    std::uint64_t host_bytes() const { return plan_.total(); }
    std::uint64_t host_resident() const;

  private:
    std::vector<std::unique_ptr<StreamReader>> readers_;
    std::size_t lead_;
    HostPlan plan_;
    std::unique_ptr<WindowCache> cache_;
    std::unique_ptr<HostRing> ring_;
};

// The epoch bookkeeping the resident placements share: the order of the
// epoch, the next batch, and the stage counters. Subclasses turn (first,
// count) into a batch in their memory.
class ResidentSource : public BatchSource {
  public:
    std::uint64_t samples() const override { return samples_; }
    std::uint64_t batches_per_epoch() const override { return batches_; }
    void start_epoch(std::uint64_t epoch, std::uint64_t first_batch) override;
    void release() override {}
    StageTimes take_times() override { return std::exchange(times_, {}); }

  protected:
    ResidentSource(const SourceFields& f, const SourceConfig& c);
    // Advances to the next batch of the epoch: its first position and size.
    bool take(std::uint64_t& first, std::uint32_t& count);

    SourceConfig config_;
    std::uint64_t samples_, row_bytes_, batches_, next_ = 0;
    std::vector<std::uint64_t> sample_bytes_; // per field
    std::unique_ptr<EpochOrder> order_;
    StageTimes times_;
    Batch batch_;
};

} // namespace dstk::data
