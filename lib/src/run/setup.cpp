// dstrain's setup: dataset, device, trainer, sources, and the memory ceiling.
#include <algorithm>
#include <array>
#include <cstddef>
#include <cstdlib>
#include <cmath>
#include <string>
#include <vector>

#include "clock.hpp"
#include "dstk/bench/results.hpp"
#include "dstk/checkpoint.hpp"
#include "dstk/dist/nccl.hpp"
#include "dstk/error.hpp"
#include "dstk/gpu_info.hpp"
#include "dstk/run/tuning.hpp"
#include "dstk/sysinfo.hpp"
#include "dstk/thread_pool.hpp"
#include "dstk/units.hpp"
#include "run/random_reads.hpp"
#include "run/stages.hpp"

namespace dstk::run {
namespace {

using data::Placement;
using train::Backend;

constexpr std::uint64_t default_chunk_bytes = 4ull << 20;
constexpr std::uint64_t stats_samples = 4096;

train::Device choose_device(const TrainOptions& e, const OutputOptions& out) {
    if (e.device) return *e.device;
    std::string why;
    if (!detect_gpus(&why).empty()) return {Backend::cuda, 0};
    note(out, "dstrain: no GPU (" + why + "): training on the CPU");
    return {Backend::cpu, 0};
}

// A --device cuda:N that names no usable GPU is exit 3 with the cause, before
// anything is loaded (rather than the first CUDA call failing mid-setup).
void require_gpu(const train::Device& d) {
    std::string why;
    const std::vector<GpuInfo> gpus = detect_gpus(&why);
    for (const GpuInfo& g : gpus)
        if (g.index == d.index) return;
    const std::string name = train::device_name(d);
    if (!built_with_cuda()) throw no_fit_error("--device " + name + " (built without CUDA support) use --device cpu");
    if (gpus.empty())
        throw no_fit_error("--device " + name + " (" + why +
                           ") train on the CPU with --device cpu, or check the GPU and its driver with nvidia-smi");
    throw no_fit_error("--device " + name + ": no such GPU (this machine has " + std::to_string(gpus.size()) +
                       ", cuda:0 to cuda:" + std::to_string(gpus.size() - 1) + ") pick one of them, or --device cpu");
}

// Sample `e` of a stored input, as a double.
double stored_value(const std::uint8_t* buf, DType t, std::uint64_t e) {
    switch (t) {
    case DType::u8:
        return buf[e];
    case DType::bf16:
        return bf16_to_float(reinterpret_cast<const std::uint16_t*>(buf)[e]);
    case DType::f16:
        return f16_to_float(reinterpret_cast<const std::uint16_t*>(buf)[e]);
    case DType::f32:
        return reinterpret_cast<const float*>(buf)[e];
    default:
        return 0; // refused by the trainer's config check
    }
}

// Per-channel sums over up to 4096 samples spread evenly over the training
// split; a non-finite value is bad data, named by its sample and field.
void scan_samples(const Dataset& ds, const FieldInfo& x, std::uint64_t samples, std::uint32_t channels,
                  std::vector<double>& sum, std::vector<double>& sq, double& n) {
    const FieldReader& r = ds.reader(ds.manifest().split("train").name, x.name);
    const std::uint64_t take = std::min(samples, stats_samples);
    const std::uint64_t sb = x.sample_bytes(), per_channel = x.shape.numel() / channels;
    std::vector<std::uint8_t> buf(sb);
    sum.assign(channels, 0.0);
    sq.assign(channels, 0.0);
    for (std::uint64_t k = 0; k < take; ++k) {
        r.read(k * samples / take, 1, buf.data());
        for (std::uint64_t e = 0; e < x.shape.numel(); ++e) {
            const double v = stored_value(buf.data(), x.dtype, e);
            if (!std::isfinite(v))
                throw runtime_error("split 'train' field '" + x.name + "' sample " +
                                    std::to_string(k * samples / take) + " holds a non-finite value (" +
                                    (std::isnan(v) ? "NaN" : "Inf") + " at element " + std::to_string(e) +
                                    ": training needs finite inputs) fix or drop those samples before training");
            sum[e / per_channel] += v;
            sq[e / per_channel] += v * v;
        }
    }
    n = static_cast<double>(take * per_channel);
}

// Per-channel mean and std in stored units: from the manifest, or computed
// once from the sample scan. Float storage is scanned even when the manifest
// has statistics, since values written after the manifest (or by another tool)
// may be non-finite while the statistics are not.
void channel_stats(const Dataset& ds, const FieldInfo& x, std::uint64_t samples, std::uint32_t channels,
                   std::vector<float>& mean, std::vector<float>& stdev) {
    const Manifest& m = ds.manifest();
    std::vector<double> sum, sq;
    double n = 0;
    // The input's as before per-field statistics; another field's (a side input) its own, where imported.
    const ChannelStats* st = x.name == m.input_field ? (m.stats ? &*m.stats : nullptr) : m.stats_of(x.name);
    if (st && st->mean.size() == channels && st->std.size() == channels) {
        for (std::uint32_t c = 0; c < channels; ++c) {
            if (!std::isfinite(st->mean[c]) || !std::isfinite(st->std[c]))
                throw runtime_error(ds.dir().string() + ": " + manifest_file_name + " gives channel " +
                                    std::to_string(c) + " of '" + x.name +
                                    "' a non-finite mean or std (the data holds NaN or Inf?) "
                                    "re-create the dataset from finite values");
            mean.push_back(static_cast<float>(st->mean[c]));
            stdev.push_back(static_cast<float>(std::max(st->std[c], 1e-6)));
        }
        if (is_float(x.dtype)) scan_samples(ds, x, samples, channels, sum, sq, n);
        return;
    }
    scan_samples(ds, x, samples, channels, sum, sq, n);
    for (std::uint32_t c = 0; c < channels; ++c) {
        const double mu = sum[c] / n;
        mean.push_back(static_cast<float>(mu));
        stdev.push_back(static_cast<float>(std::sqrt(std::max(sq[c] / n - mu * mu, 1e-12))));
    }
}

void open_dataset(Session& s, const TrainOptions& e) {
    s.ds.emplace(Dataset::open(e.dataset));
    const Manifest& m = s.ds->manifest();
    s.train_split = &m.split("train");
    s.test_split = m.find("test");
    if (s.test_split && s.test_split->samples == 0) s.test_split = nullptr;
    s.x = &s.train_split->field(m.input_field);
    if (s.train_split->samples == 0)
        throw usage_error("split 'train' of " + s.ds->dir().string() + " is empty (nothing to train on)");
    const std::uint64_t global = std::uint64_t{e.batch} * static_cast<std::uint64_t>(s.ranks());
    if (global > s.train_split->samples)
        throw usage_error("the train split has " + format_count(s.train_split->samples) + " samples, fewer than " +
                          (s.ranks() > 1
                               ? "the global batch " + std::to_string(global) + " (" + std::to_string(s.ranks()) +
                                     " ranks x --batch " + std::to_string(e.batch) + ")"
                               : "--batch " + std::to_string(e.batch)) +
                          " (use a smaller --batch)");
}

// The model --model, --label, --loss and --side-input name, against the
// training split's fields: its spec (heads' losses resolved, the side input
// placed), its targets and the side input's width.
train::ResolvedModel resolve_session_model(const Session& s, const TrainOptions& e) {
    const Manifest& m = s.ds->manifest();
    train::ModelRequest req;
    req.model = e.model;
    req.input = m.input_field;
    req.label = e.label.empty() ? m.label_field : e.label;
    req.loss = e.loss;
    req.side = e.side_input;
    for (const auto& f : s.train_split->fields) req.fields_known += (req.fields_known.empty() ? "" : ", ") + f.name;
    const auto lookup = [&](const std::string& name) -> std::optional<train::FieldFacts> {
        const FieldInfo* f = s.train_split->find(name);
        if (!f) return std::nullopt;
        return train::FieldFacts{f->dtype, f->shape, name == m.label_field ? m.num_classes : std::nullopt};
    };
    return train::resolve_model(req, lookup);
}

train::TrainerConfig trainer_config(const Session& s, const TrainOptions& e, const train::ResolvedModel& rm) {
    train::TrainerConfig tc;
    tc.plan = train::plan_network(rm.spec, train::tensor_shape_from(s.x->shape), rm.targets, rm.side);
    tc.input_field = s.ds->manifest().input_field;
    tc.input_dtype = s.x->dtype;
    tc.max_batch = e.batch;
    tc.precision = s.precision;
    tc.optimizer.kind = e.optimizer;
    tc.optimizer.lr = e.lr.value_or(e.optimizer == train::OptimizerKind::sgd
                                        ? 0.05f * static_cast<float>(e.batch) * static_cast<float>(s.ranks()) / 256.0f
                                        : 0.002f);
    tc.optimizer.momentum = e.momentum;
    tc.optimizer.nesterov = e.nesterov;
    tc.optimizer.weight_decay = e.weight_decay;
    tc.schedule.kind = e.schedule;
    tc.schedule.total_steps = s.steps_per_epoch * e.epochs;
    tc.schedule.warmup_steps =
        static_cast<std::uint64_t>(std::llround(e.warmup_epochs * static_cast<double>(s.steps_per_epoch)));
    tc.schedule.step_every = std::uint64_t{e.step_epochs} * s.steps_per_epoch;
    tc.schedule.gamma = e.gamma;
    if (e.schedule == train::ScheduleKind::step && e.step_epochs == 0)
        throw usage_error("--schedule step needs --step-epochs N (decay every N epochs)");
    tc.label_smoothing = e.label_smoothing;
    tc.seed = e.seed;
    tc.device = s.device;
    tc.cpu_threads = e.threads;
    tc.workspace_limit = e.workspace;
    tc.deterministic = e.deterministic;
    tc.kernels = e.kernels;
    channel_stats(*s.ds, *s.x, s.train_split->samples, tc.plan.input.c, tc.mean, tc.std);
    if (!e.side_input.empty()) {
        const FieldInfo& side = s.train_split->field(e.side_input);
        tc.side.field = side.name;
        tc.side.dtype = side.dtype;
        const std::uint32_t channels = side.shape.dims.empty() ? 1 : train::tensor_shape_from(side.shape).c;
        channel_stats(*s.ds, side, s.train_split->samples, channels, tc.side.mean, tc.side.std);
    }
    return tc;
}

Placement resolve_placement(Placement asked, const train::Device& dev, std::uint64_t data_bytes,
                            std::uint64_t trainer_bytes, std::string& why) {
    if (asked != Placement::automatic) {
        why = "--data " + std::string(data::placement_name(asked));
        return asked;
    }
    std::uint64_t room = 0;
    std::string where;
    if (dev.backend == Backend::cuda) {
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

// --order full on a stream reads single samples at random. Where the split is
// larger than the memory available, the page cache cannot hold it: predict
// the rate from --bench's random-read figures or a short probe, and say what
// an epoch will cost and what to do instead.
void warn_full_order(const Session& s, const DataOptions& d, const data::SourceConfig& sc, std::uint64_t split_bytes) {
    const std::uint64_t avail = data::available_host_memory();
    const std::string instead = "dsconvert --shuffle SEED " + s.ds->dir().string() +
                                " SHUFFLED once, then --order "
                                "chunk on SHUFFLED (sequential reads of whole chunks, a global shuffle)";
    if (split_bytes <= avail) {
        warning("--order full with --data stream reads samples at random from the files: fast only while they are "
                "in the page cache (the split, " +
                format_bytes(split_bytes) + ", fits in the " + format_bytes(avail) + " available); otherwise " +
                instead);
        return;
    }
    const std::uint64_t sb = s.x->sample_bytes();
    const RandomReadRate rr = predict_random_reads(*s.ds, *s.x, d.bench, sc.readers);
    const double per_s = rr.samples_per_second;
    const double epoch_s = per_s > 0 ? static_cast<double>(s.train_split->samples) / per_s : 0;
    warning("--order full on a split of " + format_bytes(split_bytes) + ", larger than the " + format_bytes(avail) +
            " of memory available: every sample is a random read of " + format_bytes(sb) + "; " + rr.source +
            " predicts about " + format_count(static_cast<std::uint64_t>(per_s)) + " samples/s with " +
            std::to_string(sc.readers) + " readers, an epoch in about " + format_duration(epoch_s) +
            ". Instead: " + instead);
}

// The source configuration from the options, --bench's figures and the placement.
data::SourceConfig source_config(Session& s, const DataOptions& d, Placement asked, const OutputOptions& out) {
    const FieldInfo& x = *s.x;
    data::SourceConfig sc;
    for (const BatchField& f : train::batch_fields(s.tc)) sc.fields.push_back(f.name); // what the trainer takes
    sc.device = s.device;
    sc.order.kind = s.order;
    sc.order.seed = s.tc.seed;
    sc.order.window_chunks = d.window;
    sc.order.chunk_samples =
        d.chunk_samples ? d.chunk_samples : std::max<std::uint64_t>(1, default_chunk_bytes / x.sample_bytes());
    if (x.storage == Storage::zstd_chunked && x.chunk_samples) sc.order.chunk_samples = x.chunk_samples;
    sc.batch = s.tc.max_batch;
    sc.slice = {static_cast<std::uint32_t>(s.world->rank()), static_cast<std::uint32_t>(s.ranks())};
    sc.prefetch = d.prefetch;
    sc.readers = d.readers;
    if (!d.bench.empty()) {
        const bench::Results br = bench::load_results(d.bench);
        const LoaderTuning t =
            tune_loader(br, s.order, x.sample_bytes(), sc.batch, hardware_threads(),
                        d.prefetch_given ? std::optional<unsigned>(d.prefetch) : std::nullopt,
                        d.readers_given ? std::optional<unsigned>(d.readers) : std::nullopt, d.prefetch, d.readers);
        sc.prefetch = t.prefetch;
        sc.readers = t.readers;
        for (const auto& line : t.why) note(out, "dstrain: --bench " + d.bench.string() + ": " + line);
    }
    sc.direct = d.direct;
    if (!d.host_mem.empty()) sc.host_mem = parse_size(d.host_mem, "--host-mem");
    sc.notice = [&out](const std::string& line) { note(out, "dstrain: " + line); };
    sc.warn = [](const std::string& line) { warning(line); };
    sc.managed_policy = data::parse_managed_policy(d.managed_policy);
    sc.oversubscribe = d.oversubscribe;
    sc.compute_stream = s.trainer->compute_stream();
    std::uint64_t row_bytes = 0; // every field the trainer takes
    for (const BatchField& f : train::batch_fields(s.tc)) row_bytes += f.sample_bytes();
    const std::uint64_t split_bytes = checked_mul(s.train_split->samples, row_bytes, "split bytes") +
                                      (s.test_split ? s.test_split->samples * row_bytes : 0);
    sc.placement = resolve_placement(asked, s.device, split_bytes, s.trainer->memory_plan().total(), s.placement_why);
    if (sc.placement == Placement::stream) {
        const std::uint64_t avail = data::available_host_memory();
        // Never more host memory than there is: the stream's plan must fit (else exit 3, saying why).
        const data::HostPlan hp = data::plan_host_memory(
            *s.train_split, data::source_fields(s.ds->manifest(), *s.train_split, sc), sc, avail);
        if (asked == Placement::automatic)
            s.placement_why += "; host memory " + format_bytes(hp.total()) + " (ring + window cache) of " +
                               format_bytes(avail) + " available";
        // Where the plan would drop pages (the split does not fit in the page
        // cache beside the stream), O_DIRECT instead: buffered reads under
        // reclaim reached well under the disk's rate where O_DIRECT reached it
        // (bench-larger-than-ram).
        if (hp.drop_pages && !d.direct_given) {
            sc.direct = true;
            note(out, "dstrain: reading with O_DIRECT: the data (" + format_bytes(split_bytes) +
                          ") does not fit in the memory available beside the stream (" + format_bytes(avail) +
                          "), so the page cache cannot hold it; --no-direct reads through the page cache");
        }
    }
    if (d.direct && sc.placement != Placement::stream)
        note(out, "dstrain: --direct applies to --data stream only; the " +
                      std::string(data::placement_name(sc.placement)) + " placement loads the split once");
    if (s.order == data::Order::full && sc.placement == Placement::stream) warn_full_order(s, d, sc, split_bytes);
    return sc;
}

void open_sources(Session& s) {
    data::SourceConfig test_sc = s.sc;
    test_sc.order.kind = data::Order::sequential;
    test_sc.drop_last = false;
    test_sc.slice = {}; // every rank evaluates the whole test split
    test_sc.host_mem = 0;
    data::SourceConfig train_sc = s.sc;
    if (s.sc.placement == Placement::stream && s.test_split) {
        // Evaluation streams with the least window cache; --host-mem caps both.
        const data::HostPlan tp =
            data::plan_host_memory(*s.test_split, data::source_fields(s.ds->manifest(), *s.test_split, test_sc),
                                   test_sc, data::available_host_memory());
        test_sc.host_mem = tp.ring + tp.other + tp.min_cache;
        if (s.sc.host_mem) {
            if (s.sc.host_mem <= test_sc.host_mem)
                throw no_fit_error("--host-mem " + format_bytes(s.sc.host_mem) + " leaves nothing for training: " +
                                   "evaluating the test split takes " + format_bytes(test_sc.host_mem) +
                                   "; raise --host-mem or lower --window or --prefetch");
            train_sc.host_mem = s.sc.host_mem - test_sc.host_mem;
        }
    }
    s.train_src = data::make_batch_source(*s.ds, "train", train_sc);
    if (s.test_split) s.test_src = data::make_batch_source(*s.ds, "test", test_sc);
    if (s.train_src->batches_per_epoch() != s.steps_per_epoch) throw std::logic_error("batches per epoch disagree");
}

// Runs once every kernel and graph the run will use, so that what the CUDA
// runtime loads or allocates lazily (kernel modules under the default
// CUDA_MODULE_LOADING=LAZY, cuDNN and cuBLAS internals, a graph's first
// upload) is on the device before the ceiling is measured: an evaluation and
// a training step on the first training batch, whose effect is undone (the
// trainer state saved before, loaded after), and an evaluation of the last
// test batch (a partial one runs outside the captured graph).
void warm_up(train::Trainer& t, data::BatchSource& train_src, data::BatchSource* test_src, std::uint64_t epoch) {
    const std::vector<std::uint8_t> state = t.save_state();
    train_src.start_epoch(epoch, 0);
    if (const Batch* b = train_src.next()) {
        t.evaluate(*b);
        t.train_step(*b);
        train_src.release();
    }
    if (test_src) {
        test_src->start_epoch(0, test_src->batches_per_epoch() - 1);
        if (const Batch* b = test_src->next()) {
            t.evaluate(*b);
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

// The trainer's reducer in a distributed world: MPI on the CPU, NCCL
// (its id broadcast from rank 0 over MPI) on GPUs.
std::unique_ptr<dist::Reducer> make_reducer(Session& s, double timeout_s) {
    if (!s.on_gpu()) return s.world->host_reducer();
    // Every rank finds the same build: none waits in the broadcast for a rank 0 that threw.
    if (!dist::nccl_available())
        throw no_fit_error("data-parallel training on GPUs (" + std::to_string(s.ranks()) +
                           " ranks) needs NCCL, and this build has none; rebuild with CUDA and NCCL found, or train "
                           "the ranks on the CPU with --device cpu");
    dist::NcclId id{};
    if (s.root()) id = dist::nccl_unique_id();
    s.world->broadcast(id);
    return dist::make_nccl_reducer(id, s.world->rank(), s.ranks(), s.device.index, timeout_s);
}

} // namespace

void join_world(Session& s, TrainOptions& e, const DataOptions& d, const OutputOptions& out) {
    s.world = dist::World::join(dist::detect_launch(), e.dist_timeout);
    s.out = out;
    if (!s.root()) s.out = {true, false, false};
    if (!d.resume || e.batch_given || d.checkpoint.empty() || !checkpoint_exists(d.checkpoint)) return;
    const Checkpoint c = load_checkpoint(d.checkpoint);
    const auto it = c.run.find("batch");
    if (it == c.run.end()) return;
    const std::uint64_t global = std::strtoull(it->second.c_str(), nullptr, 10);
    const auto n = static_cast<std::uint64_t>(s.ranks());
    if (global == 0 || global % n != 0)
        throw usage_error("cannot resume from '" + checkpoint_path(d.checkpoint).string() + "' with " +
                          std::to_string(n) + " ranks (its global batch " + it->second +
                          " = ranks x --batch does not split into " + std::to_string(n) +
                          " equal batches) resume with a number of ranks that divides " + it->second);
    e.batch = static_cast<std::uint32_t>(global / n);
}

void check_options(const TrainOptions& e, const DataOptions& d) {
    if (!(e.dist_timeout > 0)) throw usage_error("invalid --dist-timeout (must be positive seconds)");
    if (e.epochs == 0) throw usage_error("invalid --epochs 0 (must be positive)");
    if (e.batch == 0) throw usage_error("invalid --batch 0 (must be positive)");
    if (d.resume && d.checkpoint.empty()) throw usage_error("--resume needs --checkpoint DIR (where to resume from)");
    if (d.resume && !e.files.init_from.empty())
        throw usage_error("--init-from with --resume (the checkpoint holds the weights); drop --init-from");
}

void open_session(Session& s, const TrainOptions& e, const DataOptions& d, const OutputOptions& out) {
    // First, while this process has no CUDA context: the device's memory before it.
    if (!e.device || e.device->backend == Backend::cuda) s.meter.emplace();
    const Placement asked = data::parse_placement(d.data);
    s.order = data::parse_order(d.order);
    (void)data::parse_managed_policy(d.managed_policy); // a usage error before the dataset is opened
    s.device = choose_device(e, out);
    if (s.on_gpu() && s.distributed()) s.device.index = s.world->local_rank(); // one GPU per rank of the host
    if (s.on_gpu()) require_gpu(s.device);
    s.precision = e.precision.value_or(s.on_gpu() ? train::Precision::tf32 : train::Precision::fp32);
    if (!s.on_gpu() && s.precision != train::Precision::fp32) {
        // Say what runs: the CPU backend has one arithmetic.
        note(out, "dstrain: --precision " + std::string(train::precision_name(s.precision)) +
                      " applies to the GPU; the CPU computes fp32");
        s.precision = train::Precision::fp32;
    }

    open_dataset(s, e);
    const train::ResolvedModel rm = resolve_session_model(s, e);
    s.spec = rm.spec;
    s.loss_default = !e.loss && rm.spec.heads.empty();
    s.steps_per_epoch = s.train_split->samples / (std::uint64_t{e.batch} * static_cast<std::uint64_t>(s.ranks()));
    s.tc = trainer_config(s, e, rm);
    std::optional<model::SavedModel> init;
    if (!e.files.init_from.empty()) init = model::prepare_init_from(e.files, s.tc, out);
    if (s.on_gpu()) s.meter->attach(s.device.index);
    s.trainer = train::make_trainer(s.tc);
    if (init) model::load_weights(*s.trainer, *init);
    if (s.distributed()) {
        s.reducer = make_reducer(s, e.dist_timeout);
        s.trainer->set_reducer(s.reducer.get());
    }

    s.sc = source_config(s, d, asked, out);
    s.sc.hash_batches = !s.on_gpu() && !e.log_json.empty();
    s.rss_before_sources = current_rss_bytes();
    open_sources(s);
}

Ceiling measure_ceiling(Session& s, std::uint64_t epoch, RunReport& r) {
    // On the GPU: what the CUDA runtime itself holds (context, library
    // handles, loaded kernels), measured once everything is built and warmed
    // up, plus the planned buffers.
    Ceiling c;
    c.data_device = s.train_src->device_bytes() + (s.test_src ? s.test_src->device_bytes() : 0);
    c.planned = r.planned.total() + c.data_device;
    c.managed = s.train_src->placement() == Placement::managed;
    // A resident split's load time belongs to the first epoch's read time; the warm-up's does not.
    c.load_seconds = s.train_src->take_times().read;
    if (s.on_gpu()) {
        warm_up(*s.trainer, *s.train_src, s.test_src.get(), epoch);
        const std::uint64_t held = s.meter->sample();
        c.overhead = held > c.planned ? held - c.planned : 0;
        r.memory_method = s.meter->method();
    }
    c.bytes = c.overhead + c.planned;
    // Host: what the process held before the sources, what the warm-up added
    // beside them (cuda libraries load kernels lazily), and the sources' plan.
    const std::uint64_t data_allocated =
        s.train_src->host_allocated() + (s.test_src ? s.test_src->host_allocated() : 0);
    const std::uint64_t rss = current_rss_bytes();
    c.host_data = s.train_src->host_bytes() + (s.test_src ? s.test_src->host_bytes() : 0);
    c.host_process = std::max(s.rss_before_sources, rss > data_allocated ? rss - data_allocated : 0);
    // The CPU trainer's buffers are host memory, allocated at its first step.
    if (!s.on_gpu()) c.host_process += r.planned.total();
    c.host_bytes = c.host_process + c.host_data;
    r.memory_ceiling = c.bytes;
    r.runtime_overhead = c.overhead;
    r.data_device_bytes = c.data_device;
    return c;
}

} // namespace dstk::run
