// The resident sources of the cuda backend: the split in device memory
// (device placement) or in managed memory (managed placement), through the
// runtime interface (dstk/gpu_runtime.hpp).
#include <algorithm>
#include <utility>

#include "clock.hpp"
#include "dstk/data/gpu_ops.hpp"
#include "dstk/error.hpp"
#include "dstk/gpu_runtime.hpp"
#include "dstk/units.hpp"
#include "memory_plan.hpp"
#include "source_parts.hpp"

namespace dstk::data {
namespace {

// Gathers batches in order from a split the GPU can read (device or managed
// memory) into one device batch slot, on the stream the consumer reads
// batches on (the trainer's input stream): stream order alone keeps the slot
// from being overwritten while it is read. The
// epoch's indices go up once per batch; each field is one gather launch.
// With `rows` (SourceConfig::rows) there is no slot and no gather: the batch
// is the split itself and the uploaded indices (BatchField::rows), which
// stream order keeps until the consumer has read them (two sets of indices,
// the older one's upload waited for before it is written again). The gather
// launches, small as they are, took SMs from the step beside them.
class DeviceGather {
  public:
    DeviceGather(std::uint32_t batch, const std::vector<std::uint64_t>& sample_bytes, void* stream, bool rows)
        : batch_(batch), sample_bytes_(sample_bytes), stream_(stream), rows_(rows),
          idx_dev_(gpu::Memory::device, std::uint64_t{batch} * 8 * 2),
          idx_host_(gpu::Memory::pinned, std::uint64_t{batch} * 8 * 2) {
        if (!rows_)
            for (const std::uint64_t sb : sample_bytes_)
                slot_.emplace_back(gpu::Memory::device, std::uint64_t{batch} * sb);
        idx_done_.emplace_back(false);
        idx_done_.emplace_back(false);
    }
    static std::uint64_t bytes(std::uint32_t batch, std::uint64_t row_bytes, bool rows) {
        return (rows ? 0 : std::uint64_t{batch} * row_bytes) + std::uint64_t{batch} * 16;
    }
    // src[f]: field f of the split, sample-major.
    const Batch* gather(Batch& out, const EpochOrder& order, std::uint64_t first, std::uint32_t count,
                        const std::vector<const void*>& src) {
        const unsigned k = turn_++ % 2;
        if (used_[k]) idx_done_[k].synchronize();
        auto* host = idx_host_.as<std::uint64_t>() + std::uint64_t{k} * batch_;
        auto* dev = idx_dev_.as<std::uint64_t>() + std::uint64_t{k} * batch_;
        for (std::uint32_t i = 0; i < count; ++i) host[i] = order[first + i];
        gpu::copy_h2d_async(dev, host, std::uint64_t{count} * 8, stream_);
        idx_done_[k].record(stream_);
        used_[k] = true;
        if (rows_) {
            point(out, count, [&](std::size_t f) { return src[f]; });
            for (BatchField& f : out.fields) f.rows = dev;
            return &out;
        }
        for (std::size_t f = 0; f < slot_.size(); ++f)
            kernels::gather_rows_async(slot_[f].get(), src[f], sample_bytes_[f], dev, count, stream_);
        return point(out, count, [&](std::size_t f) { return slot_[f].get(); });
    }

  private:
    std::uint32_t batch_;
    std::vector<std::uint64_t> sample_bytes_;
    void* stream_;
    bool rows_;
    std::vector<gpu::Buffer> slot_; // per field (none with rows_)
    gpu::Buffer idx_dev_, idx_host_;
    std::vector<gpu::Event> idx_done_;
    bool used_[2] = {false, false};
    unsigned turn_ = 0;
};

// The fields of a split resident in device or managed memory, one allocation
// per field.
struct ResidentFields {
    std::vector<gpu::Buffer> data;
    std::vector<const void*> pointers() const {
        std::vector<const void*> out;
        for (const gpu::Buffer& d : data) out.push_back(d.get());
        return out;
    }
};

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

// ---- device placement, cuda ------------------------------------------------------

class DeviceResidentSource final : public ResidentSource {
  public:
    DeviceResidentSource(const Dataset& ds, const SourceFields& f, const SourceConfig& c) : ResidentSource(f, c) {
        const auto t0 = Clock::now();
        for (std::size_t i = 0; i < f.size(); ++i) {
            split_.data.emplace_back(gpu::Memory::device, checked_mul(samples_, sample_bytes_[i], "split bytes"));
            load(ds.reader(f.split().name, f[i].name), split_.data.back().get(), sample_bytes_[i]);
            staging_ = std::max(staging_, staging_bytes(sample_bytes_[i]));
        }
        src_ = split_.pointers();
        times_.read = seconds_since(t0);
        if (c.order.kind != Order::sequential)
            gather_ = std::make_unique<DeviceGather>(c.batch, sample_bytes_, c.compute_stream, c.rows);
    }

    Placement placement() const override { return Placement::device; }
    const Batch* next() override {
        std::uint64_t first;
        std::uint32_t count;
        if (!take(first, count)) return nullptr;
        return resident_batch(batch_, gather_.get(), *order_, first, count, src_, sample_bytes_);
    }
    std::uint64_t device_bytes() const override {
        return samples_ * row_bytes_ + (gather_ ? DeviceGather::bytes(config_.batch, row_bytes_, config_.rows) : 0);
    }
    std::uint64_t host_bytes() const override { return staging_; }

  private:
    static void load(const FieldReader& r, void* dst, std::uint64_t sb) {
        std::vector<std::uint8_t> staging(staging_bytes(sb));
        for_each_piece(r.samples(), sb, [&](std::uint64_t first, std::uint64_t n) {
            r.read(first, n, staging.data());
            gpu::copy_h2d(static_cast<std::uint8_t*>(dst) + first * sb, staging.data(), n * sb);
        });
    }

    ResidentFields split_;
    std::vector<const void*> src_;
    std::uint64_t staging_ = 0;
    std::unique_ptr<DeviceGather> gather_;
};

// ---- managed placement, cuda -----------------------------------------------------

class ManagedSource final : public ResidentSource {
  public:
    ManagedSource(const Dataset& ds, const SourceFields& f, const SourceConfig& c) : ResidentSource(f, c) {
        const auto t0 = Clock::now();
        for (std::size_t i = 0; i < f.size(); ++i) {
            const std::uint64_t bytes = checked_mul(samples_, sample_bytes_[i], "split bytes");
            split_.data.emplace_back(gpu::Memory::managed, bytes);
            read_into(ds.reader(f.split().name, f[i].name), split_.data.back().get());
            if (c.managed_policy == ManagedPolicy::advise)
                gpu::advise_host_preferred(split_.data.back().get(), bytes, c.device.index);
        }
        src_ = split_.pointers();
        times_.read = seconds_since(t0);
        if (c.order.kind != Order::sequential)
            gather_ = std::make_unique<DeviceGather>(c.batch, sample_bytes_, c.compute_stream, c.rows);
    }
    ~ManagedSource() override {
        if (config_.compute_stream) gpu::synchronize(config_.compute_stream);
        side_stream_.synchronize();
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
    std::uint64_t device_bytes() const override {
        return gather_ ? DeviceGather::bytes(config_.batch, row_bytes_, config_.rows) : 0;
    }
    std::uint64_t host_bytes() const override { return samples_ * row_bytes_; }

  private:
    static void read_into(const FieldReader& r, void* dst) {
        const std::uint64_t sb = r.sample_bytes();
        for_each_piece(r.samples(), sb, [&](std::uint64_t first, std::uint64_t n) {
            r.read(first, n, static_cast<std::uint8_t*>(dst) + first * sb);
        });
    }
    // Samples [first, first + count) of every field to the GPU, on the side stream.
    void prefetch_samples(std::uint64_t first, std::uint64_t count) {
        for (std::size_t f = 0; f < src_.size(); ++f)
            gpu::prefetch_to_device(static_cast<const std::uint8_t*>(src_[f]) + first * sample_bytes_[f],
                                    count * sample_bytes_[f], config_.device.index, side_stream_.get());
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
    gpu::Stream side_stream_;
    std::unique_ptr<DeviceGather> gather_;
};

} // namespace

std::unique_ptr<BatchSource> device_resident_source(const Dataset& ds, const SourceFields& f, const SourceConfig& c) {
    gpu::set_device(c.device.index);
    return std::make_unique<DeviceResidentSource>(ds, f, c);
}

std::unique_ptr<BatchSource> managed_source(const Dataset& ds, const SourceFields& f, const SourceConfig& c) {
    gpu::set_device(c.device.index);
    return std::make_unique<ManagedSource>(ds, f, c);
}

} // namespace dstk::data
