// What a dstrain run tells the user: the setup notes, the memory ceiling, one
// line per epoch on stdout (stderr with --json), --log-json lines and the
// --json document.
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <sstream>

#include "dstk/env.hpp"
#include "dstk/error.hpp"
#include "dstk/fd.hpp"
#include "dstk/json.hpp"
#include "dstk/output.hpp"
#include "dstk/units.hpp"
#include "run/stages.hpp"

namespace dstk::run {
namespace {

std::string stage_text(const data::StageTimes& t) {
    return "read wait " + format_duration(t.read_wait) + ", read " + format_duration(t.read) +
           (t.decode > 0 ? ", decode " + format_duration(t.decode) : std::string()) +
           (t.h2d > 0 ? ", h2d " + format_duration(t.h2d) : std::string()) + ", compute " + format_duration(t.compute);
}

nlohmann::json stage_json(const data::StageTimes& t) {
    nlohmann::json j{{"read_wait_s", t.read_wait},   {"read_s", t.read},
                     {"decode_s", t.decode},         {"h2d_s", t.h2d},
                     {"compute_s", t.compute},       {"reads", t.io.reads},
                     {"read_bytes", t.io.bytes},     {"read_smallest", t.io.smallest},
                     {"read_largest", t.io.largest}, {"cache_peak", t.cache_peak}};
    j["limited_by"] = std::string(data::limiting_stage(t));
    if (t.batch_hash) j["batch_hash"] = *t.batch_hash;
    return j;
}

// A classifier as dstrain trained before heads: its epoch lines keep their form.
bool one_class_head(const train::Metrics& m) {
    return m.heads.size() == 1 && m.heads[0].name.empty() && m.heads[0].kind == train::LossKind::ce;
}

nlohmann::json figures_json(const train::HeadMetrics& m) {
    nlohmann::json j;
    for (const auto& f : train::figures(m)) j[f.key] = f.value;
    return j;
}

// Each head's figures, training and test (where evaluated).
nlohmann::json heads_json(const train::Metrics& train, const train::Metrics& test) {
    nlohmann::json heads = nlohmann::json::array();
    for (std::size_t h = 0; h < train.heads.size(); ++h) {
        nlohmann::json j{{"name", train.heads[h].name},
                         {"loss_kind", train::loss_name(train.heads[h].kind)},
                         {"train", figures_json(train.heads[h])}};
        if (h < test.heads.size() && test.samples) j["test"] = figures_json(test.heads[h]);
        heads.push_back(j);
    }
    return heads;
}

// " [robs: r2 0.4512  r 0.6731 | test r2 0.4401  r 0.6650]" per head (figures but the loss).
std::string heads_text(const train::Metrics& train, const train::Metrics& test) {
    std::string out;
    for (std::size_t h = 0; h < train.heads.size(); ++h) {
        out += "  [" + (train.heads[h].name.empty() ? std::string() : train.heads[h].name + ": ") +
               train::figures_text(train.heads[h]);
        if (h < test.heads.size() && test.samples) out += " | test " + train::figures_text(test.heads[h]);
        out += "]";
    }
    return out;
}

// The per-epoch fields of --json's document.
// The rate of an epoch's training in its matrix products, TFLOP/s.
double matmul_tflops(const EpochReport& e, std::uint64_t training_flops) {
    return e.samples_per_second * static_cast<double>(training_flops) / 1e12;
}

nlohmann::json epoch_json(const EpochReport& e, const RunReport& r) {
    return {{"epoch", e.epoch},
            {"train_loss", e.train.loss()},
            {"train_accuracy", e.train.accuracy()},
            {"test_loss", e.test.loss()},
            {"test_accuracy", e.test.accuracy()},
            {"seconds", e.seconds},
            {"train_seconds", e.train_seconds},
            {"samples_per_second", e.samples_per_second},
            {"matmul_tflops", matmul_tflops(e, r.training_flops)},
            {"lr", e.lr},
            {"gpu_memory_planned", r.device == "cpu" ? 0 : r.planned.total()},
            {"gpu_memory_measured", r.measured_device_bytes},
            {"heads", heads_json(e.train, e.test)}};
}

std::string loop_text(const LoopTimes& t) {
    const double ms = 1000.0 / static_cast<double>(std::max<std::uint64_t>(1, t.steps));
    char buf[200];
    std::snprintf(buf, sizeof buf,
                  "per step: host next %.3f ms, launch %.3f ms, rest %.3f ms (slowest step %.3f ms); GPU between "
                  "steps %.3f ms",
                  t.next * ms, t.launch * ms, t.rest * ms, t.slowest_step * 1000.0, t.between * ms);
    return buf;
}

nlohmann::json loop_json(const LoopTimes& t) {
    return {{"steps", t.steps},
            {"host_next_s", t.next},
            {"host_launch_s", t.launch},
            {"host_rest_s", t.rest},
            {"host_slowest_step_s", t.slowest_step},
            {"gpu_between_steps_s", t.between}};
}

bool step_times_wanted() {
    return env_flag("DSTK_STEP_TIMES").value_or(false);
}

std::string epoch_line(const Session& s, const TrainOptions& e, const EpochOutcome& o, const Ceiling& c) {
    const EpochReport& er = o.report;
    std::ostringstream line;
    line << "epoch " << er.epoch << "/" << e.epochs << (o.whole ? "" : " (part)") << "  loss "
         << fixed(er.train.loss(), 4);
    if (one_class_head(er.train))
        line << "  train acc " << fixed(100 * er.train.accuracy(), 2) << "%  test acc "
             << (s.test_src ? fixed(100 * er.test.accuracy(), 2) + "%" : std::string("-"));
    else
        line << "  test loss " << (s.test_src ? fixed(er.test.loss(), 4) : std::string("-"))
             << heads_text(er.train, s.test_src ? er.test : train::Metrics{});
    line << "  time " << format_duration(er.seconds) << "  "
         << format_count(static_cast<std::uint64_t>(er.samples_per_second)) << " samples/s";
    if (s.on_gpu())
        line << "  GPU mem " << format_bytes(o.peak)
             << (s.ranks() > 1 ? " (largest of " + std::to_string(s.ranks()) + " ranks," : std::string(" ("))
             << "ceiling " << format_bytes(c.bytes) << (c.managed ? " + managed pages" : "") << ")";
    line << "  host RSS " << format_bytes(peak_rss_bytes()) << " (ceiling " << format_bytes(c.host_bytes) << ")";
    line << "  [" << stage_text(o.stages) << "; limited by " << data::limiting_stage(o.stages) << "]";
    if (step_times_wanted()) line << "  [" << loop_text(o.loop) << "]";
    return line.str();
}

// The class count and where it came from: a count dsconvert took from the
// largest label misses the classes no sample shows, silently otherwise.
std::string classes_text(const Manifest& m, std::uint32_t classes) {
    const auto it = m.provenance.params.find("num_classes_from");
    std::string from = "num_classes of dataset.json";
    if (it != m.provenance.params.end())
        from += ", from " + it->second + " (" + m.provenance.tool + ")";
    else if (!m.provenance.tool.empty())
        from += ", written by " + m.provenance.tool;
    return std::to_string(classes) + " classes (" + from + ")";
}

} // namespace

std::string fixed(double v, int digits) {
    char buf[64];
    std::snprintf(buf, sizeof buf, "%.*f", digits, v);
    return buf;
}

JsonLog::JsonLog(const std::string& path, bool resume, bool force) : path_(path) {
    if (path.empty()) return;
    file_.emplace(path, resume || force ? Replace::earlier : Replace::never);
    struct stat st {};
    if (resume && ::lstat(path.c_str(), &st) == 0) { // the lines of the run this one continues
        const std::string earlier = read_input_file(path, "log", 1ull << 30, O_NOFOLLOW);
        file_->write(earlier.data(), earlier.size());
    }
    // In place from the start: read while the run goes, kept if it is
    // killed, and a second run to the same name is refused now, not at its end.
    file_->keep_open();
    file_->commit();
}

void JsonLog::emit(const nlohmann::json& j) {
    if (!file_) return;
    const std::string line = dump_json(j, -1, "the log '" + path_ + "'") + "\n";
    file_->write(line.data(), line.size());
}

namespace {

// One line per head (its target, loss and why that loss), and the side input.
void describe_targets(const Session& s, const OutputOptions& out) {
    for (const auto& h : s.tc.plan.heads) {
        const train::Target& t = h.target;
        const std::string what = std::string(dtype_name(t.dtype)) + (t.shape.dims.empty() ? "" : " " + t.shape.str()) +
                                 ", " + std::to_string(t.width) +
                                 (t.loss == train::LossKind::ce ? " classes" : " outputs");
        std::string why;
        if (h.name.empty() && s.loss_default)
            why = t.loss == train::LossKind::ce ? "; the default for one integer per sample, --loss sets another"
                                                : "; the default for this dtype and shape, --loss sets another";
        note(out, "dstrain: " + (h.name.empty() ? std::string("loss ") : "head " + h.name + ": loss ") +
                      std::string(train::loss_name(t.loss)) + " on '" + t.field + "' (" + what + why + ")" +
                      (h.weight != 1.0f ? ", weight " + fixed(h.weight, 3) : std::string()));
    }
    if (s.tc.plan.side)
        note(out, "dstrain: side input '" + s.tc.side.field + "' (" + std::string(dtype_name(s.tc.side.dtype)) + ", " +
                      std::to_string(s.tc.plan.side) +
                      " values per sample), normalised and joined to the flat features where 'side' stands");
}

} // namespace

RunReport first_report(const Session& s) {
    RunReport r;
    r.model = s.tc.plan.name;
    r.device = train::device_name(s.device);
    r.precision = train::precision_name(s.precision);
    r.parameters = s.tc.plan.params;
    r.training_flops = s.tc.plan.training_flops();
    r.planned = s.trainer->memory_plan();
    r.measured_device_bytes = s.trainer->measured_device_bytes();
    r.rank = s.world->rank();
    r.ranks = s.ranks();
    r.global_batch = static_cast<std::uint32_t>(s.global_batch());
    return r;
}

namespace {

// "N train / M test samples"; a mix's per epoch, over its members.
// "176.6 MFLOP per trained sample": the matrix products' count (NetworkPlan::training_flops).
std::string mflops_text(const train::NetworkPlan& p) {
    char buf[64];
    std::snprintf(buf, sizeof buf, "%.1f MFLOP per trained sample", static_cast<double>(p.training_flops()) / 1e6);
    return buf;
}

std::string samples_text(const Session& s) {
    if (!s.mix)
        return format_count(s.train_split->samples) + " train / " +
               format_count(s.test_split ? s.test_split->samples : 0) + " test samples";
    return format_count(s.mix->plan.positions) + " train samples per epoch / " +
           format_count(s.mix->eval ? s.mix->eval->positions : 0) + " test samples over " +
           std::to_string(s.mix->members.size()) + " datasets";
}

} // namespace

void describe_session(const Session& s, const DataOptions& d, const RunReport& r, const OutputOptions& out) {
    note(out, "dstrain: model " + s.tc.plan.name + " (" + train::to_spec_string(s.spec) + ")");
    const auto& heads = s.tc.plan.heads;
    const bool classifier = heads.size() == 1 && heads[0].name.empty() && heads[0].target.loss == train::LossKind::ce;
    note(out, "dstrain: " + format_count(s.tc.plan.params) + " parameters, " + mflops_text(s.tc.plan) + ", input " +
                  s.tc.plan.input.str() + " " + std::string(dtype_name(s.x->dtype)) + ", " +
                  (classifier ? classes_text(s.ds->manifest(), heads[0].target.width)
                              : std::to_string(heads.size()) + (heads.size() > 1 ? " heads" : " head")) +
                  ", " + samples_text(s) + ", device " + r.device + ", " + r.precision);
    note(out, "dstrain: data " + std::string(data::placement_name(s.train_src->placement())) + " (" + s.placement_why +
                  "), order " + std::string(data::order_name(s.order)) +
                  (s.order == data::Order::chunk ? " (" + format_count(s.sc.order.chunk_samples) + " samples x " +
                                                       std::to_string(d.window) + " chunks per window)"
                                                 : std::string()) +
                  ", " + format_count(s.steps_per_epoch) + " steps per epoch");
    describe_targets(s, out);
    if (s.distributed())
        note(out, "dstrain: data parallel: " + std::to_string(s.ranks()) + (s.ranks() > 1 ? " ranks (" : " rank (") +
                      s.world->launch().launcher + "), global batch " + std::to_string(s.global_batch()) + " = " +
                      std::to_string(s.ranks()) + " x " + std::to_string(s.tc.max_batch) +
                      ", gradients averaged with " +
                      (s.on_gpu() ? "NCCL, each rank on cuda:LOCAL_RANK" : "MPI in rank order") +
                      "; figures below are the world's");
    for (const auto& line : train::kernel_choice_lines(s.trainer->kernel_choices(), s.tc.plan))
        note(out, "dstrain: kernels (--kernels " + std::string(train::kernel_mode_name(s.tc.kernels)) + ") " + line);
}

void report_ceiling(const Session& s, const Ceiling& c, const RunReport& r, JsonLog& log, const OutputOptions& out) {
    const bool on_gpu = s.on_gpu();
    const std::string slots =
        s.train_src->placement() == data::Placement::stream
            ? " (" + std::to_string(std::max(s.sc.prefetch, on_gpu ? 2u : 1u)) +
                  " batch slots per split, whatever the dataset size)"
            : std::string(c.managed ? " (managed: the split's pages the GPU holds are not in the ceiling)" : "");
    const std::string buffers = "parameters " + format_bytes(r.planned.parameters) + " + activations " +
                                format_bytes(r.planned.activations) + " + workspace " +
                                format_bytes(r.planned.workspace) + " + data " + format_bytes(c.data_device) + slots;
    if (on_gpu)
        note(out, "dstrain: GPU memory ceiling " + format_bytes(c.bytes) + " = runtime overhead " +
                      format_bytes(c.overhead) +
                      " (measured after a warm-up: CUDA context, cuDNN/cuBLAS, loaded kernels) + planned " +
                      format_bytes(c.planned) + " (" + buffers + "); peaks measured with " + r.memory_method);
    else
        note(out, "dstrain: memory ceiling " + format_bytes(c.bytes) + " = " + buffers);
    note(out, "dstrain: host memory ceiling " + format_bytes(c.host_bytes) + " = process " +
                  format_bytes(c.host_process) + " (resident before the data path" +
                  (on_gpu ? ", and what the warm-up added: CUDA libraries" : "") + ") + data path " +
                  format_bytes(c.host_data) +
                  (s.train_src->placement() == data::Placement::stream
                       ? " (ring + window cache of whole chunks" +
                             (s.sc.host_mem ? ", --host-mem " + format_bytes(s.sc.host_mem)
                                            : std::string(", chosen from available memory; cap it with --host-mem")) +
                             ")"
                       : std::string(s.on_gpu() ? " (staging)" : " (the split in host memory)")));
    log.emit({{"event", "memory"},
              {"memory_ceiling", c.bytes},
              {"runtime_overhead", c.overhead},
              {"planned_parameters", r.planned.parameters},
              {"planned_activations", r.planned.activations},
              {"planned_workspace", r.planned.workspace},
              {"planned_data", c.data_device},
              {"host_ceiling", c.host_bytes},
              {"host_process", c.host_process},
              {"host_planned_data", c.host_data},
              {"method", on_gpu ? r.memory_method : std::string("planned host memory (not measured)")}});
}

void report_epoch(const Session& s, const TrainOptions& e, const EpochOutcome& o, const Ceiling& c, JsonLog& log,
                  const OutputOptions& out) {
    const std::string line = epoch_line(s, e, o, c);
    if (out.json)
        note(out, line);
    else
        std::printf("%s\n", line.c_str()), std::fflush(stdout);
    const EpochReport& er = o.report;
    nlohmann::json j{{"event", "epoch"},
                     {"epoch", er.epoch},
                     {"steps", o.steps},
                     {"train_loss", er.train.loss()},
                     {"train_accuracy", er.train.accuracy()},
                     {"test_loss", er.test.loss()},
                     {"test_accuracy", er.test.accuracy()},
                     {"seconds", er.seconds},
                     {"train_seconds", er.train_seconds},
                     {"samples_per_second", er.samples_per_second},
                     {"matmul_tflops", matmul_tflops(er, s.tc.plan.training_flops())},
                     {"lr", er.lr},
                     {"placement", data::placement_name(s.train_src->placement())},
                     {"order", data::order_name(s.order)},
                     {"stages", stage_json(o.stages)},
                     {"loop", loop_json(o.loop)},
                     {"memory_ceiling", c.bytes},
                     {"host_ceiling", c.host_bytes},
                     {"host_peak_rss", peak_rss_bytes()},
                     {"heads", heads_json(er.train, s.test_src ? er.test : train::Metrics{})}};
    if (s.on_gpu()) j["gpu_memory_peak"] = o.peak;
    if (s.on_gpu() && s.ranks() > 1) j["gpu_memory_peak_per_rank"] = o.peaks;
    if (s.distributed()) j["ranks"] = s.ranks();
    if (!o.index_hashes.empty()) {
        j["global_batch"] = s.global_batch();
        j["first_batch"] = o.first_batch;
        j["index_hashes"] = o.index_hashes;
    }
    if (s.mix && s.mix->train) {
        // Each member's samples in this epoch's batches, beside the plan's share and the mix's host ceiling.
        j["mix_samples"] = s.mix->train->delivered();
        nlohmann::json shares = nlohmann::json::array();
        for (const data::MixMemberPlan& m : s.mix->plan.members) shares.push_back(m.share);
        j["mix_planned_shares"] = shares;
        j["mix_host_ceiling"] = s.mix->plan.host_bytes;
    }
    log.emit(j);
}

void report_eval(std::uint64_t steps, const train::Metrics& m, JsonLog& log, const OutputOptions& out) {
    nlohmann::json heads = nlohmann::json::array();
    for (const auto& h : m.heads)
        heads.push_back({{"name", h.name}, {"loss_kind", train::loss_name(h.kind)}, {"test", figures_json(h)}});
    note(out, "step " + std::to_string(steps) + "  test loss " + fixed(m.loss(), 4) +
                  (one_class_head(m) ? "  test acc " + fixed(100 * m.accuracy(), 2) + "%" : heads_text(m, {})));
    log.emit({{"event", "eval"},
              {"step", steps},
              {"test_loss", m.loss()},
              {"test_accuracy", m.accuracy()},
              {"heads", heads}});
}

void warn_over_ceiling(std::uint64_t peak, const Ceiling& c, const RunReport& r) {
    warning("measured GPU memory " + format_bytes(peak) + " (" + r.memory_method + ") exceeds the ceiling " +
            format_bytes(c.bytes) + " by " + format_bytes(peak - c.bytes) + " (memory allocated after the warm-up" +
            (r.memory_method.find("device-wide") != std::string::npos ? ", or by another process" : "") +
            "); the run goes on");
}

std::string run_report_json(const RunReport& r) {
    nlohmann::json j = {{"schema_version", 1},
                        {"tool", "dstrain"},
                        {"model", r.model},
                        {"device", r.device},
                        {"precision", r.precision},
                        {"parameters", r.parameters},
                        {"training_flops_per_sample", r.training_flops},
                        {"ranks", r.ranks},
                        {"global_batch", r.global_batch},
                        {"gpu_memory",
                         {{"planned", r.device == "cpu" ? 0 : r.planned.total()},
                          {"planned_parameters", r.planned.parameters},
                          {"planned_activations", r.planned.activations},
                          {"planned_workspace", r.planned.workspace},
                          {"measured", r.measured_device_bytes},
                          {"ceiling", r.memory_ceiling},
                          {"runtime_overhead", r.runtime_overhead},
                          {"planned_data", r.data_device_bytes},
                          {"peak", r.peak_device_bytes},
                          {"method", r.memory_method}}},
                        {"epochs", nlohmann::json::array()}};
    for (const auto& e : r.epochs) j["epochs"].push_back(epoch_json(e, r));
    return j.dump(2) + "\n";
}

std::uint64_t current_rss_bytes() {
    std::ifstream statm("/proc/self/statm");
    std::uint64_t size = 0, resident = 0;
    if (!(statm >> size >> resident)) return 0;
    return resident * static_cast<std::uint64_t>(::sysconf(_SC_PAGESIZE));
}

} // namespace dstk::run
