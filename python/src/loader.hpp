#pragma once
// The engine behind dstk.Loader: the library's BatchSource (readers, ring,
// copy stream, the placements and orders dstrain uses) plus the last step
// dstrain's trainer does on a batch, the conversion to float with per-channel
// normalisation, into batches a Python consumer can hold:
//
//   cpu backend   each batch is copied (converted) into fresh host memory the
//                 caller owns; the source's slot is released at once.
//   cuda backend  a feeder thread takes each batch from the source and
//                 converts it (or copies it, convert off) on the loader's own
//                 stream into one of keep + 1 + ahead device slots the loader
//                 owns, up to `ahead` batches before the consumer takes them;
//                 the source's slot is released behind that work. Taking a
//                 batch is then a handful of calls on the consumer's thread,
//                 which a CPU-bound training step (a compiled PyTorch step)
//                 would otherwise pay on every batch. A consumer makes its
//                 stream wait for the batch (wait_ready). The consumer may hold
//                 the newest batch and keep before it: the slot of batch n is
//                 overwritten (by batch n + keep + 1 + ahead) only once batch
//                 n + keep + 1 is taken, after the work the consumer had
//                 enqueued on its stream before that.
#include <condition_variable>
#include <cstdint>
#include <exception>
#include <filesystem>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
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
    bool labels64 = false;        // y as int64 (what PyTorch's losses take); off: int32 as stored
};

// Device memory the loader's batches live in; shared with every exported
// batch so that it outlives the loader while Python holds one.
class DeviceSlots;

struct DeviceBatch {
    void* x = nullptr;
    void* y = nullptr; // int32 or, with labels64, int64
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

    bool on_gpu() const { return config_.source.device.backend == Backend::cuda; }
    const LoaderConfig& config() const { return config_; }
    const FieldInfo& x_field() const { return *x_; }
    DType out_dtype() const { return config_.convert ? DType::f32 : x_->dtype; }
    std::uint64_t out_sample_bytes() const { return x_->shape.numel() * dtype_size(out_dtype()); }
    std::uint64_t label_bytes() const { return config_.labels64 ? 8 : 4; }
    std::uint64_t samples() const { return source_->samples(); }
    std::uint64_t batches_per_epoch() const { return source_->batches_per_epoch(); }
    const std::vector<float>& mean() const { return mean_; }
    const std::vector<float>& stdev() const { return std_; }

    // Starts (or restarts) reading at `first_batch` of `epoch`; before the
    // first call there are no batches.
    void start_epoch(std::uint64_t epoch, std::uint64_t first_batch);
    // cpu: the next batch into x (batch * out_sample_bytes) and y (batch *
    // label_bytes); returns its size, 0 at the end of the epoch.
    std::uint32_t next_host(void* x, void* y);
    // cuda: the next batch in the loader's slots; false at the end of the
    // epoch. Rethrows what the feeder met (a corrupt chunk) once the batches
    // before it are taken.
    bool next_device(DeviceBatch& out);
    // cuda: the batch of `size` samples in `slot` (pointers and owner), as next_device gave it.
    DeviceBatch slot_batch(unsigned slot, std::uint32_t size) const;
    // cuda: `stream` (a cudaStream_t; 0 the legacy default stream) waits for
    // the batch in `slot`, and becomes the stream whose work guards slot reuse.
    void wait_ready(unsigned slot, std::uintptr_t stream);

    // Stage times since the last call; read_wait is the consumer's wait for
    // a batch (on the cuda backend: for the feeder, not the feeder's for the readers).
    data::StageTimes take_times();
    std::uint64_t device_bytes() const; // the source's plus the loader's slots
    std::uint64_t host_bytes() const { return source_->host_bytes(); }

    // Converted batches the feeder keeps ready ahead of the consumer.
    static constexpr unsigned ahead = 2;

  private:
    void resolve_stats(const Dataset& ds);
    // The input and labels of a source batch.
    struct XY {
        const void* x;
        const std::int32_t* y;
        std::uint32_t size;
    };
    XY xy(const Batch& b) const;
    void convert_host(const XY& b, void* x, void* y) const;
    void start_feeder();
    void stop_feeder();
    void feed_loop();
    // Converts the source's next batch into turn's slot; its samples, 0 at the end of the epoch.
    std::uint32_t feed_one(std::uint64_t turn);

    LoaderConfig config_;
    Dataset dataset_;
    const FieldInfo* x_ = nullptr;
    std::uint32_t channels_ = 1;
    std::uint64_t hw_ = 1;
    std::vector<float> mean_, std_, inv_std_;
    std::shared_ptr<DeviceSlots> slots_; // cuda
    std::unique_ptr<data::BatchSource> source_;
    std::mutex source_mutex_; // cuda: the feeder's use of the source against take_times

    // cuda: the feeder and the consumer. Turns count batches since
    // construction: turn t lives in slot t % slots.
    std::thread feeder_;
    std::mutex mutex_; // guards what follows
    std::condition_variable changed_;
    std::uint64_t prepared_ = 0; // turns converted into their slots
    std::uint64_t taken_ = 0;    // turns taken by the consumer
    bool stop_ = false, epoch_done_ = false;
    std::exception_ptr error_;
    std::vector<std::uint32_t> sizes_; // per slot: its batch's samples
    double wait_seconds_ = 0;          // the consumer waiting for the feeder
    std::uintptr_t consumer_ = 0;      // the consumer's stream (0: the legacy default stream)
    // The last wait_ready: x and y of one batch share a slot, so the second wait is skipped.
    std::uint64_t waited_taken_ = 0;
    unsigned waited_slot_ = ~0u;
};

} // namespace dstk::py
