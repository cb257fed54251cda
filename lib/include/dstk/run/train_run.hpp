#pragma once
// A dstrain run: dataset -> BatchSource (device, stream or managed placement;
// sequential, chunk or full order) -> Trainer, with the memory ceiling,
// per-stage timing, evaluation every epoch or N steps, checkpoints,
// SIGINT/SIGTERM handling and resume. Its stages live in lib/src/run/:
// setup (dataset, device, trainer, sources), ceiling, loop, report.
#include "dstk/output.hpp"
#include "dstk/run/options.hpp"
#include "dstk/run/report.hpp"

namespace dstk::run {

// Throws Error: usage (options, empty split, batch larger than the split,
// resume with other options), no_fit (no GPU, managed split too large),
// failure (I/O, bad chunk, divergence: the last checkpoint is kept),
// interrupted (after SIGINT/SIGTERM: the step finished and, with
// --checkpoint, a checkpoint written).
RunReport run_training(const TrainOptions& e, const DataOptions& d, const OutputOptions& out);

} // namespace dstk::run
