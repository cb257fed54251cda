#pragma once
// The engine behind dstk.Loader: the library's BatchSource (readers, ring,
// copy stream, the placements and orders dstrain uses) plus the last step
// dstrain's trainer does on a batch, the conversion to float with per-channel
// normalisation, into batches a Python consumer can hold:
//
//   cpu backend   each batch is copied (converted) into fresh host memory the
//                 caller owns; the source's slot is released at once.
//   cuda backend  each batch is converted (or copied, convert off) on the
//                 loader's own stream into one of keep + 1 device slots the
//                 loader owns; the source's slot is released behind that work.
//                 A consumer makes its stream wait for the batch
//                 (wait_ready); slot n % (keep + 1) is overwritten when batch
//                 n + keep + 1 is taken, after the work the consumer had
//                 enqueued on its stream before it took batch n + keep.
#include <cstdint>
#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include "dstk/data/batch_source.hpp"
#include "dstk/dataset.hpp"

namespace dstk::py {

struct LoaderConfig {
    std::string split = "train";
    data::SourceConfig source;    // placement resolved, device, order, batch, prefetch, readers, direct
    bool convert = true;          // float32 (x - mean) / std; off: the stored dtype as is
    bool normalize = true;        // off: plain float (mean 0, std 1)
    std::vector<float> mean, std; // per channel in stored units; empty: the manifest's stats
    unsigned keep = 2;            // cuda: batches a consumer may hold besides the newest
};

// Device memory the loader's batches live in; shared with every exported
// batch so that it outlives the loader while Python holds one.
class DeviceSlots;

struct DeviceBatch {
    void* x = nullptr;
    std::int32_t* y = nullptr;
    std::uint32_t size = 0;
    unsigned slot = 0;
    std::shared_ptr<DeviceSlots> memory;
};

class Loader {
  public:
    Loader(const std::filesystem::path& dir, const LoaderConfig& config);
    ~Loader();
    Loader(const Loader&) = delete;
    Loader& operator=(const Loader&) = delete;

    bool on_gpu() const { return config_.source.device.backend == train::Backend::cuda; }
    const LoaderConfig& config() const { return config_; }
    const FieldInfo& x_field() const { return *x_; }
    DType out_dtype() const { return config_.convert ? DType::f32 : x_->dtype; }
    std::uint64_t out_sample_bytes() const { return x_->shape.numel() * dtype_size(out_dtype()); }
    std::uint64_t samples() const { return source_->samples(); }
    std::uint64_t batches_per_epoch() const { return source_->batches_per_epoch(); }
    const std::vector<float>& mean() const { return mean_; }
    const std::vector<float>& stdev() const { return std_; }

    void start_epoch(std::uint64_t epoch, std::uint64_t first_batch);
    // cpu: the next batch into x (batch * out_sample_bytes) and y (batch
    // labels); returns its size, 0 at the end of the epoch.
    std::uint32_t next_host(void* x, std::int32_t* y);
    // cuda: the next batch in the loader's slots; false at the end of the epoch.
    bool next_device(DeviceBatch& out);
    // cuda: `stream` (a cudaStream_t; 0 the legacy default stream) waits for
    // the batch in `slot`, and becomes the stream whose work guards slot reuse.
    void wait_ready(unsigned slot, std::uintptr_t stream);

    data::StageTimes take_times() { return source_->take_times(); }
    std::uint64_t device_bytes() const; // the source's plus the loader's slots
    std::uint64_t host_bytes() const { return source_->host_bytes(); }

  private:
    void resolve_stats(const Dataset& ds);
    void convert_host(const train::Batch& b, void* x, std::int32_t* y) const;

    LoaderConfig config_;
    Dataset dataset_;
    const FieldInfo* x_ = nullptr;
    std::uint32_t channels_ = 1;
    std::uint64_t hw_ = 1;
    std::vector<float> mean_, std_, inv_std_;
    std::shared_ptr<DeviceSlots> slots_; // cuda
    std::unique_ptr<data::BatchSource> source_;
    std::uint64_t taken_ = 0;     // batches taken since construction (cuda slot turns)
    std::uintptr_t consumer_ = 0; // cuda: the consumer's stream (0: the legacy default stream)
    // The last wait_ready: x and y of one batch share a slot, so the second wait is skipped.
    std::uint64_t waited_taken_ = 0;
    unsigned waited_slot_ = ~0u;
};

} // namespace dstk::py
