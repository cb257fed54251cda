#pragma once
// The loss kernel's launcher (loss.cu). Activations and their gradients are NHWC (channels last) or, where `nchw`
// says so, NCHW; stored as float or bf16 (ActType); arithmetic is float.
// Everything runs on the given stream and is safe to capture in a graph.
// Only the metrics counters use atomics.
#include <cuda_runtime.h>

#include <cstdint>

#include "act_type.hpp"

namespace dstk::train::cuda {

// Device counters the loss kernel accumulates into.
struct DeviceMetrics {
    double loss_sum;
    unsigned long long correct;
    unsigned long long first_nonfinite; // step, or ~0 when none
};

// Softmax cross-entropy over logits[n][k] (float math): accumulates the plain
// loss and the correct count into m, records the first non-finite step, and
// (when dlogits is not null) writes the gradient of the mean label-smoothed
// loss.
void launch_softmax_xent(const void* logits, ActType t, const std::int32_t* labels, std::uint32_t n, std::uint32_t k,
                         float smoothing, void* dlogits, DeviceMetrics* m, const unsigned long long* step,
                         cudaStream_t s);

} // namespace dstk::train::cuda
