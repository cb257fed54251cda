#pragma once
// Launchers for dstrain's own kernels (kernels.cu): input conversion, batch
// norm (with an optional fused ReLU), ReLU, pooling, bias, residual and dropout
// element-wise work, layout changes, weight copies, the loss and optimiser
// updates. Everything runs on the given stream and is safe to capture in a
// graph. Activations and their gradients are NHWC (channels last) or, where
// `nchw` says so, NCHW; stored as float or bf16 (ActType); arithmetic is float, reductions accumulate in float
// per thread and double across threads. No kernel here adds floats with
// atomics: reductions go through per-block partials summed in a fixed order,
// so results do not depend on scheduling (only the metrics counters use
// atomics).
#include <cuda_runtime.h>

#include <cstdint>

#include "dstk/dtype.hpp"
#include "dstk/train/optimizer.hpp"

namespace dstk::train::cuda {

enum class ActType : std::uint8_t { f32, bf16 };
inline std::uint64_t act_bytes(ActType t) {
    return t == ActType::bf16 ? 2 : 4;
}

// Device counters the loss kernel accumulates into.
struct DeviceMetrics {
    double loss_sum;
    unsigned long long correct;
    unsigned long long first_nonfinite; // step, or ~0 when none
};

// x' = (x - mean[c]) / std[c] from stored CHW samples into `out` of type t,
// NHWC with out_channels >= channels (the extra channels zero), or NCHW with
// out_channels == channels; labels copied into `labels_out`.
void launch_convert_input(const void* x, DType dtype, const std::int32_t* labels, std::uint32_t n,
                          std::uint32_t channels, std::uint64_t hw, const float* mean, const float* inv_std, void* out,
                          ActType t, bool nchw, std::uint32_t out_channels, std::int32_t* labels_out, cudaStream_t s);

// y[n][hw][c] += bias[c] (feature rows: hw = 1)
void launch_add_bias(void* y, ActType t, const float* bias, std::uint64_t n, std::uint32_t c, std::uint64_t hw,
                     bool nchw, cudaStream_t s);
// db[c] = sum over n, hw of dy
void launch_bias_grad(const void* dy, ActType t, float* db, std::uint64_t n, std::uint32_t c, std::uint64_t hw,
                      bool nchw, cudaStream_t s);
void launch_add(const void* a, const void* b, void* out, ActType t, std::uint64_t count, cudaStream_t s);
void launch_copy(const void* a, void* out, ActType t, std::uint64_t count, cudaStream_t s);
// Dropout with the same Philox mask as the cpu backend, indexed by the NCHW
// element: keep where philox(seed, stream(layer, step), i)[0] >= p * 2^32,
// scaled by 1/(1-p). The float mask is kept for the backward pass.
void launch_dropout_forward(const void* x, void* y, float* mask, ActType t, std::uint64_t count, std::uint32_t channels,
                            std::uint64_t hw, bool nchw, float p, std::uint64_t seed, std::uint64_t layer,
                            const unsigned long long* step, cudaStream_t s);
void launch_mul_mask(const void* dy, const float* mask, void* dx, ActType t, std::uint64_t count, cudaStream_t s);
void launch_relu_forward(const void* x, void* y, ActType t, std::uint64_t count, cudaStream_t s);
// dx = y > 0 ? dy : 0 (y: the ReLU's output)
void launch_relu_backward(const void* y, const void* dy, void* dx, ActType t, std::uint64_t count, cudaStream_t s);

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
std::uint64_t bn_partials(std::uint32_t channels);
bool bn_pool_fusable(ActType t, std::uint32_t c, std::uint64_t h, std::uint64_t w, std::uint32_t n);
void launch_bn_forward_train(const void* x, void* y, ActType t, std::uint32_t n, std::uint64_t hw, std::uint32_t c,
                             bool nchw, bool relu, const float* gamma, const float* beta, float* run_mean,
                             float* run_var, float* save_mean, float* save_invstd, double* partials, float momentum,
                             float eps, cudaStream_t s, std::uint32_t pool_w = 0);
void launch_bn_forward_eval(const void* x, void* y, ActType t, std::uint32_t n, std::uint64_t hw, std::uint32_t c,
                            bool nchw, bool relu, const float* gamma, const float* beta, const float* run_mean,
                            const float* run_var, float eps, double* partials, cudaStream_t s,
                            std::uint32_t pool_w = 0);
void launch_bn_backward(const void* x, const void* dy, bool relu, void* dx, ActType t, std::uint32_t n,
                        std::uint64_t hw, std::uint32_t c, bool nchw, const float* gamma, const float* beta,
                        const float* save_mean, const float* save_invstd, float* dgamma, float* dbeta, double* partials,
                        cudaStream_t s, std::uint32_t pool_w = 0);

// Layout changes of activations: out[n][c][hw] = in[n][hw][c] and the inverse.
void launch_nhwc_to_nchw(const void* in, void* out, ActType t, std::uint64_t n, std::uint32_t c, std::uint64_t hw,
                         cudaStream_t s);
void launch_nchw_to_nhwc(const void* in, void* out, ActType t, std::uint64_t n, std::uint32_t c, std::uint64_t hw,
                         cudaStream_t s);

// Compute copies of the weights (conv filters as KRSC, linear weights in bf16
// mode): copy[i] = params[map[i]] (0 where map[i] == ~0u: padding); and the
// way back for their gradients: grads[map[i]] = gcopy[i].
void launch_gather_weights(const float* params, const std::uint32_t* map, void* copy, ActType t, std::uint64_t count,
                           cudaStream_t s);
void launch_scatter_grads(const void* gcopy, ActType t, const std::uint32_t* map, float* grads, std::uint64_t count,
                          cudaStream_t s);

// Softmax cross-entropy over logits[n][k] (float math): accumulates the plain
// loss and the correct count into m, records the first non-finite step, and
// (when dlogits is not null) writes the gradient of the mean label-smoothed
// loss.
void launch_softmax_xent(const void* logits, ActType t, const std::int32_t* labels, std::uint32_t n, std::uint32_t k,
                         float smoothing, void* dlogits, DeviceMetrics* m, const unsigned long long* step,
                         cudaStream_t s);

// One optimiser step over the flat fp32 parameters; the learning rate is
// computed on the device from *step (so a captured graph stays valid), then
// launch_advance_step increments it. Where inv[i] != ~0u the updated parameter
// is also written to copy[inv[i]] (type copy_t): the compute copies stay fresh
// without another pass.
void launch_optimizer(const OptimizerConfig& o, const ScheduleConfig& sched, float* params, const float* grads,
                      float* slots, std::uint64_t count, const unsigned long long* step, const std::uint32_t* inv,
                      void* copy, ActType copy_t, cudaStream_t s);
void launch_advance_step(unsigned long long* step, cudaStream_t s);

// out[e] = sum over blocks b of partials[b * count + e], in block order (the
// second pass of the convolution weight gradients' fixed-order reductions).
void launch_sum_partials(const float* partials, unsigned blocks, std::uint64_t count, float* out, cudaStream_t s);

} // namespace dstk::train::cuda
