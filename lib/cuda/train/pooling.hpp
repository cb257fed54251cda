#pragma once
// Launchers of the pooling kernels (pooling.cu). Activations and their gradients are NHWC (channels last) or, where
// `nchw` says so, NCHW; stored as float or bf16 (ActType); arithmetic is float. Everything runs on the given stream and
// is safe to capture in a graph.
#include <cuda_runtime.h>

#include <cstdint>

#include "act_type.hpp"

namespace dstk::train::cuda {

// Max / average pooling of NHWC tensors, k x k windows, stride st, no padding
// (floor). Max-pool's gradient goes to the first maximum of each window (the
// cpu backend's rule); every dx element is written (no atomics, no
// uncovered rows left stale).
struct PoolShape {
    std::uint32_t n, c, h, w, oh, ow, k, stride;
    bool nchw;
};
void launch_pool_forward(const void* x, void* y, ActType t, const PoolShape& p, bool max, cudaStream_t s);
void launch_pool_backward(const void* x, const void* dy, void* dx, ActType t, const PoolShape& p, bool max,
                          cudaStream_t s);
// Global average pool: y[n][c] = mean over hw of x, and its gradient.
void launch_gap_forward(const void* x, void* y, ActType t, std::uint32_t n, std::uint32_t c, std::uint64_t hw,
                        bool nchw, cudaStream_t s);
void launch_gap_backward(const void* dy, void* dx, ActType t, std::uint32_t n, std::uint32_t c, std::uint64_t hw,
                         bool nchw, cudaStream_t s);

} // namespace dstk::train::cuda
