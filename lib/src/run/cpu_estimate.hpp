#pragma once
// dstrain on the CPU: the expected epoch time, printed before the first step
// (with a smaller model suggested when an epoch is long).
#include "run/stages.hpp"

namespace dstk::run {

// Times one forward pass of a test (else train) batch; nothing on the GPU, with
// --quiet, or in a data-parallel run.
void estimate_cpu_epoch(Session& s, const TrainOptions& e, const OutputOptions& out);

} // namespace dstk::run
