#pragma once
// Launchers of batch normalisation (batchnorm.cu). Activations and their gradients are NHWC (channels last) or, where
// `nchw` says so, NCHW; stored as float or bf16 (ActType); arithmetic is float. Everything runs on the given stream and
// is safe to capture in a graph. Reductions accumulate in float per thread and double across threads, through per-block
// partials summed in a fixed order (no float atomics).
#include <cuda_runtime.h>

#include <cstdint>

#include "act_type.hpp"

namespace dstk::train::cuda {

// Batch normalisation per channel over the n * hw values of each channel: a
// reduction over splits into `partials` (NHWC: row splits, each thread keeping
// to one channel, or one group of channels read 16 bytes at a time, where the
// block size allows; NCHW: a grid of channels x splits), a per-channel
// finalisation, an element-wise pass. `partials` holds bn_partials(c) doubles.
// Running statistics use the unbiased variance. With relu, the forward writes
// relu(bn(x)) and the backward takes the gradient with respect to that output;
// its mask is recomputed from x with the forward's coefficients (gamma, beta
// and the saved statistics, unchanged between the passes), bit for bit the
// forward's, so the ReLU output is not read back.
//
// With pool_w = w (the input width; NHWC, relu, bn_pool_fusable shapes) a
// following 2x2 max-pool of stride 2 is fused in: the forward writes only the
// pooled output y[n][h/2][w/2][c] (max of relu(bn(x)) as the unfused layers
// would store it), and the backward takes the pooled gradient and recomputes
// each window's first maximum from x, so neither the full-size output nor its
// gradient exists.
// With skip (not with pool_w; a residual block ending right above the ReLU),
// the forward writes skip + relu(bn(x)), the sum the block's end would store
// (relu(bn(x)) rounded as stored, then added), so that the ReLU's output is
// not stored and read back.
// With given_splits, the forward's reduction has been done by the layer
// before (a convolution's epilogue, tc_conv.hpp): partials hold, per channel
// and split, the sums of (v - run_mean[c]) and their squares, in the layout
// above, with given_splits splits (at most bn_max_splits_of_partials()).
std::uint64_t bn_partials(std::uint32_t channels);
unsigned bn_max_splits_of_partials();
bool bn_pool_fusable(ActType t, std::uint32_t c, std::uint64_t h, std::uint64_t w, std::uint32_t n);
void launch_bn_forward_train(const void* x, void* y, ActType t, std::uint32_t n, std::uint64_t hw, std::uint32_t c,
                             bool nchw, bool relu, const float* gamma, const float* beta, float* run_mean,
                             float* run_var, float* save_mean, float* save_invstd, double* partials, float momentum,
                             float eps, cudaStream_t s, std::uint32_t pool_w = 0, unsigned given_splits = 0,
                             const void* skip = nullptr);
// The forward's reduction pass alone (what given_splits spares a training
// forward): sums of x per channel into partials, no running statistics
// touched. Returns the splits. For timing what a convolution whose epilogue
// sums the statistics saves (the kernel choice).
unsigned launch_bn_statistics(const void* x, ActType t, std::uint32_t n, std::uint64_t hw, std::uint32_t c, bool nchw,
                              double* partials, cudaStream_t s);
void launch_bn_forward_eval(const void* x, void* y, ActType t, std::uint32_t n, std::uint64_t hw, std::uint32_t c,
                            bool nchw, bool relu, const float* gamma, const float* beta, const float* run_mean,
                            const float* run_var, float eps, double* partials, cudaStream_t s, std::uint32_t pool_w = 0,
                            const void* skip = nullptr);
void launch_bn_backward(const void* x, const void* dy, bool relu, void* dx, ActType t, std::uint32_t n,
                        std::uint64_t hw, std::uint32_t c, bool nchw, const float* gamma, const float* beta,
                        const float* save_mean, const float* save_invstd, float* dgamma, float* dbeta, double* partials,
                        cudaStream_t s, std::uint32_t pool_w = 0);

} // namespace dstk::train::cuda
