// On the CPU, an epoch of the default model can take many minutes: say so
// before the first step, from one timed forward pass, rather than let the
// user find out from the first epoch line.
#include "run/cpu_estimate.hpp"

#include "clock.hpp"
#include "dstk/units.hpp"

namespace dstk::run {
namespace {

// Backward takes about twice the forward pass (a gradient for the inputs
// and one for the weights), the update little beside them.
constexpr double step_per_forward = 3.0;
// An epoch longer than this gets the suggestion of a smaller model.
constexpr double long_epoch_seconds = 120.0;

} // namespace

void estimate_cpu_epoch(Session& s, const TrainOptions& e, const OutputOptions& out) {
    if (s.on_gpu() || out.quiet || !s.root() || s.ranks() != 1) return;
    data::BatchSource& src = s.test_src ? *s.test_src : *s.train_src;
    src.start_epoch(0, 0);
    const Batch* b = src.next();
    if (!b) return;
    const auto t0 = data::Clock::now();
    s.trainer->evaluate(*b);
    (void)s.trainer->take_eval_metrics(); // synchronises
    const double forward = data::seconds_since(t0);
    const std::uint32_t size = b->size;
    src.release();
    (void)src.take_times();
    const double rate = static_cast<double>(size) / (step_per_forward * forward);
    const double epoch = static_cast<double>(s.steps_per_epoch * s.global_batch()) / rate;
    std::string line = "dstrain: on the CPU: about " + format_duration(epoch) + " per epoch (" +
                       format_count(static_cast<std::uint64_t>(rate)) +
                       " samples/s, estimated from one timed forward pass)";
    if (epoch > long_epoch_seconds && e.model != "small-cnn") line += "; --model small-cnn trains several times faster";
    note(out, line);
}

} // namespace dstk::run
