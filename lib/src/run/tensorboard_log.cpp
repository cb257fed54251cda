#include "run/tensorboard_log.hpp"

#include <algorithm>

#include "dstk/output.hpp"

namespace dstk::run {
namespace {

double mib(std::uint64_t bytes) {
    return static_cast<double>(bytes) / (1024.0 * 1024.0);
}

} // namespace

TensorBoardLog::TensorBoardLog(const std::string& dir, const OutputOptions& out) {
    if (dir.empty()) return;
    file_.emplace(dir);
    note(out, "dstrain: TensorBoard events in " + file_->path().string() + " (tensorboard --logdir " + dir + ")");
}

void TensorBoardLog::step(const StepWindow& w) {
    last_ = data::Clock::now();
    if (!on() || w.steps == 0) return;
    const double secs = std::max(1e-9, w.seconds);
    std::vector<Scalar> v{{"loss/train", w.train.loss()},
                          {"accuracy/train", w.train.accuracy()},
                          {"optimizer/lr", w.lr},
                          {"speed/samples_per_s", static_cast<double>(w.train.samples) * w.ranks / secs},
                          {"time/host_wait_ms_per_step", 1000.0 * w.host_wait / static_cast<double>(w.steps)},
                          {"memory/host_rss_MiB", mib(w.host_rss)}};
    if (w.gpu_peak) v.push_back({"memory/gpu_peak_MiB", mib(*w.gpu_peak)});
    file_->write(static_cast<std::int64_t>(w.step), v);
}

void TensorBoardLog::epoch(const Session& s, const EpochOutcome& o, const Ceiling& c) {
    if (!on()) return;
    const EpochReport& er = o.report;
    std::vector<Scalar> v{{"loss/train_epoch", er.train.loss()},
                          {"accuracy/train_epoch", er.train.accuracy()},
                          {"speed/samples_per_s_epoch", er.samples_per_second},
                          {"time/epoch_s", er.seconds},
                          {"time/read_wait_s", o.stages.read_wait},
                          {"time/read_s", o.stages.read},
                          {"time/decode_s", o.stages.decode},
                          {"time/h2d_s", o.stages.h2d},
                          {"time/compute_s", o.stages.compute},
                          {"memory/host_peak_rss_MiB", mib(peak_rss_bytes())},
                          {"memory/host_ceiling_MiB", mib(c.host_bytes)},
                          {"progress/epoch", static_cast<double>(er.epoch)}};
    if (s.test_src && er.test.samples) { // --eval-every evaluates at its steps instead
        v.push_back({"loss/test", er.test.loss()});
        v.push_back({"accuracy/test", er.test.accuracy()});
    }
    if (s.on_gpu()) {
        v.push_back({"memory/gpu_peak_MiB_epoch", mib(o.peak)});
        v.push_back({"memory/gpu_ceiling_MiB", mib(c.bytes)});
    }
    file_->write(static_cast<std::int64_t>(o.steps), v);
}

void TensorBoardLog::eval(std::uint64_t step, const train::Metrics& m) {
    if (!on()) return;
    file_->write(static_cast<std::int64_t>(step), {{"loss/test", m.loss()}, {"accuracy/test", m.accuracy()}});
}

} // namespace dstk::run
