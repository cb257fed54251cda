#include "dstk/data/train_run.hpp"

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

#include "dstk/checkpoint.hpp"
#include "dstk/data/batch_source.hpp"
#include "dstk/dataset.hpp"
#include "dstk/error.hpp"
#include "dstk/gpu_info.hpp"
#include "dstk/signals.hpp"
#include "dstk/sysinfo.hpp"
#include "dstk/train/trainer.hpp"
#include "dstk/units.hpp"
#if defined(DSTK_HAVE_CUDA)
#include "dstk/data/gpu_ops.hpp"
#endif

namespace fs = std::filesystem;

namespace dstk::data {
namespace {

using Clock = std::chrono::steady_clock;
double seconds_since(Clock::time_point t) {
    return std::chrono::duration<double>(Clock::now() - t).count();
}

constexpr std::uint64_t default_chunk_bytes = 4ull << 20;
constexpr std::uint64_t stats_samples = 4096;

std::string fixed(double v, int digits) {
    char buf[64];
    std::snprintf(buf, sizeof buf, "%.*f", digits, v);
    return buf;
}

train::Device choose_device(const TrainRunOptions& o) {
    if (!o.device.empty()) return train::parse_device(o.device);
    std::string why;
    if (!detect_gpus(&why).empty()) return {train::Backend::cuda, 0};
    note(o.out, "dstrain: training on the CPU (" + why + "); use --device cpu to silence this");
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
    std::size_t turn_ = 0;
    double seconds_ = 0;
};

// GPU memory the process holds beyond what it held before training started.
class DeviceMemoryMeter {
  public:
    explicit DeviceMemoryMeter(const train::Device& d) : device_(d) {
#if defined(DSTK_HAVE_CUDA)
        if (d.backend == train::Backend::cuda) baseline_ = free_now();
#endif
    }
    std::uint64_t sample() {
#if defined(DSTK_HAVE_CUDA)
        if (device_.backend == train::Backend::cuda) {
            const std::uint64_t f = free_now();
            peak_ = std::max(peak_, baseline_ > f ? baseline_ - f : 0);
        }
#endif
        return peak_;
    }
    bool on_gpu() const {
        return device_.backend == train::Backend::cuda;
    }

  private:
#if defined(DSTK_HAVE_CUDA)
    std::uint64_t free_now() const {
        std::uint64_t f = 0, t = 0;
        gpu::mem_info(device_.index, f, t);
        return f;
    }
#endif
    train::Device device_;
    std::uint64_t baseline_ = 0, peak_ = 0;
};

Placement resolve_placement(const TrainRunOptions& o, Placement asked, const train::Device& dev,
                            std::uint64_t data_bytes, std::uint64_t trainer_bytes, std::string& why) {
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
    (void)o;
    if (data_bytes <= room) {
        why = "the splits (" + format_bytes(data_bytes) + ") fit in " + where + " (" + format_bytes(room) + ")";
        return Placement::device;
    }
    why = "the splits (" + format_bytes(data_bytes) + ") exceed " + where + " (" + format_bytes(room) +
          "): streaming them";
    return Placement::stream;
}

std::string stage_text(const StageTimes& t) {
    return "read wait " + format_duration(t.read_wait) + ", read " + format_duration(t.read) +
           (t.h2d > 0 ? ", h2d " + format_duration(t.h2d) : std::string()) + ", compute " + format_duration(t.compute);
}

nlohmann::json stage_json(const StageTimes& t) {
    return {{"read_wait_s", t.read_wait}, {"read_s", t.read}, {"h2d_s", t.h2d}, {"compute_s", t.compute}};
}

} // namespace

void add_train_run_options(CLI::App& app, TrainRunOptions& o) {
    app.add_option("dataset", o.dataset, "Dataset directory (dsgen / dsconvert output)")->required();
    app.add_option("--model", o.model, "Preset (ref-cnn, small-cnn, resnet9, mlp[:W,..]) or layer spec")
        ->capture_default_str();
    app.add_option("--epochs", o.epochs, "Epochs to train")->capture_default_str();
    app.add_option("--batch", o.batch, "Samples per step")->capture_default_str();
    app.add_option("--optimizer", o.optimizer, "sgd or adamw")->capture_default_str();
    app.add_option("--lr", o.lr, "Peak learning rate")->capture_default_str();
    app.add_option("--momentum", o.momentum, "SGD momentum (Nesterov)")->capture_default_str();
    app.add_option("--weight-decay", o.weight_decay, "Weight decay")->capture_default_str();
    app.add_option("--label-smoothing", o.label_smoothing, "Label smoothing in [0, 1)")->capture_default_str();
    app.add_option("--schedule", o.schedule, "constant, step or cosine")->capture_default_str();
    app.add_option("--warmup-steps", o.warmup_steps, "Linear warm-up steps")->capture_default_str();
    app.add_option("--precision", o.precision, "fp32, tf32 or bf16 (GPU)")->capture_default_str();
    app.add_option("--device", o.device, "cpu, cuda or cuda:N (default: the GPU when there is one)");
    app.add_option("--seed", o.seed, "Seed of initialisation, orders and dropout")->capture_default_str();
    app.add_option("--cpu-threads", o.cpu_threads, "CPU backend threads (0: all)")->capture_default_str();
    app.add_option("--data", o.data, "Placement: auto, device, stream or managed")->capture_default_str();
    app.add_option("--order", o.order, "Sample order: sequential, chunk or full")->capture_default_str();
    app.add_option("--window", o.window, "Chunk order: chunks shuffled together")->capture_default_str();
    app.add_option("--chunk-samples", o.chunk_samples,
                   "Chunk order on .npy storage: samples per chunk (0: about 4 MiB)")
        ->capture_default_str();
    app.add_option("--prefetch", o.prefetch, "Stream: batch slots in the ring (K)")->capture_default_str();
    app.add_option("--readers", o.readers, "Stream: reader threads")->capture_default_str();
    app.add_option("--managed-policy", o.managed_policy, "Managed: prefetch, advise or fault")->capture_default_str();
    app.add_flag("--oversubscribe", o.oversubscribe, "Managed: allow a split larger than free GPU memory");
    app.add_option("--eval-every", o.eval_every, "Evaluate the test split every N steps (0: each epoch)")
        ->capture_default_str();
    app.add_option("--checkpoint", o.checkpoint, "Checkpoint directory (written atomically)");
    app.add_option("--checkpoint-every", o.checkpoint_every, "Checkpoint every N steps (0: each epoch)")
        ->capture_default_str();
    app.add_flag("--resume", o.resume, "Continue from the checkpoint in --checkpoint");
    app.add_option("--max-steps", o.stop_after_steps, "Stop after N steps in total, with a checkpoint (0: no limit)")
        ->capture_default_str();
    app.add_option("--log-json", o.log_json, "Write one JSON line per epoch and evaluation to FILE");
}

void run_training(const TrainRunOptions& o) {
    if (o.resume && o.checkpoint.empty()) throw usage_error("--resume needs --checkpoint DIR (where to resume from)");
    if (o.epochs == 0) throw usage_error("invalid --epochs 0 (must be positive)");
    const Placement asked = parse_placement(o.data);
    const Order order_kind = parse_order(o.order);
    const ManagedPolicy policy = parse_managed_policy(o.managed_policy);
    const train::Device device = choose_device(o);
    if (o.batch == 0) throw usage_error("invalid --batch 0 (must be positive)");

    const Dataset ds = Dataset::open(o.dataset);
    const Manifest& m = ds.manifest();
    const SplitInfo& train_split = m.split("train");
    const SplitInfo* test_split = m.find("test");
    if (test_split && test_split->samples == 0) test_split = nullptr;
    const FieldInfo& x = train_split.field(m.input_field);
    if (!m.num_classes)
        throw runtime_error(ds.dir().string() + ": " + manifest_file_name +
                            " has no num_classes (labels unknown); re-create the dataset with dsgen/dsconvert");

    // The trainer.
    train::TrainerConfig tc;
    const train::ModelSpec spec = train::resolve_model(o.model, *m.num_classes);
    tc.plan = train::plan_network(spec, train::tensor_shape_from(x.shape), *m.num_classes);
    tc.input_dtype = x.dtype;
    tc.max_batch = o.batch;
    tc.precision = train::parse_precision(o.precision);
    tc.optimizer.kind = train::parse_optimizer(o.optimizer);
    tc.optimizer.lr = o.lr;
    tc.optimizer.momentum = o.momentum;
    tc.optimizer.weight_decay = o.weight_decay;
    tc.schedule.kind = train::parse_schedule(o.schedule);
    tc.schedule.warmup_steps = o.warmup_steps;
    tc.label_smoothing = o.label_smoothing;
    tc.seed = o.seed;
    tc.device = device;
    tc.cpu_threads = o.cpu_threads;

    // The sources' configuration (before the trainer, to plan memory).
    SourceConfig sc;
    sc.device = device;
    sc.order.kind = order_kind;
    sc.order.seed = o.seed;
    sc.order.window_chunks = o.window;
    sc.order.chunk_samples =
        o.chunk_samples ? o.chunk_samples : std::max<std::uint64_t>(1, default_chunk_bytes / x.sample_bytes());
    if (x.storage == Storage::zstd_chunked && x.chunk_samples) sc.order.chunk_samples = x.chunk_samples;
    sc.batch = o.batch;
    sc.prefetch = o.prefetch;
    sc.readers = o.readers;
    sc.managed_policy = policy;
    sc.oversubscribe = o.oversubscribe;

    channel_stats(ds, x, train_split.samples, tc.plan.input.c, tc.mean, tc.std);
    const std::uint64_t steps_per_epoch = train_split.samples / o.batch; // training drops a partial last batch
    tc.schedule.total_steps = steps_per_epoch * o.epochs;
    DeviceMemoryMeter meter(device);
    std::unique_ptr<train::Trainer> trainer = train::make_trainer(tc);
    sc.compute_stream = trainer->compute_stream();

    const std::uint64_t split_bytes = checked_mul(train_split.samples, x.sample_bytes() + 4, "split bytes") +
                                      (test_split ? test_split->samples * (x.sample_bytes() + 4) : 0);
    std::string why;
    sc.placement = resolve_placement(o, asked, device, split_bytes, trainer->memory_plan().total(), why);
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

    // The GPU memory ceiling, before the first step.
    const train::MemoryPlan mp = trainer->memory_plan();
    const std::uint64_t data_dev = train_src->device_bytes() + (test_src ? test_src->device_bytes() : 0);
    const std::uint64_t ceiling = mp.total() + data_dev;
    const std::string mem_where = meter.on_gpu() ? "GPU memory" : "memory";
    note(o.out, "dstrain: " + std::string(placement_name(train_src->placement())) + " placement (" + why + "), order " +
                    std::string(order_name(order_kind)) + ", " + format_count(steps_per_epoch) + " steps/epoch on " +
                    train::device_name(device));
    note(o.out, "dstrain: " + mem_where + " ceiling " + format_bytes(ceiling) + " = parameters " +
                    format_bytes(mp.parameters) + " + activations " + format_bytes(mp.activations) + " + workspace " +
                    format_bytes(mp.workspace) + " + data " + format_bytes(data_dev) +
                    (train_src->placement() == Placement::stream
                         ? " (" + std::to_string(o.prefetch) + " batch slots, whatever the dataset size)"
                         : std::string()));

    // What a resume must repeat.
    const std::map<std::string, std::string> run{
        {"dataset_samples", std::to_string(train_split.samples)},
        {"dataset_checksum", x.checksum},
        {"model", train::to_spec_string(spec)},
        {"batch", std::to_string(o.batch)},
        {"epochs", std::to_string(o.epochs)},
        {"optimizer", o.optimizer},
        {"lr", fixed(o.lr, 6)},
        {"schedule", o.schedule},
        {"order", o.order},
        {"window", std::to_string(o.window)},
        {"chunk_samples", std::to_string(sc.order.chunk_samples)},
        {"seed", std::to_string(o.seed)},
        {"precision", o.precision},
    };

    CheckpointPosition pos;
    if (o.resume) {
        const Checkpoint c = load_checkpoint(o.checkpoint);
        check_resume_compatible(c, run, o.checkpoint);
        trainer->load_state(c.trainer_state);
        pos = c.position;
        note(o.out, "dstrain: resumed from " + checkpoint_path(o.checkpoint).string() + " at epoch " +
                        std::to_string(pos.epoch + 1) + ", batch " + std::to_string(pos.next_batch) + " (step " +
                        std::to_string(pos.steps) + ")");
    } else if (!o.checkpoint.empty() && checkpoint_exists(o.checkpoint)) {
        throw usage_error("checkpoint directory '" + o.checkpoint.string() +
                          "' already holds a checkpoint; add --resume to continue it, or remove it");
    }

    auto write_checkpoint = [&](const CheckpointPosition& p) {
        if (o.checkpoint.empty()) return;
        Checkpoint c;
        c.position = p;
        c.seed = o.seed;
        c.run = run;
        c.created = now_iso8601();
        c.command_line = o.command_line;
        c.trainer_state = trainer->save_state();
        save_checkpoint(o.checkpoint, c);
    };

    std::ofstream log;
    if (!o.log_json.empty()) {
        log.open(o.log_json, std::ios::app);
        if (!log) throw_errno("cannot open --log-json file", o.log_json.string());
    }
    nlohmann::json report = nlohmann::json::array();
    auto emit = [&](nlohmann::json j) {
        if (log) log << j.dump() << "\n" << std::flush;
        report.push_back(std::move(j));
    };

    auto evaluate = [&]() -> std::optional<train::Metrics> {
        if (!test_src) return std::nullopt;
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
    std::uint64_t steps = pos.steps;
    bool stopped = false;
    for (std::uint64_t epoch = pos.epoch; epoch < o.epochs && !stopped; ++epoch) {
        const std::uint64_t first = epoch == pos.epoch ? pos.next_batch : 0;
        const auto t0 = Clock::now();
        train_src->start_epoch(epoch, first);
        std::uint64_t batch_index = first;
        train::Batch b;
        while (train_src->next(b)) {
            compute.time([&] { trainer->train_step(b); });
            train_src->release();
            ++batch_index;
            ++steps;
            const CheckpointPosition here{epoch, batch_index, steps};
            if (interrupted()) {
                trainer->synchronize();
                write_checkpoint(here);
                throw Error(ExitCode::interrupted,
                            "interrupted at epoch " + std::to_string(epoch + 1) + ", step " + std::to_string(steps) +
                                (o.checkpoint.empty()
                                     ? std::string(" (no --checkpoint: progress is lost)")
                                     : "; checkpoint written to " + checkpoint_path(o.checkpoint).string() +
                                           ", continue with --resume"));
            }
            if (o.checkpoint_every && steps % o.checkpoint_every == 0 && batch_index < steps_per_epoch)
                write_checkpoint(here);
            if (o.eval_every && steps % o.eval_every == 0) {
                if (const auto em = evaluate()) {
                    note(o.out, "step " + std::to_string(steps) + "  test loss " + fixed(em->loss(), 4) +
                                    "  test acc " + fixed(100 * em->accuracy(), 2) + "%");
                    emit({{"event", "eval"},
                          {"step", steps},
                          {"test_loss", em->loss()},
                          {"test_accuracy", em->accuracy()}});
                }
            }
            if (o.stop_after_steps && steps >= o.stop_after_steps) {
                stopped = true;
                break;
            }
        }
        trainer->synchronize();
        if (const auto bad = trainer->first_nonfinite_step())
            throw runtime_error("training diverged: non-finite loss at epoch " + std::to_string(epoch + 1) + ", step " +
                                std::to_string(*bad + 1) +
                                "; lower --lr or use --precision fp32 (last checkpoint kept)");
        StageTimes st = train_src->take_times();
        st.compute = compute.take();
        const train::Metrics tm = trainer->take_train_metrics();
        const double secs = seconds_since(t0);
        std::optional<train::Metrics> em;
        if (o.eval_every == 0 || stopped) em = evaluate();
        const std::uint64_t peak = meter.sample();
        const bool epoch_done = batch_index >= steps_per_epoch;
        write_checkpoint(epoch_done ? CheckpointPosition{epoch + 1, 0, steps}
                                    : CheckpointPosition{epoch, batch_index, steps});

        std::ostringstream line;
        line << "epoch " << (epoch + 1) << "/" << o.epochs << (epoch_done ? "" : " (partial)") << "  loss "
             << fixed(tm.loss(), 4) << "  acc " << fixed(100 * tm.accuracy(), 2) << "%";
        if (em) line << "  test " << fixed(100 * em->accuracy(), 2) << "%";
        line << "  " << format_duration(secs) << "  "
             << format_count(static_cast<std::uint64_t>(static_cast<double>(tm.samples) / std::max(secs, 1e-9)))
             << " samples/s";
        if (meter.on_gpu()) line << "  gpu " << format_bytes(peak) << " / " << format_bytes(ceiling);
        line << "  [" << stage_text(st) << "]";
        if (!o.out.json) std::cout << line.str() << std::endl;
        nlohmann::json j{{"event", "epoch"},
                         {"epoch", epoch + 1},
                         {"steps", steps},
                         {"train_loss", tm.loss()},
                         {"train_accuracy", tm.accuracy()},
                         {"seconds", secs},
                         {"samples_per_second", static_cast<double>(tm.samples) / std::max(secs, 1e-9)},
                         {"stages", stage_json(st)},
                         {"memory_ceiling_bytes", ceiling}};
        if (em) {
            j["test_loss"] = em->loss();
            j["test_accuracy"] = em->accuracy();
        }
        if (meter.on_gpu()) j["gpu_peak_bytes"] = peak;
        emit(j);
        if (meter.on_gpu() && peak > ceiling + ceiling / 100 + (64ull << 20))
            warning("measured GPU memory " + format_bytes(peak) + " exceeds the planned ceiling " +
                    format_bytes(ceiling) + " (another process on the GPU, or a library's own allocations)");
    }
    if (o.out.json)
        std::cout << nlohmann::json{{"placement", placement_name(train_src->placement())},
                                    {"order", order_name(order_kind)},
                                    {"device", train::device_name(device)},
                                    {"memory_ceiling_bytes", ceiling},
                                    {"steps", steps},
                                    {"log", report}}
                         .dump(2)
                  << std::endl;
}

} // namespace dstk::data
