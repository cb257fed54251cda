#pragma once
// dstrain --tensorboard DIR: what a run puts in its event file
// (dstk/run/tensorboard.hpp), every value at the global step as x.
//   per step   loss/train, accuracy/train (the mean over the steps since the
//              previous point), optimizer/lr, speed/samples_per_s,
//              time/host_wait_ms_per_step, memory/host_rss_MiB,
//              memory/gpu_peak_MiB (cuda); a point at most every half second,
//              as each takes the trainer's metrics (a GPU synchronisation)
//   per epoch  loss/train_epoch, accuracy/train_epoch, loss/test,
//              accuracy/test, speed/samples_per_s_epoch, time/epoch_s, the
//              stage times time/read_wait_s, time/read_s, time/decode_s,
//              time/h2d_s, time/compute_s, memory/host_peak_rss_MiB,
//              memory/host_ceiling_MiB, memory/gpu_peak_MiB_epoch and
//              memory/gpu_ceiling_MiB (cuda), progress/epoch
//   --eval-every: loss/test and accuracy/test at those steps
// Under mpirun the step points are rank 0's slice of each global batch; the
// epoch points are the world's, as the epoch line.
#include <cstdint>
#include <optional>

#include "clock.hpp"
#include "dstk/run/tensorboard.hpp"
#include "run/stages.hpp"

namespace dstk::run {

// The steps since the previous point.
struct StepWindow {
    std::uint64_t step = 0; // the global step of the point
    std::uint64_t steps = 0;
    train::Metrics train; // this rank's
    double seconds = 0;   // wall time since the previous point
    double host_wait = 0; // seconds the loop waited for batches (LoopTimes::next)
    float lr = 0;
    std::uint64_t host_rss = 0;
    std::optional<std::uint64_t> gpu_peak; // cuda: the meter's peak since the epoch began
    int ranks = 1;
};

class TensorBoardLog {
  public:
    // Off where `dir` is empty (no --tensorboard, or a rank other than 0).
    TensorBoardLog(const std::string& dir, const OutputOptions& out);
    bool on() const { return file_.has_value(); }
    // After a step: whether a step point is due.
    bool due() const { return on() && data::seconds_since(last_) >= 0.5; }
    void step(const StepWindow& w);
    void epoch(const Session& s, const EpochOutcome& o, const Ceiling& c);
    void eval(std::uint64_t step, const train::Metrics& m);

  private:
    std::optional<EventFile> file_;
    data::Clock::time_point last_ = data::Clock::now();
};

} // namespace dstk::run
