#pragma once
// The training engine: one network, one optimiser, one backend.
//
// Design (the seam for the data path, issue 7):
// - A Trainer never reads datasets. It is handed batches of named fields
//   (dstk/batch.hpp) and takes those it names (batch_fields): the input
//   (TrainerConfig::input_field, `size` samples in the dataset's stored dtype:
//   u8, bf16, f16, f32), each head's target field (NetworkPlan::heads:
//   integer classes for ce, any numeric dtype otherwise) and the side input
//   (TrainerConfig::side, any numeric dtype). For the cuda backend the fields
//   are device memory, for the cpu backend host memory. Where the batch came
//   from (a resident split, a pinned ring, managed memory) is the caller's
//   business.
// - train_step(batch) does convert + normalise (input, side input, targets
//   to float or int32 classes) -> forward -> every head's loss -> backward ->
//   optimiser update. On the GPU it is asynchronous on compute_stream() (a
//   cudaStream_t, as void*) and replays a captured CUDA graph (the heads and
//   losses inside): no allocation and no host synchronisation per step. The
//   batch's fields are read on input_stream() (the conversion, which runs
//   beside the step before): the caller orders the batch before work on it
//   and may reuse the batch memory once work it enqueues there after
//   train_step (an event) has completed.
// - evaluate(batch) runs the network in eval mode (BN running statistics, no
//   dropout) and accumulates every head's loss and metrics (metrics.hpp);
//   they are read with take_train_metrics() / take_eval_metrics(), which
//   synchronise.
// - Memory is planned: memory_plan() is known before the first step and every
//   device buffer is allocated in the constructor (batches up to max_batch).
// - save_state() / load_state() move parameters, BN running statistics,
//   optimiser slots and the step counter as one host byte blob (checkpoints),
//   identical between backends.
#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <stdexcept>
#include <string>
#include <string_view>
#include <vector>

#include "dstk/batch.hpp"
#include "dstk/device.hpp"
#include "dstk/dtype.hpp"
#include "dstk/train/metrics.hpp"
#include "dstk/train/model.hpp"
#include "dstk/train/optimizer.hpp"

namespace dstk::dist {
class Reducer;
}

namespace dstk::train {

// The device names are the core's (dstk/device.hpp); the trainer's code says them unqualified.
using dstk::Backend;
using dstk::Device;
using dstk::device_name;
using dstk::parse_device;

// fp32: float math, FMA convolution algorithms only (no FFT or non-fused
// Winograd); tf32: float storage, TF32 tensor cores in convolutions and matrix
// products; bf16: mixed precision: bf16 activations, activation gradients and
// compute copies of the conv/linear weights, float accumulation in cuDNN and
// cuBLAS, fp32 master weights, gradients, optimiser state, BN statistics and
// loss (GPUs of compute capability 8.0 and later). The cpu backend computes
// fp32 whatever is asked.
enum class Precision : std::uint8_t { fp32, tf32, bf16 };

// dstrain --kernels: where each convolution's kernel choice comes from
// (choice_cache.hpp keeps the decisions).
//   automatic: the choice cache; what it lacks is timed and stored.
//   cached:    the choice cache only; what it lacks gets the heuristic choice,
//              untimed and not stored.
//   retune:    every choice timed again, the cache's entries overwritten.
//   heuristic: no timing and no cache: cuDNN's ranked heuristic and dstk's
//              fixed rules (own kernels wherever they apply).
enum class KernelMode : std::uint8_t { automatic, cached, retune, heuristic };
KernelMode parse_kernel_mode(std::string_view text); // auto | cached | retune | heuristic; usage error otherwise
std::string_view kernel_mode_name(KernelMode m);

// Where a choice came from, as the run reports it: the cache, timing in this
// run, cuDNN's heuristic, or a fixed rule (DSTK_CONV_KERNELS, a kernel that is
// always used where it applies).
enum class ChoiceSource : std::uint8_t { cache, timed, heuristic, rule };
std::string_view choice_source_name(ChoiceSource s);

// The kernel one operation of one layer runs.
struct KernelReport {
    std::size_t layer = 0;
    std::string op;     // "fwd", "bwd_data", "bwd_filter"
    std::string kernel; // e.g. "cudnn:1:tensor", "own:tc_wgrad", "own:direct_conv"
    ChoiceSource source = ChoiceSource::rule;
    double median_ms = 0.0; // timed or cached: the median time; else 0
};

Precision parse_precision(std::string_view text);
std::string_view precision_name(Precision p);
// The sample dtypes a model reads (its input conversion's): u8, bf16, f16, f32.
bool is_input_dtype(DType t);

struct TrainerConfig {
    NetworkPlan plan;
    std::string input_field = "x"; // the input's batch field (the targets': plan.heads)
    DType input_dtype = DType::f32;
    std::vector<float> mean, std; // per input channel, in stored units; x' = (x - mean) / std
    SideInput side;               // plan.side values per sample
    std::uint32_t max_batch = 256;
    Precision precision = Precision::tf32;
    OptimizerConfig optimizer;
    ScheduleConfig schedule;
    float label_smoothing = 0.0f; // ce heads
    std::uint64_t seed = 0;       // parameter init and dropout masks
    Device device;
    unsigned cpu_threads = 0;                                 // cpu backend: 0 = one per hardware thread
    std::uint64_t workspace_limit = std::uint64_t{256} << 20; // cuda: cuDNN workspace bound
    // cuda: only algorithms and kernels whose results do not depend on
    // scheduling: cuDNN algorithms reported deterministic (our kernels never
    // add floats with atomics). Two runs (or a run and its resume) give the
    // same weights when they run the same kernels: the choice cache (or
    // KernelMode::heuristic) makes their choices the same. The cpu backend is
    // deterministic always.
    bool deterministic = false;
    // cuda: how convolution kernels are chosen, and the choice cache's
    // directory (empty: default_choice_dir(), $XDG_CACHE_HOME/dstk or
    // ~/.cache/dstk).
    KernelMode kernels = KernelMode::automatic;
    std::string choice_dir;
};

// The fields a trainer takes from a batch, in order: the input, each head's
// target (a field that several heads learn, once), the side input; with their
// dtype and per-sample shape (data null).
std::vector<BatchField> batch_fields(const TrainerConfig& c);
// A batch over buffers the caller holds in the trainer's backend memory,
// data[i] holding batch_fields(c)[i]: for code that feeds a trainer without a
// BatchSource (dstrain eval and predict, tests).
Batch step_batch(const TrainerConfig& c, std::span<const void* const> data, std::uint32_t size);
// The same for a trainer of two fields: the input and one target.
Batch step_batch(const TrainerConfig& c, const void* x, const void* y, std::uint32_t size);

// A measurement of no batches yet: the plan's heads, named and sized.
Metrics empty_metrics(const NetworkPlan& plan);

struct MemoryPlan {
    std::uint64_t parameters = 0;  // params, grads, optimiser slots, BN statistics (+ bf16 copies)
    std::uint64_t activations = 0; // forward tensors kept for backward, gradient buffers, stats scratch
    std::uint64_t workspace = 0;   // cuDNN / cuBLAS workspaces
    std::uint64_t total() const { return parameters + activations + workspace; }
};

class Trainer {
  public:
    virtual ~Trainer() = default;

    virtual const TrainerConfig& config() const = 0;
    virtual MemoryPlan memory_plan() const = 0;
    // Device bytes the process gained from constructing this trainer, measured
    // with cudaMemGetInfo (0 on the cpu backend).
    virtual std::uint64_t measured_device_bytes() const = 0;

    virtual void train_step(const Batch& b) = 0;
    virtual void evaluate(const Batch& b) = 0;
    virtual Metrics take_train_metrics() = 0; // synchronises, then resets
    virtual Metrics take_eval_metrics() = 0;
    // First training step (0-based, counted since construction or load_state)
    // whose loss was NaN or Inf, if any. Synchronises.
    virtual std::optional<std::uint64_t> first_nonfinite_step() = 0;
    virtual std::uint64_t steps() const = 0; // optimiser steps taken
    virtual void synchronize() = 0;
    virtual void* compute_stream() const = 0; // cudaStream_t on cuda, nullptr on cpu
    // Where batches are read (see above); the compute stream where no other.
    virtual void* input_stream() const { return compute_stream(); }
    // Whether the batch's fields may come as a resident split and the rows
    // of the batch (BatchField::rows, data::SourceConfig::rows): the cuda
    // backend's conversion reads them where they lie, with no gather before.
    virtual bool reads_rows() const { return false; }
    // The kernel each convolution operation runs and where the choice came
    // from (empty on the cpu backend).
    virtual std::vector<KernelReport> kernel_choices() const { return {}; }

    virtual std::vector<std::uint8_t> save_state() = 0;
    virtual void load_state(std::span<const std::uint8_t> blob) = 0; // runtime error on a mismatched blob

    // Data-parallel training (dstk/dist/reducer.hpp). After set_reducer the
    // parameters are rank 0's (broadcast) and every train_step averages the
    // gradients over the ranks before the update; nullptr returns to one
    // process. average_states averages the BN running statistics (before an
    // evaluation, a checkpoint or a saved model). The reducer outlives the
    // trainer's use of it.
    // The defaults are those of a backend without data-parallel support.
    virtual void set_reducer(dist::Reducer* reducer) {
        if (reducer) throw std::logic_error("this training backend has no data-parallel support");
    }
    virtual void average_states() {}

    // Inspection, for tests and tools: one forward + backward in training mode
    // without the update; then read tensors back as NCHW float.
    virtual void compute_gradients(const Batch& b) = 0;
    virtual std::vector<float> read_activation(std::size_t layer) = 0; // output of layers[layer]
    virtual std::vector<float> read_input_gradient() = 0;              // d loss / d normalised input
    virtual std::vector<float> read_gradients() = 0;                   // flat, plan order
    virtual std::vector<float> read_parameters() = 0;
    virtual std::vector<float> read_states() = 0; // BN running statistics
    virtual void write_parameters(std::span<const float> params) = 0;
};

// Memory of a backend (device memory for cuda, host memory for cpu), counted
// by nobody but its owner: a resident split, a batch slot.
class BackendBuffer {
  public:
    virtual ~BackendBuffer() = default;
    virtual void* data() = 0;
    virtual std::uint64_t bytes() const = 0;
    // Synchronous copy from host memory into [offset, offset + bytes).
    virtual void upload(std::uint64_t offset, const void* src, std::uint64_t bytes) = 0;
};
std::unique_ptr<BackendBuffer> make_backend_buffer(const Device& device, std::uint64_t bytes);

// One line per convolution layer: each operation's kernel and where its
// choice came from, e.g. "L3 conv 32->64 at 16x16: fwd cudnn:1:tensor (cache
// 0.0520 ms), bwd_data ..., bwd_filter own:tc_wgrad (timed 0.0380 ms)".
std::vector<std::string> kernel_choice_lines(const std::vector<KernelReport>& reports, const NetworkPlan& plan);

// The cpu backend's memory_plan() for `config`, computed from the plan
// without allocating (dsplan sizes a model with it whatever the batch).
MemoryPlan cpu_memory_plan(const TrainerConfig& config);

// Throws Error(no_fit) "built without CUDA support" / "no CUDA GPU" for cuda
// when unavailable.
std::unique_ptr<Trainer> make_trainer(const TrainerConfig& config);

// Layout of save_state(): magic "DSTKTRN1", u64 params, u64 states, u64 slot
// floats, u64 step, then the float arrays.
inline constexpr std::string_view state_magic = "DSTKTRN1";

} // namespace dstk::train
