#pragma once
// Launchers for dstrain's own kernels (kernels.cu): input conversion, bias,
// residual and dropout element-wise work, the loss, and optimiser updates.
// Everything runs on the given stream and is safe to capture in a graph.
#include <cuda_runtime.h>

#include <cstdint>

#include "dstk/dtype.hpp"
#include "dstk/train/optimizer.hpp"

namespace dstk::train::cuda {

// Device counters the loss kernel accumulates into.
struct DeviceMetrics {
    double loss_sum;
    unsigned long long correct;
    unsigned long long first_nonfinite; // step, or ~0 when none
};

// x' = (x - mean[c]) / std[c] into float NCHW; labels copied into `labels_out`.
void launch_convert_input(const void* x, DType dtype, const std::int32_t* labels, std::uint32_t n,
                          std::uint32_t channels, std::uint64_t hw, const float* mean, const float* inv_std, float* out,
                          std::int32_t* labels_out, cudaStream_t s);

// y[n][c][hw] += bias[c]
void launch_add_bias(float* y, const float* bias, std::uint64_t n, std::uint32_t c, std::uint64_t hw, cudaStream_t s);
// db[c] = sum over n, hw of dy   (feature rows: hw = 1)
void launch_bias_grad(const float* dy, float* db, std::uint64_t n, std::uint32_t c, std::uint64_t hw, cudaStream_t s);
void launch_add(const float* a, const float* b, float* out, std::uint64_t count, cudaStream_t s);
void launch_copy(const float* a, float* out, std::uint64_t count, cudaStream_t s);
// Dropout with the same Philox mask as the cpu backend: keep where
// philox(seed, stream(layer, step), i)[0] >= p * 2^32, scaled by 1/(1-p).
void launch_dropout_forward(const float* x, float* y, float* mask, std::uint64_t count, float p, std::uint64_t seed,
                            std::uint64_t layer, const unsigned long long* step, cudaStream_t s);
void launch_mul(const float* a, const float* b, float* out, std::uint64_t count, cudaStream_t s);

// Batch normalisation over (n, hw) per channel of NCHW float tensors, in two
// passes each way (a reduction into `partials`, then an element-wise pass that
// finishes the per-channel coefficients itself): grid (channels, splits) so
// that small channel counts still fill the GPU. `partials` holds
// bn_partials(c) doubles. Running statistics use the unbiased variance.
std::uint64_t bn_partials(std::uint32_t channels);
void launch_bn_forward_train(const float* x, float* y, std::uint32_t n, std::uint32_t c, std::uint64_t hw,
                             const float* gamma, const float* beta, float* run_mean, float* run_var, float* save_mean,
                             float* save_invstd, double* partials, float momentum, float eps, cudaStream_t s);
void launch_bn_forward_eval(const float* x, float* y, std::uint32_t n, std::uint32_t c, std::uint64_t hw,
                            const float* gamma, const float* beta, const float* run_mean, const float* run_var,
                            float eps, cudaStream_t s);
void launch_bn_backward(const float* x, const float* dy, float* dx, std::uint32_t n, std::uint32_t c, std::uint64_t hw,
                        const float* gamma, const float* save_mean, const float* save_invstd, float* dgamma,
                        float* dbeta, double* partials, cudaStream_t s);

// Softmax cross-entropy over logits[n][k]: accumulates the plain loss and the
// correct count into m, records the first non-finite step, and (when dlogits is
// not null) writes the gradient of the mean label-smoothed loss.
void launch_softmax_xent(const float* logits, const std::int32_t* labels, std::uint32_t n, std::uint32_t k,
                         float smoothing, float* dlogits, DeviceMetrics* m, const unsigned long long* step,
                         cudaStream_t s);

// One optimiser step over the flat parameters; the learning rate is computed
// on the device from *step (so a captured graph stays valid), then
// launch_advance_step increments it.
void launch_optimizer(const OptimizerConfig& o, const ScheduleConfig& sched, float* params, const float* grads,
                      float* slots, std::uint64_t count, const unsigned long long* step, cudaStream_t s);
void launch_advance_step(unsigned long long* step, cudaStream_t s);

} // namespace dstk::train::cuda
