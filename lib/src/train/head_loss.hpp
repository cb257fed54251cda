#pragma once
// The cpu backend's reference of every loss (dstk/train/loss.hpp) and of the
// metrics it accumulates (dstk/train/metrics.hpp); the GPU's loss.cu applies
// the same formulas. And the widening of stored values the step's conversion
// does on the host.
#include <cstdint>

#include "dstk/dtype.hpp"
#include "dstk/train/metrics.hpp"
#include "dstk/train/model.hpp"

namespace dstk::train {

// Element i of a stored array, as a float.
float widen(const void* data, DType t, std::uint64_t i);

// One head's loss over n samples: z [n][width] (the head's outputs); labels
// (ce: n classes) or y ([n][width] floats). Adds to m; returns the sum over
// samples of the per-sample loss (no label smoothing). With dz, writes the
// gradient of weight x the batch's mean loss (label-smoothed for ce). A label
// outside [0, width) is a runtime error.
double head_loss(const HeadPlan& h, const float* z, const std::int32_t* labels, const float* y, std::uint32_t n,
                 float smoothing, float* dz, HeadMetrics& m);

} // namespace dstk::train
