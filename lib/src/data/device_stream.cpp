// The stream placement on the cuda backend: the host ring (pinned slots) ->
// copies on a copy stream -> device slots, through the runtime interface
// (dstk/gpu_runtime.hpp).
#include <algorithm>
#include <deque>
#include <utility>

#include "dstk/gpu_runtime.hpp"
#include "source_parts.hpp"

namespace dstk::data {
namespace {

HostMemory pinned_host_memory() {
    // Pinned slots owned by the ring: it frees what it allocated.
    auto owned = std::make_shared<std::vector<gpu::Buffer>>();
    return {[owned](std::uint64_t bytes) -> void* {
                owned->emplace_back(gpu::Memory::pinned, bytes);
                return owned->back().get();
            },
            [owned](void* p) { std::erase_if(*owned, [p](const gpu::Buffer& b) { return b.get() == p; }); }};
}

class DeviceStreamSource final : public BatchSource {
  public:
    DeviceStreamSource(const Dataset& ds, const SourceFields& f, const SourceConfig& c)
        : config_(c), slots_count_(std::max(c.prefetch, 2u)), row_bytes_(f.row_bytes()),
          parts_(ds, f, c, slots_count_, pinned_host_memory()), batch_(f.batch()) {
        // The device slots mirror the host slots' layout: a batch crosses in one copy.
        for (unsigned k = 0; k < slots_count_; ++k)
            slots_.push_back(Slot{gpu::Buffer(gpu::Memory::device, layout().bytes)});
    }
    ~DeviceStreamSource() override {
        // Device slots must outlive the copies and steps that use them.
        if (config_.compute_stream) gpu::synchronize(config_.compute_stream);
        copy_stream_.synchronize();
    }

    Placement placement() const override { return Placement::stream; }
    std::uint64_t samples() const override { return parts_.samples(); }
    std::uint64_t batches_per_epoch() const override { return parts_.ring().batches(); }
    void chain_epochs(std::uint64_t end) override { parts_.ring().chain(end); }
    void start_epoch(std::uint64_t epoch, std::uint64_t first_batch) override {
        drain();
        parts_.restart(epoch, first_batch);
        times_ = {};
    }
    const Batch* next() override {
        const RingSlot* h = parts_.ring().acquire();
        if (!h) return nullptr;
        const std::size_t k = turn_++ % slots_.size();
        Slot& d = slots_[k];
        if (d.used) gpu::wait(copy_stream_.get(), d.computed);
        d.copy_start.record(copy_stream_.get());
        gpu::copy_h2d_async(d.memory.get(), h->fields[0], layout().span(h->size), copy_stream_.get());
        d.copied.record(copy_stream_.get());
        gpu::wait(config_.compute_stream, d.copied);
        d.used = true;
        pending_.push_back(k);
        current_ = k;
        times_.batches += 1;
        times_.samples += h->size;
        times_.bytes += h->size * row_bytes_;
        return point(batch_, h->size, [&](std::size_t f) { return d.memory.as<std::uint8_t>() + layout().offsets[f]; });
    }
    void release() override {
        slots_[current_].computed.record(config_.compute_stream);
        // A host slot is free once its copy has landed; keep one copy in flight.
        while (!pending_.empty() && (pending_.size() > 1 || slots_[pending_.front()].copied.done())) retire();
    }
    void stop() override { parts_.ring().stop(); }
    StageTimes take_times() override {
        StageTimes t = std::exchange(times_, {});
        parts_.take_times(t);
        return t;
    }
    std::uint64_t device_bytes() const override { return std::uint64_t{slots_count_} * layout().bytes; }
    std::uint64_t host_bytes() const override { return parts_.host_bytes(); }
    std::uint64_t host_resident() const override { return parts_.host_resident(); }

  private:
    struct Slot {
        gpu::Buffer memory; // every field, at the ring's layout
        gpu::Event copy_start{true}, copied{true}, computed{false};
        bool used = false;
    };
    const SlotLayout& layout() const { return parts_.ring().layout(); }
    void retire() {
        Slot& s = slots_[pending_.front()];
        s.copied.synchronize();
        times_.h2d += s.copied.elapsed_ms(s.copy_start) / 1000.0;
        pending_.pop_front();
        parts_.ring().release();
    }
    void drain() {
        while (!pending_.empty()) retire();
    }

    SourceConfig config_;
    unsigned slots_count_;
    std::uint64_t row_bytes_;
    StreamParts parts_;
    gpu::Stream copy_stream_;
    std::vector<Slot> slots_;
    std::deque<std::size_t> pending_;
    std::size_t turn_ = 0, current_ = 0;
    StageTimes times_;
    Batch batch_;
};

} // namespace

std::unique_ptr<BatchSource> device_stream_source(const Dataset& ds, const SourceFields& f, const SourceConfig& c) {
    gpu::set_device(c.device.index);
    return std::make_unique<DeviceStreamSource>(ds, f, c);
}

} // namespace dstk::data
