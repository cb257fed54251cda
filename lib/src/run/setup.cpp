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
#include "dstk/data/convert.hpp"
#include "dstk/dist/nccl.hpp"
#include "dstk/error.hpp"
#include "dstk/gpu_info.hpp"
#include "dstk/output.hpp"
#include "dstk/sysinfo.hpp"
#include "dstk/thread_pool.hpp"
#include "dstk/units.hpp"
#include "run/stages.hpp"

namespace dstk::run {
namespace {

using data::Placement;
using train::Backend;

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

// Per-channel mean and std in stored units, by the data path's one rule
// (data::field_norm: the manifest's statistics, else a scan of the training
// split), so that dstk.Loader normalises a field as dstrain does.
void channel_stats(const Session& s, const std::string& field, std::uint32_t channels, std::vector<float>& mean,
                   std::vector<float>& stdev) {
    const data::ChannelNorm n = s.mix ? data::mix_field_norm(s.mix->pointers(), s.mix->draws(), field)
                                      : data::field_norm(*s.ds, field, "train");
    if (n.mean.size() != channels)
        throw std::logic_error("channel_stats: " + std::to_string(n.mean.size()) + " channels of statistics for " +
                               std::to_string(channels) + " input channels");
    mean = n.mean;
    stdev = n.std;
}

std::string field_list(const SplitInfo& split) {
    std::string out;
    for (const FieldInfo& f : split.fields) out += (out.empty() ? "" : ", ") + f.name;
    return out;
}

// The test split: the dataset's, or with a mix the first member's where
// every member has a non-empty one (the test mix holds them all).
const SplitInfo* test_split_of(const Session& s) {
    const SplitInfo* t = s.ds->manifest().find("test");
    if (!t || t->samples == 0) return nullptr;
    if (s.mix)
        for (const Dataset& d : s.mix->members)
            if (const SplitInfo* mt = d.manifest().find("test"); !mt || mt->samples == 0) return nullptr;
    return t;
}

void open_dataset(Session& s, const TrainOptions& e, const DataOptions& d) {
    s.mix = open_mix(e, d);
    s.ds.emplace(Dataset::open(s.mix ? s.mix->paths[0] : e.dataset));
    const Manifest& m = s.ds->manifest();
    s.train_split = &m.split("train");
    s.test_split = test_split_of(s);
    const std::string input = e.input.empty() ? m.input_field : e.input;
    if (input.empty())
        throw usage_error(s.ds->dir().string() +
                          " names no input field (its manifest has no input role); name the "
                          "field to train on with --input (its fields: " +
                          field_list(*s.train_split) + ")");
    s.x = s.train_split->find(input);
    if (!s.x)
        throw usage_error("--input " + input + ": split 'train' has no such field (its fields: " +
                          field_list(*s.train_split) + "); name one of them");
    if (s.train_split->samples == 0)
        throw usage_error("split 'train' of " + s.ds->dir().string() + " is empty (nothing to train on)");
    if (s.mix) return; // plan_mix checks the batch against the mix's epoch
    const std::uint64_t global = std::uint64_t{e.batch} * static_cast<std::uint64_t>(s.ranks());
    if (global > s.train_split->samples)
        throw usage_error("the train split has " + format_count(s.train_split->samples) + " samples, fewer than " +
                          (s.ranks() > 1
                               ? "the global batch " + std::to_string(global) + " (" + std::to_string(s.ranks()) +
                                     " ranks x --batch " + std::to_string(e.batch) + ")"
                               : "--batch " + std::to_string(e.batch)) +
                          " (use a smaller --batch)");
}

// A field's dtype, shape and classes: the training split's, and a mix's own
// fields (dataset: one class per member; index: the row in its member).
std::optional<train::FieldFacts> field_facts(const Session& s, const std::string& name) {
    const Manifest& m = s.ds->manifest();
    if (s.mix && name == data::dataset_field)
        return train::FieldFacts{DType::i32, Shape{}, static_cast<std::uint32_t>(s.mix->members.size())};
    if (s.mix && name == data::index_field) return train::FieldFacts{DType::i64, Shape{}, std::nullopt};
    const FieldInfo* f = s.train_split->find(name);
    if (!f) return std::nullopt;
    return train::FieldFacts{f->dtype, f->shape, name == m.label_field ? m.num_classes : std::nullopt};
}

// The model --model, --label, --loss and --side-input name, against the
// training split's fields: its spec (heads' losses resolved, the side input
// placed), its targets and the side input's width.
train::ResolvedModel resolve_session_model(const Session& s, const TrainOptions& e) {
    const Manifest& m = s.ds->manifest();
    train::ModelRequest req;
    req.model = e.model;
    req.input = s.x->name;
    req.label = e.label.empty() ? m.label_field : e.label;
    req.loss = e.loss;
    req.side = e.side_input;
    for (const auto& f : s.train_split->fields) req.fields_known += (req.fields_known.empty() ? "" : ", ") + f.name;
    if (s.mix) req.fields_known += ", dataset, index";
    return train::resolve_model(req, [&](const std::string& name) { return field_facts(s, name); });
}

train::TrainerConfig trainer_config(const Session& s, const TrainOptions& e, const train::ResolvedModel& rm) {
    train::TrainerConfig tc;
    tc.plan = train::plan_network(rm.spec, train::tensor_shape_from(s.x->shape), rm.targets, rm.side);
    tc.input_field = s.x->name;
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
    channel_stats(s, s.x->name, tc.plan.input.c, tc.mean, tc.std);
    if (!e.side_input.empty()) {
        const train::FieldFacts side = *field_facts(s, e.side_input);
        tc.side.field = e.side_input;
        tc.side.dtype = side.dtype;
        const std::uint32_t channels = side.shape.dims.empty() ? 1 : train::tensor_shape_from(side.shape).c;
        channel_stats(s, e.side_input, channels, tc.side.mean, tc.side.std);
    }
    return tc;
}

// The data path's settings as dstrain's flags, for the library's messages.
std::string flag_of(std::string_view setting) {
    static const std::pair<std::string_view, std::string_view> flags[] = {{"placement", "--data"},
                                                                          {"device", "--device"},
                                                                          {"order", "--order"},
                                                                          {"seed", "--seed"},
                                                                          {"window", "--window"},
                                                                          {"chunk", "--chunk-samples"},
                                                                          {"batch", "--batch"},
                                                                          {"prefetch", "--prefetch"},
                                                                          {"readers", "--readers"},
                                                                          {"direct", "--direct"},
                                                                          {"direct off", "--no-direct"},
                                                                          {"host_mem", "--host-mem"},
                                                                          {"managed_policy", "--managed-policy"},
                                                                          {"oversubscribe", "--oversubscribe"},
                                                                          {"bench", "--bench"},
                                                                          {"weights", "--weights"},
                                                                          {"fields", "--input/--label"}};
    for (const auto& [name, flag] : flags)
        if (name == setting) return std::string(flag);
    return std::string(setting);
}

// The request of the training source, from the options.
data::SourceRequest source_request(const Session& s, const DataOptions& d, Placement asked, const OutputOptions& out) {
    data::SourceRequest r;
    for (const BatchField& f : train::batch_fields(s.tc)) r.fields.push_back(f.name); // what the trainer takes
    r.placement = asked;
    r.device = s.device;
    r.order = s.order;
    r.seed = s.tc.seed;
    r.window = d.window;
    r.chunk_samples = d.chunk_samples;
    r.batch = s.tc.max_batch;
    r.slice = {static_cast<std::uint32_t>(s.world->rank()), static_cast<std::uint32_t>(s.ranks())};
    if (d.prefetch_given || d.bench.empty()) r.prefetch = d.prefetch;
    if (d.readers_given || d.bench.empty()) r.readers = d.readers;
    if (d.direct_given) r.direct = d.direct;
    if (!d.host_mem.empty()) r.host_mem = parse_size(d.host_mem, "--host-mem");
    r.managed_policy = data::parse_managed_policy(d.managed_policy, "--managed-policy");
    r.oversubscribe = d.oversubscribe;
    r.bench = d.bench;
    r.reserved_device_bytes = s.trainer->memory_plan().total();
    r.compute_stream = s.trainer->input_stream();
    r.notice = [&out](const std::string& line) { note(out, "dstrain: " + line); };
    r.warn = [](const std::string& line) { warning(line); };
    r.names = flag_of;
    return r;
}

// The training and test sources, planned once (data::plan_training) and built.
void open_sources(Session& s, const DataOptions& d, Placement asked, const OutputOptions& out) {
    data::SourceRequest r = source_request(s, d, asked, out);
    if (s.mix) {
        r.placement = Placement::automatic;
        r.names = [](std::string_view setting) {
            return setting == "placement" ? std::string("--placement") : flag_of(setting);
        };
        open_mix_sources(s, r, out); // the mix copies its members' batches: no rows
        return;
    }
    r.rows = s.trainer->reads_rows();
    s.plan = data::plan_training(*s.ds, r, s.test_split ? s.test_split->name : "", data::machine_facts(s.device));
    const data::SourcePlan& p = s.plan.train;
    for (const std::string& line : data::describe(p)) note(out, "dstrain: " + line);
    for (const std::string& line : p.tuning) note(out, "dstrain: " + line);
    if (!p.direct_why.empty()) note(out, "dstrain: " + p.direct_why);
    for (const std::string& line : p.notes) note(out, "dstrain: " + line);
    for (const std::string& line : p.warnings) warning(line);
    s.sc = p.config;
    s.sc.host_mem = r.host_mem; // the cap of both sources, as given
    s.placement_why = p.placement_why;
    s.sc.hash_batches = !s.on_gpu() && s.hash_batches;
    data::SourcePlan train = p;
    train.config.hash_batches = s.sc.hash_batches;
    s.rss_before_sources = current_rss_bytes();
    s.train_src = data::make_batch_source(*s.ds, train);
    if (s.plan.eval) s.test_src = data::make_batch_source(*s.ds, *s.plan.eval);
    if (s.train_src->batches_per_epoch() != s.steps_per_epoch) throw std::logic_error("batches per epoch disagree");
}

// Runs once every kernel and graph the run will use, so that what the CUDA
// runtime loads or allocates lazily (kernel modules under the default
// CUDA_MODULE_LOADING=LAZY, cuDNN and cuBLAS internals, a graph's first
// upload) is on the device before the ceiling is measured: an evaluation and
// a training step on the first training batch, whose effect is undone (the
// trainer state saved before, loaded after), and an evaluation of the last
// test batch (a partial one runs outside the captured graph). Without
// evaluations (the CPU's): the training step alone, whose threads' scratch
// the evaluations reuse.
void warm_up(train::Trainer& t, data::BatchSource& train_src, data::BatchSource* test_src, std::uint64_t epoch,
             bool evaluations) {
    const std::vector<std::uint8_t> state = t.save_state();
    train_src.start_epoch(epoch, 0);
    if (const Batch* b = train_src.next()) {
        if (evaluations) t.evaluate(*b);
        t.train_step(*b);
        train_src.release();
    }
    if (test_src && evaluations) {
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
    const Placement asked = data::parse_placement(d.data, "--data");
    s.order = data::parse_order(d.order, "--order");
    (void)data::parse_managed_policy(d.managed_policy,
                                     "--managed-policy"); // a usage error before the dataset is opened
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

    open_dataset(s, e, d);
    const train::ResolvedModel rm = resolve_session_model(s, e);
    s.spec = rm.spec;
    s.loss_default = !e.loss && rm.spec.heads.empty();
    const std::uint64_t samples = s.mix ? s.mix->positions() : s.train_split->samples;
    s.steps_per_epoch = samples / (std::uint64_t{e.batch} * static_cast<std::uint64_t>(s.ranks()));
    if (s.mix && s.steps_per_epoch == 0)
        throw usage_error("the mix's epoch has " + format_count(samples) + " samples, fewer than the global batch " +
                          std::to_string(std::uint64_t{e.batch} * static_cast<std::uint64_t>(s.ranks())) +
                          " (use a smaller --batch)");
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

    s.hash_batches = !e.log_json.empty();
    open_sources(s, d, asked, out);
}

Ceiling measure_ceiling(Session& s, std::uint64_t epoch, RunReport& r) {
    // On the GPU: what the CUDA runtime itself holds (context, library
    // handles, loaded kernels), measured once everything is built and warmed
    // up, plus the planned buffers. On the host (either backend): the process
    // measured after the warm-up (on the CPU its training step), so that what
    // a step adds beside the planned buffers (the CPU trainer's per-thread
    // scratch, the allocator's per-thread arenas, growing with -T) is in the
    // ceiling.
    Ceiling c;
    c.data_device = s.train_src->device_bytes() + (s.test_src ? s.test_src->device_bytes() : 0);
    c.planned = r.planned.total() + c.data_device;
    c.managed = s.train_src->placement() == Placement::managed;
    // A resident split's load time belongs to the first epoch's read time; the warm-up's does not.
    c.load_seconds = s.train_src->take_times().read;
    warm_up(*s.trainer, *s.train_src, s.test_src.get(), epoch, s.on_gpu());
    if (s.on_gpu()) {
        const std::uint64_t held = s.meter->sample();
        c.overhead = held > c.planned ? held - c.planned : 0;
        r.memory_method = s.meter->method();
    }
    c.bytes = c.overhead + c.planned;
    // Host: what the process held before the sources, what the warm-up added
    // beside them (cuda libraries load kernels lazily; the CPU trainer's
    // buffers, allocated and zeroed when it was made, and its threads'
    // scratch), and the sources' plan.
    const std::uint64_t data_resident = s.train_src->host_resident() + (s.test_src ? s.test_src->host_resident() : 0);
    const std::uint64_t rss = current_rss_bytes();
    c.host_data = s.train_src->host_bytes() + (s.test_src ? s.test_src->host_bytes() : 0);
    // The peak so far counts too: setup's transient allocations (kernel
    // timing, cuDNN's heuristics), freed by now, already set the process's
    // peak RSS, which the ceiling must not be below (the data's resident
    // bytes are at most host_data, so the sum below covers that peak).
    const std::uint64_t peak = peak_rss_bytes();
    c.host_process = std::max({s.rss_before_sources, rss > data_resident ? rss - data_resident : 0,
                               peak > data_resident ? peak - data_resident : 0});
    c.host_bytes = c.host_process + c.host_data;
    r.memory_ceiling = c.bytes;
    r.runtime_overhead = c.overhead;
    r.data_device_bytes = c.data_device;
    return c;
}

} // namespace dstk::run
