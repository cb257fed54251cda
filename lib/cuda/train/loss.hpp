#pragma once
// The heads' loss kernels (loss.cu): every loss of dstk/train/loss.hpp, its
// gradient and its metrics in one kernel per head, reading the head's outputs
// once. Outputs and gradients are [n][k] (flat predictions: the layout does
// not matter), stored as float or bf16 (ActType); arithmetic is float, metric
// sums double. Everything runs on the given stream and is safe to capture in
// a graph. Only the metrics counters use atomics.
#include <cuda_runtime.h>

#include <cstdint>

#include "act_type.hpp"
#include "dstk/train/loss.hpp"

namespace dstk::train::cuda {

// Device counters of one head (the per-output sums of the other losses lie
// beside them: HeadMetrics::rows x k doubles).
struct DeviceHeadMetrics {
    double loss_sum;            // ce: sum over samples of the loss
    unsigned long long correct; // ce: samples; bce: 0/1 decisions
    unsigned long long top5;    // ce
    unsigned long long
        bad_labels; // ce: samples whose label is outside [0, k) (loss and gradient 0); bce: targets neither 0 nor 1
};

struct HeadLossArgs {
    const void* z = nullptr; // [n][k] outputs
    std::uint32_t n = 0, k = 0;
    LossKind loss = LossKind::ce;
    float smoothing = 0.0f; // ce
    float weight = 1.0f;
    const std::int32_t* labels = nullptr; // ce: n classes
    const float* y = nullptr;             // others: [n][k] targets
    void* dz = nullptr;                   // the gradient of weight x the mean loss; null: evaluation
    DeviceHeadMetrics* m = nullptr;
    double* sums = nullptr;                        // others: [HeadMetrics::rows][k]
    unsigned long long* first_nonfinite = nullptr; // atomicMin'd with *step where a loss is NaN or Inf
    const unsigned long long* step = nullptr;
};

void launch_head_loss(const HeadLossArgs& a, ActType t, cudaStream_t s);

} // namespace dstk::train::cuda
