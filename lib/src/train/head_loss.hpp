#pragma once
// The cpu backend's reference of every loss (dstk/train/loss.hpp) and of the
// metrics it accumulates (dstk/train/metrics.hpp); the GPU's loss.cu applies
// the same formulas. (The widening of stored values is the core's one
// routine, dstk/widen.hpp.)
#include <cstdint>
#include <limits>

#include "dstk/dtype.hpp"
#include "dstk/train/metrics.hpp"
#include "dstk/train/model.hpp"

namespace dstk::train {

// One head's loss over n samples: z [n][width] (the head's outputs); labels
// (ce: n classes) or y ([n][width] floats). Adds to m; returns the sum over
// samples of the per-sample loss (no label smoothing). With dz, writes the
// gradient of weight x the batch's mean loss (label-smoothed for ce). A label
// outside [0, width), and a bce target neither 0 nor 1, are runtime errors.
// The label's rank among a sample's k outputs z: the classes ahead of it
// (ties: those before it, as argmax picks the first); 0 means the prediction
// is right. `unranked` (in no top-k) where any output is NaN or Inf:
// comparisons with NaN are false, so such a sample would otherwise rank
// first, a model gone to NaN scoring 100%.
inline constexpr std::uint32_t unranked = std::numeric_limits<std::uint32_t>::max();
std::uint32_t label_rank(const float* z, std::uint32_t k, std::uint32_t label);

double head_loss(const HeadPlan& h, const float* z, const std::int32_t* labels, const float* y, std::uint32_t n,
                 float smoothing, float* dz, HeadMetrics& m);

} // namespace dstk::train
