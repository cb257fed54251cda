#pragma once
// The engine behind dstk.Loader: a batch source planned by the one entrance
// (source_plan.hpp) plus the data path's last step (convert.hpp), each field
// converted by its kind, into batches a consumer outside the library can hold
// (the Python bindings map their arguments to a LoaderRequest and do nothing
// else):
//
//   cpu backend   each batch is converted into memory the caller gives
//                 (next_host); the source's slot is released at once.
//   cuda backend  a feeder thread takes each batch from the source and
//                 converts it, every field in one launch, on the loader's own
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
//
// Conversion by kind (LoaderRequest::kinds overrides it per field): the input
// role normalised to float32 with field_norm's statistics (the manifest's,
// else a scan of the training split: dstrain's rule); an integer label role
// as classes (int32, or int64 with labels64); every other field as float32
// values; with convert off, every field as stored (but an integer label with
// labels64). A mix's `dataset` and `index` fields stay as stored (int32 and
// int64), and its normalised fields take the mix's statistics (mix_field_norm).
//
// Waits: next_host, next_device and start_epoch wait where the batch or the
// reader threads are not there yet. A read that never returns (a hung network
// filesystem) would hold them forever; a check installed on the calling
// thread (interrupt.hpp) ends them with Interrupted, the loader as it was
// before the call: no batch taken (next may be called again), or, from
// start_epoch, no epoch started (call start_epoch again). The threads stuck in
// the read stay so; the destructor waits for them (it joins every thread it
// started), as does a later start_epoch or stop.
//
// A mix: several datasets as one source (mix_source.hpp), planned by
// plan_mix; plan() then holds the mix's facts (samples and batches per epoch,
// fields, ceilings) over its first member's settings, and mix_plan() the rest.
#include <condition_variable>
#include <cstdint>
#include <exception>
#include <filesystem>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <span>
#include <string>
#include <thread>
#include <vector>

#include "dstk/data/convert.hpp"
#include "dstk/data/mix_plan.hpp"
#include "dstk/data/source_plan.hpp"
#include "dstk/dataset.hpp"

namespace dstk::data {

struct LoaderRequest {
    SourceRequest source;
    // The device: source.device as given, or (device_auto) cuda:0 where a GPU
    // answers, else the cpu backend with a notice saying why.
    bool device_auto = false;
    bool convert = true;                    // off: every field as stored
    std::map<std::string, FieldKind> kinds; // per field, over the default
    bool normalize = true;                  // the input: off, plain float32 values
    std::vector<float> mean, std;           // the input's, per channel; empty: field_norm
    bool labels64 = false;                  // an integer label role as int64 (else int32)
    unsigned keep = 2;                      // cuda: batches a consumer may hold besides the newest
    // A mix (several datasets): one weight per member (empty: their sizes)
    // and one placement for all or per member (empty: automatic); see
    // mix_plan.hpp. The fields `dataset` and `index` are then available.
    std::vector<double> weights;
    std::vector<MixPlacement> mix_placements;
};

// One field as the consumer receives it.
struct FieldOutput {
    std::string name;
    DType stored = DType::u8, dtype = DType::u8; // dtype: as delivered
    Shape shape;                                 // per sample
    FieldKind kind = FieldKind::stored;
    ChannelNorm norm; // normalised: the statistics
    std::uint64_t sample_bytes() const { return dstk::sample_bytes(shape, dtype); }
};

class LoaderSlots; // the cuda backend's device slots (lib/src/data/loader_slots.hpp)

// A converted batch on the GPU: one device pointer per output field.
struct DeviceBatch {
    std::vector<void*> data;
    std::uint32_t size = 0;
    unsigned slot = 0;
    std::shared_ptr<const void> memory; // keeps the slots alive while a consumer holds this batch
};

class Loader {
  public:
    Loader(const std::filesystem::path& dir, const LoaderRequest& request);
    // Two or more: a mix; one: the dataset (weights and mix_placements then
    // are a usage error).
    Loader(const std::vector<std::filesystem::path>& dirs, const LoaderRequest& request);
    ~Loader();
    Loader(const Loader&) = delete;
    Loader& operator=(const Loader&) = delete;

    const SourcePlan& plan() const { return plan_; }
    const MixPlan* mix_plan() const { return mix_ ? &*mix_ : nullptr; }
    const std::vector<FieldOutput>& outputs() const { return outputs_; }
    bool on_gpu() const { return plan_.config.device.backend == Backend::cuda; }
    std::uint64_t samples() const { return plan_.samples; }
    std::uint64_t batches_per_epoch() const { return plan_.batches; }
    std::uint32_t batch() const { return plan_.config.batch; }
    unsigned slots() const; // cuda: keep + 1 + ahead

    // Starts (or restarts) reading at `first_batch` of `epoch`; before the
    // first call there are no batches. Batches converted ahead for an
    // abandoned iteration are dropped.
    void start_epoch(std::uint64_t epoch, std::uint64_t first_batch);
    // cpu: the next batch into out[f] (batch() x outputs()[f].sample_bytes()
    // bytes each); its size, 0 at the end of the epoch.
    std::uint32_t next_host(std::span<void* const> out);
    // cuda: the next batch in the loader's slots; false at the end of the
    // epoch. Rethrows what the feeder met (a corrupt chunk) once the batches
    // before it are taken.
    bool next_device(DeviceBatch& out);
    // cuda: the batch of `size` samples in `slot` (pointers and owner), as next_device gave it.
    DeviceBatch slot_batch(unsigned slot, std::uint32_t size) const;
    // cuda: `stream` (a cudaStream_t; 0 the legacy default stream) waits for
    // the batch in `slot`, and becomes the stream whose work guards slot reuse.
    void wait_ready(unsigned slot, std::uintptr_t stream);

    // Stops the feeder and the source's reader threads until the next
    // start_epoch (a caller that must not wait forever for them, at exit,
    // stops them under a check with a deadline). An interruptible wait.
    void stop();

    // Stage times since the last call; read_wait is the consumer's wait for
    // a batch (on the cuda backend: for the feeder, not the feeder's for the
    // readers). Any thread may ask: it waits while the source's user waits
    // for a batch (interruptible, interrupt.hpp).
    StageTimes take_times();
    std::uint64_t device_bytes() const; // the source's plus the loader's slots
    // The data path's host plan; on the cpu backend also keep + 1 converted
    // batches, the arrays a consumer holds (its own: one that keeps more
    // takes more), as the cuda backend's keep + 1 + ahead slots are GPU memory.
    std::uint64_t host_bytes() const;

    // Converted batches the feeder keeps ready ahead of the consumer.
    static constexpr unsigned ahead = 2;

  private:
    std::vector<FieldConversion> conversions(const Batch& b, std::span<void* const> out, bool device) const;
    void start_feeder();
    void stop_feeder();
    void feed_loop();
    std::uint32_t feed_one(std::uint64_t turn);

    std::vector<Dataset> datasets_; // one, or a mix's members
    SourcePlan plan_;
    std::optional<MixPlan> mix_;
    std::vector<FieldOutput> outputs_;
    std::vector<std::vector<float>> inv_std_; // per output field (normalised ones)
    unsigned keep_;
    std::shared_ptr<LoaderSlots> slots_; // cuda
    std::unique_ptr<BatchSource> source_;
    std::timed_mutex source_mutex_; // the source's user (cpu: the consumer; cuda: the feeder) against take_times

    // cuda: the feeder and the consumer. Turns count batches since
    // construction: turn t lives in slot t % slots.
    std::thread feeder_;
    std::mutex mutex_; // guards what follows
    std::condition_variable changed_;
    std::uint64_t prepared_ = 0; // turns converted into their slots
    std::uint64_t taken_ = 0;    // turns taken by the consumer
    bool stop_ = false, epoch_done_ = true;
    std::exception_ptr error_;
    std::vector<std::uint32_t> sizes_; // per slot: its batch's samples
    double wait_seconds_ = 0;          // the consumer waiting for the feeder
    std::uintptr_t consumer_ = 0;      // the consumer's stream (0: the legacy default stream)
    // The last wait_ready: a batch's fields share a slot, so a second wait is skipped.
    std::uint64_t waited_taken_ = 0;
    unsigned waited_slot_ = ~0u;
};

} // namespace dstk::data
