#include "dstk/run/train_run.hpp"

#include <algorithm>
#include <array>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <iostream>
#include <map>
#include <memory>
#include <optional>
#include <sstream>
#include <vector>

#include <nlohmann/json.hpp>

#include "dstk/bench/results.hpp"
#include "dstk/checkpoint.hpp"
#include "dstk/data/batch_source.hpp"
#include "dstk/run/tuning.hpp"
#include "dstk/dataset.hpp"
#include "dstk/error.hpp"
#include "dstk/gpu_info.hpp"
#include "dstk/signals.hpp"
#include "dstk/sysinfo.hpp"
#include "dstk/thread_pool.hpp"
#include "dstk/train/trainer.hpp"
#include "dstk/units.hpp"
#include "data/device_memory.hpp"
#include "clock.hpp"
#if defined(DSTK_HAVE_CUDA)
#include "dstk/data/gpu_ops.hpp"
#endif

namespace fs = std::filesystem;

namespace dstk::data {
namespace {

constexpr std::uint64_t default_chunk_bytes = 4ull << 20;
constexpr std::uint64_t stats_samples = 4096;

std::string fixed(double v, int digits) {
    char buf[64];
    std::snprintf(buf, sizeof buf, "%.*f", digits, v);
    return buf;
}

train::Device choose_device(const train::RunOptions& e, const OutputOptions& out) {
    if (e.device) return *e.device;
    std::string why;
    if (!detect_gpus(&why).empty()) return {train::Backend::cuda, 0};
    note(out, "dstrain: no GPU (" + why + "): training on the CPU");
    return {train::Backend::cpu, 0};
}

// Per-channel mean and std in stored units: from the manifest, or computed
// once from up to 4096 samples spread evenly over the training split.
void channel_stats(const Dataset& ds, const FieldInfo& x, std::uint64_t samples, std::uint32_t channels,
                   std::vector<float>& mean, std::vector<float>& stdev) {
    const Manifest& m = ds.manifest();
    if (m.stats && m.stats->mean.size() == channels && m.stats->std.size() == channels) {
        for (std::uint32_t c = 0; c < channels; ++c) {
            mean.push_back(static_cast<float>(m.stats->mean[c]));
            stdev.push_back(static_cast<float>(std::max(m.stats->std[c], 1e-6)));
        }
        return;
    }
    const FieldReader& r = ds.reader(m.split("train").name, x.name);
    const std::uint64_t take = std::min(samples, stats_samples);
    const std::uint64_t sb = x.sample_bytes(), per_channel = x.shape.numel() / channels;
    std::vector<std::uint8_t> buf(sb);
    std::vector<double> sum(channels, 0.0), sq(channels, 0.0);
    for (std::uint64_t k = 0; k < take; ++k) {
        r.read(k * samples / take, 1, buf.data());
        for (std::uint64_t e = 0; e < x.shape.numel(); ++e) {
            double v = 0;
            switch (x.dtype) {
            case DType::u8:
                v = buf[e];
                break;
            case DType::bf16:
                v = bf16_to_float(reinterpret_cast<const std::uint16_t*>(buf.data())[e]);
                break;
            case DType::f16:
                v = f16_to_float(reinterpret_cast<const std::uint16_t*>(buf.data())[e]);
                break;
            case DType::f32:
                v = reinterpret_cast<const float*>(buf.data())[e];
                break;
            default:
                break; // refused by the trainer's config check
            }
            sum[e / per_channel] += v;
            sq[e / per_channel] += v * v;
        }
    }
    const double n = static_cast<double>(take * per_channel);
    for (std::uint32_t c = 0; c < channels; ++c) {
        const double mu = sum[c] / n;
        mean.push_back(static_cast<float>(mu));
        stdev.push_back(static_cast<float>(std::sqrt(std::max(sq[c] / n - mu * mu, 1e-12))));
    }
}

// Training-mode compute time: wall time of train_step on the cpu; on cuda
// events around each step on the compute stream, read back lazily.
class ComputeTimer {
  public:
    explicit ComputeTimer(void* stream) : stream_(stream) {
#if defined(DSTK_HAVE_CUDA)
        if (stream_)
            for (auto& p : pairs_) p = {gpu::event_create(true), gpu::event_create(true), false};
#endif
    }
    ~ComputeTimer() {
#if defined(DSTK_HAVE_CUDA)
        if (stream_)
            for (auto& p : pairs_) {
                gpu::event_destroy(p.start);
                gpu::event_destroy(p.end);
            }
#endif
    }
    ComputeTimer(const ComputeTimer&) = delete;
    ComputeTimer& operator=(const ComputeTimer&) = delete;

    template <class F> void time(F&& step) {
        if (!stream_) {
            const auto t0 = Clock::now();
            step();
            seconds_ += seconds_since(t0);
            return;
        }
#if defined(DSTK_HAVE_CUDA)
        Pair& p = pairs_[turn_++ % pairs_.size()];
        collect(p);
        gpu::event_record(p.start, stream_);
        step();
        gpu::event_record(p.end, stream_);
        p.pending = true;
#endif
    }
    double take() {
#if defined(DSTK_HAVE_CUDA)
        for (auto& p : pairs_) collect(p);
#endif
        return std::exchange(seconds_, 0.0);
    }

  private:
    struct Pair {
        void* start = nullptr;
        void* end = nullptr;
        bool pending = false;
    };
#if defined(DSTK_HAVE_CUDA)
    void collect(Pair& p) {
        if (!p.pending) return;
        gpu::event_synchronize(p.end);
        seconds_ += gpu::event_elapsed_ms(p.start, p.end) / 1000.0;
        p.pending = false;
    }
#endif
    void* stream_;
    std::array<Pair, 64> pairs_{};
    [[maybe_unused]] std::size_t turn_ = 0; // unused in builds without CUDA
    double seconds_ = 0;
};

Placement resolve_placement(Placement asked, const train::Device& dev, std::uint64_t data_bytes,
                            std::uint64_t trainer_bytes, std::string& why) {
    if (asked != Placement::automatic) {
        why = "--data " + std::string(placement_name(asked));
        return asked;
    }
    std::uint64_t room = 0;
    std::string where;
    if (dev.backend == train::Backend::cuda) {
        const auto gpus = detect_gpus();
        for (const auto& g : gpus)
            if (g.index == dev.index) room = g.free_memory;
        room = room / 10 * 9 > trainer_bytes ? room / 10 * 9 - trainer_bytes : 0;
        where = "90% of free GPU memory less the model";
    } else {
        room = detect_system().memory.available / 2;
        where = "half of available RAM";
    }
    if (data_bytes <= room) {
        why = "the splits (" + format_bytes(data_bytes) + ") fit in " + where + " (" + format_bytes(room) + ")";
        return Placement::device;
    }
    why = "the splits (" + format_bytes(data_bytes) + ") exceed " + where + " (" + format_bytes(room) +
          "): streaming them";
    return Placement::stream;
}

// Runs once every kernel and graph the run will use, so that what the CUDA
// runtime loads or allocates lazily (kernel modules under the default
// CUDA_MODULE_LOADING=LAZY, cuDNN and cuBLAS internals, a graph's first
// upload) is on the device before the ceiling is measured: an evaluation and
// a training step on the first training batch, whose effect is undone (the
// trainer state saved before, loaded after), and an evaluation of the last
// test batch (a partial one runs outside the captured graph).
void warm_up(train::Trainer& t, BatchSource& train_src, BatchSource* test_src, std::uint64_t epoch) {
    const std::vector<std::uint8_t> state = t.save_state();
    train::Batch b;
    train_src.start_epoch(epoch, 0);
    if (train_src.next(b)) {
        t.evaluate(b);
        t.train_step(b);
        train_src.release();
    }
    if (test_src) {
        test_src->start_epoch(0, test_src->batches_per_epoch() - 1);
        if (test_src->next(b)) {
            t.evaluate(b);
            test_src->release();
        }
        (void)test_src->take_times();
    }
    t.synchronize();
    t.load_state(state);
    (void)t.take_train_metrics();
    (void)t.take_eval_metrics();
    (void)train_src.take_times();
}

std::string stage_text(const StageTimes& t) {
    return "read wait " + format_duration(t.read_wait) + ", read " + format_duration(t.read) +
           (t.decode > 0 ? ", decode " + format_duration(t.decode) : std::string()) +
           (t.h2d > 0 ? ", h2d " + format_duration(t.h2d) : std::string()) + ", compute " + format_duration(t.compute);
}

nlohmann::json stage_json(const StageTimes& t) {
    return {{"read_wait_s", t.read_wait},
            {"read_s", t.read},
            {"decode_s", t.decode},
            {"h2d_s", t.h2d},
            {"compute_s", t.compute}};
}

} // namespace

void add_data_run_options(CLI::App& app, DataRunOptions& d) {
    app.add_option("--data", d.data,
                   "Placement: auto, device (split in GPU memory), stream (reader threads + ring) or "
                   "managed (cudaMallocManaged)")
        ->capture_default_str();
    app.add_option("--order", d.order, "Sample order: sequential, chunk (shuffled chunks, mixed in windows) or full")
        ->capture_default_str();
    app.add_option("--window", d.window, "Chunk order: chunks whose samples are mixed together")->capture_default_str();
    app.add_option("--chunk-samples", d.chunk_samples,
                   "Chunk order on .npy storage: samples per chunk (0: about 4 MiB; chunked files use theirs)")
        ->capture_default_str();
    app.add_option("--prefetch", d.prefetch, "Stream: batch slots in the ring (K); managed: batches prefetched ahead")
        ->capture_default_str()
        ->each([&d](const std::string&) { d.prefetch_given = true; });
    app.add_option("--readers", d.readers, "Stream: reader threads")
        ->capture_default_str()
        ->each([&d](const std::string&) { d.readers_given = true; });
    app.add_option("--bench", d.bench,
                   "dsbench results (dsbench all DATA --json FILE): choose --prefetch and --readers from its "
                   "random-read, sequential-read and host-to-device figures (explicit options win)");
    app.add_flag("--direct", d.direct,
                 "Stream: read .npy inputs with O_DIRECT, bypassing the page cache (where the filesystem refuses it, "
                 "through the page cache: with a notice at open, with a warning mid-run)");
    app.add_option("--managed-policy", d.managed_policy, "Managed: prefetch, advise or fault")->capture_default_str();
    app.add_flag("--oversubscribe", d.oversubscribe, "Managed: allow a split larger than free GPU memory");
    app.add_option("--eval-every", d.eval_every, "Evaluate the test split every N steps (0: after each epoch)")
        ->capture_default_str();
    app.add_option("--checkpoint", d.checkpoint, "Checkpoint directory (written atomically after each epoch)");
    app.add_option("--checkpoint-every", d.checkpoint_every, "Also checkpoint every N steps (0: epochs only)")
        ->capture_default_str();
    app.add_flag("--resume", d.resume, "Continue from the checkpoint in --checkpoint");
    app.add_option("--max-steps", d.max_steps, "Stop after N steps in total, with a checkpoint (0: no limit)")
        ->capture_default_str();
}

train::RunReport run_training(const train::RunOptions& e, const DataRunOptions& d, const OutputOptions& out) {
    using train::Backend;
    if (e.epochs == 0) throw usage_error("invalid --epochs 0 (must be positive)");
    if (e.batch == 0) throw usage_error("invalid --batch 0 (must be positive)");
    if (d.resume && d.checkpoint.empty()) throw usage_error("--resume needs --checkpoint DIR (where to resume from)");
    // First, while this process has no CUDA context: the device's memory before it.
    std::optional<DeviceMemoryMeter> meter;
    if (!e.device || e.device->backend == Backend::cuda) meter.emplace();
    const Placement asked = parse_placement(d.data);
    const Order order_kind = parse_order(d.order);
    const ManagedPolicy policy = parse_managed_policy(d.managed_policy);
    const train::Device device = choose_device(e, out);
    const train::Precision precision =
        e.precision.value_or(device.backend == Backend::cpu ? train::Precision::fp32 : train::Precision::tf32);

    const Dataset ds = Dataset::open(e.dataset);
    const Manifest& m = ds.manifest();
    const SplitInfo& train_split = m.split("train");
    const SplitInfo* test_split = m.find("test");
    if (test_split && test_split->samples == 0) test_split = nullptr;
    const FieldInfo& x = train_split.field(m.input_field);
    if (!m.num_classes)
        throw runtime_error(ds.dir().string() + ": " + manifest_file_name +
                            " has no num_classes (labels unknown); re-create the dataset with dsgen or dsconvert");
    if (train_split.samples == 0)
        throw usage_error("split 'train' of " + ds.dir().string() + " is empty (nothing to train on)");
    if (e.batch > train_split.samples)
        throw usage_error("the train split has " + format_count(train_split.samples) + " samples, fewer than --batch " +
                          std::to_string(e.batch) + " (use a smaller --batch)");

    // The trainer.
    const std::uint32_t classes = *m.num_classes;
    const train::ModelSpec spec = train::resolve_model(e.model, classes);
    train::TrainerConfig tc;
    tc.plan = train::plan_network(spec, train::tensor_shape_from(x.shape), classes);
    tc.input_dtype = x.dtype;
    tc.max_batch = e.batch;
    tc.precision = precision;
    tc.optimizer.kind = e.optimizer;
    tc.optimizer.lr =
        e.lr.value_or(e.optimizer == train::OptimizerKind::sgd ? 0.05f * static_cast<float>(e.batch) / 256.0f : 0.002f);
    tc.optimizer.momentum = e.momentum;
    tc.optimizer.nesterov = e.nesterov;
    tc.optimizer.weight_decay = e.weight_decay;
    const std::uint64_t steps_per_epoch = train_split.samples / e.batch; // a partial last batch is skipped
    tc.schedule.kind = e.schedule;
    tc.schedule.total_steps = steps_per_epoch * e.epochs;
    tc.schedule.warmup_steps =
        static_cast<std::uint64_t>(std::llround(e.warmup_epochs * static_cast<double>(steps_per_epoch)));
    tc.schedule.step_every = std::uint64_t{e.step_epochs} * steps_per_epoch;
    tc.schedule.gamma = e.gamma;
    if (e.schedule == train::ScheduleKind::step && e.step_epochs == 0)
        throw usage_error("--schedule step needs --step-epochs N (decay every N epochs)");
    tc.label_smoothing = e.label_smoothing;
    tc.seed = e.seed;
    tc.device = device;
    tc.cpu_threads = e.threads;
    tc.workspace_limit = e.workspace;
    tc.deterministic = e.deterministic;
    channel_stats(ds, x, train_split.samples, tc.plan.input.c, tc.mean, tc.std);
    if (d.resume && !d.model.init_from.empty())
        throw usage_error("--init-from with --resume (the checkpoint holds the weights); drop --init-from");
    std::optional<model::SavedModel> init;
    if (!d.model.init_from.empty()) init = model::prepare_init_from(d.model, tc, out);
    const auto save_to = model::save_paths(d.model, d.checkpoint, e.log_json);

    const bool on_gpu = device.backend == Backend::cuda;
    if (on_gpu) meter->attach(device.index);
    auto trainer = train::make_trainer(tc);
    if (init) model::load_weights(*trainer, *init);

    // The sources.
    SourceConfig sc;
    sc.device = device;
    sc.order.kind = order_kind;
    sc.order.seed = e.seed;
    sc.order.window_chunks = d.window;
    sc.order.chunk_samples =
        d.chunk_samples ? d.chunk_samples : std::max<std::uint64_t>(1, default_chunk_bytes / x.sample_bytes());
    if (x.storage == Storage::zstd_chunked && x.chunk_samples) sc.order.chunk_samples = x.chunk_samples;
    sc.batch = e.batch;
    sc.prefetch = d.prefetch;
    sc.readers = d.readers;
    if (!d.bench.empty()) {
        const bench::Results br = bench::load_results(d.bench);
        const LoaderTuning t =
            tune_loader(br, order_kind, x.sample_bytes(), e.batch, hardware_threads(),
                        d.prefetch_given ? std::optional<unsigned>(d.prefetch) : std::nullopt,
                        d.readers_given ? std::optional<unsigned>(d.readers) : std::nullopt, d.prefetch, d.readers);
        sc.prefetch = t.prefetch;
        sc.readers = t.readers;
        for (const auto& line : t.why) note(out, "dstrain: --bench " + d.bench.string() + ": " + line);
    }
    sc.direct = d.direct;
    sc.notice = [&out](const std::string& line) { note(out, "dstrain: " + line); };
    sc.warn = [](const std::string& line) { warning(line); };
    sc.managed_policy = policy;
    sc.oversubscribe = d.oversubscribe;
    sc.compute_stream = trainer->compute_stream();
    const std::uint64_t split_bytes = checked_mul(train_split.samples, x.sample_bytes() + 4, "split bytes") +
                                      (test_split ? test_split->samples * (x.sample_bytes() + 4) : 0);
    std::string why;
    sc.placement = resolve_placement(asked, device, split_bytes, trainer->memory_plan().total(), why);
    if (d.direct && sc.placement != Placement::stream)
        note(out, "dstrain: --direct applies to --data stream only; the " + std::string(placement_name(sc.placement)) +
                      " placement loads the split once");
    if (order_kind == Order::full && sc.placement == Placement::stream)
        warning("--order full with --data stream reads samples at random from the files: unless they are in the "
                "page cache this is I/O-bound; --order chunk keeps reads sequential");
    SourceConfig test_sc = sc;
    test_sc.order.kind = Order::sequential;
    test_sc.drop_last = false;
    auto train_src = make_batch_source(ds, "train", sc);
    std::unique_ptr<BatchSource> test_src;
    if (test_split) test_src = make_batch_source(ds, "test", test_sc);
    if (train_src->batches_per_epoch() != steps_per_epoch) throw std::logic_error("batches per epoch disagree");

    train::RunReport r;
    r.model = tc.plan.name;
    r.device = train::device_name(device);
    r.precision = train::precision_name(precision);
    r.parameters = tc.plan.params;
    r.planned = trainer->memory_plan();
    r.measured_device_bytes = trainer->measured_device_bytes();

    note(out, "dstrain: model " + tc.plan.name + " (" + train::to_spec_string(spec) + ")");
    note(out, "dstrain: " + format_count(tc.plan.params) + " parameters, input " + tc.plan.input.str() + " " +
                  std::string(dtype_name(x.dtype)) + ", " + std::to_string(classes) + " classes, " +
                  format_count(train_split.samples) + " train / " + format_count(test_split ? test_split->samples : 0) +
                  " test samples, device " + r.device + ", " + r.precision);
    note(out, "dstrain: data " + std::string(placement_name(train_src->placement())) + " (" + why + "), order " +
                  std::string(order_name(order_kind)) +
                  (order_kind == Order::chunk ? " (" + format_count(sc.order.chunk_samples) + " samples x " +
                                                    std::to_string(d.window) + " chunks per window)"
                                              : std::string()) +
                  ", " + format_count(steps_per_epoch) + " steps per epoch");

    // What a resume must repeat.
    const std::map<std::string, std::string> run{
        {"dataset_samples", std::to_string(train_split.samples)},
        {"dataset_checksum", x.checksum},
        {"model", train::to_spec_string(spec)},
        {"batch", std::to_string(e.batch)},
        {"epochs", std::to_string(e.epochs)},
        {"optimizer", std::string(train::optimizer_name(e.optimizer))},
        {"lr", fixed(tc.optimizer.lr, 6)},
        {"schedule", std::string(train::schedule_name(e.schedule))},
        {"order", d.order},
        {"window", std::to_string(d.window)},
        {"chunk_samples", std::to_string(sc.order.chunk_samples)},
        {"seed", std::to_string(e.seed)},
        {"precision", r.precision},
    };
    CheckpointPosition pos;
    if (d.resume) {
        const Checkpoint c = load_checkpoint(d.checkpoint);
        check_resume_compatible(c, run, d.checkpoint);
        trainer->load_state(c.trainer_state);
        pos = c.position;
        if (pos.epoch >= e.epochs) {
            note(out, "dstrain: the run in " + d.checkpoint.string() + " is finished (" + c.run.at("epochs") +
                          " epochs, " + std::to_string(pos.steps) + " steps); nothing to do: its model is " +
                          save_to.front().string() + ", give --epochs N above " + c.run.at("epochs") +
                          " to train further");
            return r;
        }
        if (c.run.at("epochs") != run.at("epochs"))
            note(out, "dstrain: --epochs " + run.at("epochs") + " (was " + c.run.at("epochs") +
                          "): the learning-rate schedule now spans the longer run");
        note(out, "dstrain: resumed from " + checkpoint_path(d.checkpoint).string() + " at epoch " +
                      std::to_string(pos.epoch + 1) + ", batch " + std::to_string(pos.next_batch) + " (step " +
                      std::to_string(pos.steps) + ")");
    } else if (!d.checkpoint.empty() && checkpoint_exists(d.checkpoint)) {
        throw usage_error("'" + d.checkpoint.string() +
                          "' already holds a checkpoint; add --resume to continue it, or remove it");
    }
    model::check_save_paths(save_to, d.model, d.resume);
    auto write_checkpoint = [&](const CheckpointPosition& p) {
        if (d.checkpoint.empty()) return;
        Checkpoint c;
        c.position = p;
        c.seed = e.seed;
        c.run = run;
        c.options = d.recorded_options;
        c.created = now_iso8601();
        c.command_line = e.command_line;
        c.trainer_state = trainer->save_state();
        save_checkpoint(d.checkpoint, c);
    };

    std::ofstream log;
    if (!e.log_json.empty()) {
        log.open(e.log_json, d.resume ? std::ios::app : std::ios::trunc);
        if (!log) throw_errno("cannot open --log-json", e.log_json);
    }
    auto emit = [&](const nlohmann::json& j) {
        if (!log.is_open()) return;
        log << j.dump() << "\n" << std::flush;
        if (!log) throw runtime_error("cannot write --log-json " + e.log_json + " (disk full?)");
    };
    auto evaluate = [&]() -> train::Metrics {
        if (!test_src) return {};
        test_src->start_epoch(0, 0);
        train::Batch b;
        while (test_src->next(b)) {
            trainer->evaluate(b);
            test_src->release();
        }
        (void)test_src->take_times();
        return trainer->take_eval_metrics();
    };

    ComputeTimer compute(trainer->compute_stream());

    // The memory ceiling, before the first step. On the GPU: what the CUDA
    // runtime itself holds (context, library handles, loaded kernels), measured
    // once everything is built and warmed up, plus the planned buffers.
    const std::uint64_t data_dev = train_src->device_bytes() + (test_src ? test_src->device_bytes() : 0);
    const std::uint64_t planned = r.planned.total() + data_dev;
    const bool managed = train_src->placement() == Placement::managed;
    std::uint64_t overhead = 0;
    // A resident split's load time belongs to the first epoch's read time; the warm-up's does not.
    const double load_seconds = train_src->take_times().read;
    if (on_gpu) {
        warm_up(*trainer, *train_src, test_src.get(), pos.epoch);
        const std::uint64_t held = meter->sample();
        overhead = held > planned ? held - planned : 0;
        r.memory_method = meter->method();
    }
    const std::uint64_t ceiling = overhead + planned;
    r.memory_ceiling = ceiling;
    r.runtime_overhead = overhead;
    r.data_device_bytes = data_dev;
    const std::string slots =
        train_src->placement() == Placement::stream
            ? " (" + std::to_string(std::max(sc.prefetch, on_gpu ? 2u : 1u)) +
                  " batch slots per split, whatever the dataset size)"
            : std::string(managed ? " (managed: the split's pages the GPU holds are not in the ceiling)" : "");
    const std::string buffers = "parameters " + format_bytes(r.planned.parameters) + " + activations " +
                                format_bytes(r.planned.activations) + " + workspace " +
                                format_bytes(r.planned.workspace) + " + data " + format_bytes(data_dev) + slots;
    if (on_gpu)
        note(out, "dstrain: GPU memory ceiling " + format_bytes(ceiling) + " = runtime overhead " +
                      format_bytes(overhead) +
                      " (measured after a warm-up: CUDA context, cuDNN/cuBLAS, loaded kernels) + planned " +
                      format_bytes(planned) + " (" + buffers + "); peaks measured with " + r.memory_method);
    else
        note(out, "dstrain: memory ceiling " + format_bytes(ceiling) + " = " + buffers);
    emit({{"event", "memory"},
          {"memory_ceiling", ceiling},
          {"runtime_overhead", overhead},
          {"planned_parameters", r.planned.parameters},
          {"planned_activations", r.planned.activations},
          {"planned_workspace", r.planned.workspace},
          {"planned_data", data_dev},
          {"method", on_gpu ? r.memory_method : std::string("planned host memory (not measured)")}});
    if (on_gpu) meter->reset_peak();
    auto sampled = Clock::now();

    bool warned_ceiling = false;
    std::uint64_t steps = pos.steps;
    bool stopped = false;
    for (std::uint64_t epoch = pos.epoch; epoch < e.epochs && !stopped; ++epoch) {
        const auto t0 = Clock::now();
        train::EpochReport er;
        er.epoch = static_cast<std::uint32_t>(epoch + 1);
        er.lr = train::learning_rate(tc.optimizer, tc.schedule, steps);
        const std::uint64_t first = epoch == pos.epoch ? pos.next_batch : 0;
        // first_nonfinite_step counts steps since the trainer was built or loaded.
        const std::uint64_t epoch_start = steps - pos.steps;
        train_src->start_epoch(epoch, first);
        std::uint64_t batch_index = first;
        train::Batch b;
        while (train_src->next(b)) {
            compute.time([&] { trainer->train_step(b); });
            train_src->release();
            ++batch_index;
            ++steps;
            if (on_gpu && seconds_since(sampled) >= 0.25) {
                meter->sample();
                sampled = Clock::now();
            }
            const CheckpointPosition here{epoch, batch_index, steps};
            if (interrupted()) {
                trainer->synchronize();
                write_checkpoint(here);
                throw Error(ExitCode::interrupted,
                            "interrupted at epoch " + std::to_string(epoch + 1) + ", step " + std::to_string(steps) +
                                (d.checkpoint.empty()
                                     ? std::string(" (no --checkpoint: progress is lost)")
                                     : "; checkpoint written to " + checkpoint_path(d.checkpoint).string() +
                                           ", continue with --resume"));
            }
            if (d.checkpoint_every && steps % d.checkpoint_every == 0 && batch_index < steps_per_epoch)
                write_checkpoint(here);
            if (d.eval_every && steps % d.eval_every == 0 && test_src) {
                const train::Metrics em = evaluate();
                note(out, "step " + std::to_string(steps) + "  test loss " + fixed(em.loss(), 4) + "  test acc " +
                              fixed(100 * em.accuracy(), 2) + "%");
                emit({{"event", "eval"}, {"step", steps}, {"test_loss", em.loss()}, {"test_accuracy", em.accuracy()}});
            }
            if (d.max_steps && steps >= d.max_steps) {
                stopped = true;
                break;
            }
        }
        trainer->synchronize();
        if (const auto bad = trainer->first_nonfinite_step())
            throw runtime_error("non-finite loss at epoch " + std::to_string(epoch + 1) + ", step " +
                                std::to_string(*bad - epoch_start + first + 1) + " of " +
                                std::to_string(steps_per_epoch) + " (training diverged) lower --lr (now " +
                                std::to_string(tc.optimizer.lr) + ") or add warm-up with --warmup-epochs" +
                                (d.checkpoint.empty() ? "" : "; the last checkpoint is kept"));
        StageTimes st = train_src->take_times();
        st.compute = compute.take();
        if (epoch == pos.epoch) st.read += load_seconds;
        er.train = trainer->take_train_metrics();
        const auto t1 = Clock::now();
        if (d.eval_every == 0 || stopped) er.test = evaluate();
        er.train_seconds = std::chrono::duration<double>(t1 - t0).count();
        er.seconds = seconds_since(t0);
        er.samples_per_second = static_cast<double>(er.train.samples) / std::max(1e-9, er.train_seconds);
        const bool epoch_done = batch_index >= steps_per_epoch;
        write_checkpoint(epoch_done ? CheckpointPosition{epoch + 1, 0, steps}
                                    : CheckpointPosition{epoch, batch_index, steps});
        r.epochs.push_back(er);
        // The epoch's peak: samples every 0.25 s of training and one after evaluation and checkpoint.
        std::uint64_t peak = 0;
        if (on_gpu) {
            meter->sample();
            peak = meter->peak();
            meter->reset_peak();
            sampled = Clock::now();
            r.peak_device_bytes = std::max(r.peak_device_bytes, peak);
        }

        std::ostringstream line;
        line << "epoch " << (epoch + 1) << "/" << e.epochs << (epoch_done && first == 0 ? "" : " (part)") << "  loss "
             << fixed(er.train.loss(), 4) << "  train acc " << fixed(100 * er.train.accuracy(), 2) << "%  test acc "
             << (test_src ? fixed(100 * er.test.accuracy(), 2) + "%" : std::string("-")) << "  time "
             << format_duration(er.seconds) << "  " << format_count(static_cast<std::uint64_t>(er.samples_per_second))
             << " samples/s";
        if (on_gpu)
            line << "  GPU mem " << format_bytes(peak) << " (ceiling " << format_bytes(ceiling)
                 << (managed ? " + managed pages" : "") << ")";
        line << "  [" << stage_text(st) << "]";
        if (out.json)
            note(out, line.str());
        else
            std::printf("%s\n", line.str().c_str()), std::fflush(stdout);
        nlohmann::json j{{"event", "epoch"},
                         {"epoch", er.epoch},
                         {"steps", steps},
                         {"train_loss", er.train.loss()},
                         {"train_accuracy", er.train.accuracy()},
                         {"test_loss", er.test.loss()},
                         {"test_accuracy", er.test.accuracy()},
                         {"seconds", er.seconds},
                         {"train_seconds", er.train_seconds},
                         {"samples_per_second", er.samples_per_second},
                         {"lr", er.lr},
                         {"placement", placement_name(train_src->placement())},
                         {"order", order_name(order_kind)},
                         {"stages", stage_json(st)},
                         {"memory_ceiling", ceiling}};
        if (on_gpu) j["gpu_memory_peak"] = peak;
        emit(j);
        if (on_gpu && !managed && !warned_ceiling && peak > ceiling) {
            warned_ceiling = true;
            warning("measured GPU memory " + format_bytes(peak) + " (" + r.memory_method + ") exceeds the ceiling " +
                    format_bytes(ceiling) + " by " + format_bytes(peak - ceiling) +
                    " (memory allocated after the warm-up" +
                    (r.memory_method.find("device-wide") != std::string::npos ? ", or by another process" : "") +
                    "); the run goes on");
        }
    }
    if (stopped) note(out, "dstrain: stopped at --max-steps " + std::to_string(d.max_steps));
    const model::SavedModel trained = model::model_from_trainer(*trainer, spec, ds.dir().string(), x.checksum);
    for (const auto& path : save_to) {
        model::save_model(path, trained, true);
        note(out, "dstrain: model saved to " + path.string());
    }
    return r;
}

} // namespace dstk::data
