#pragma once
// The batch norm right after a network's first convolution, its statistics
// and its backward taken from moments of the convolution's input (first_bn.cu).
//
// The first convolution's output is y[p][k] = w_k . x_p, x_p the patch of
// K = 9 c input values under output pixel p. The batch norm's backward needs,
// per channel k, S = sum_p g[p][k] and T = sum_p g[p][k] (y[p][k] - mean_k),
// g the gradient of its output (masked by the ReLU's). Both come out of the
// convolution's weight gradient of g itself, A_k = sum_p g[p][k] x_p:
// T = w_k . A_k - mean_k S, and S from a column of ones beside the patches.
// The weight gradient of the normalised gradient then follows, being linear
// in it, from A, S and two moments of the input, s = sum_p x_p and
// G = sum_p x_p x_p^T:
//   dW_k = gamma_k is_k (A_k - S/N s - is_k^2 T/N (G w_k - mean_k s)),
// dgamma_k = is_k T, dbeta_k = S (is_k the saved 1 / std, N the pixel count).
// So the batch norm's own reduction over its input and output gradient never
// runs: the step's tail after the second convolution's data gradient is one
// weight-gradient pass and this combination. s and G are the moments the
// forward took (below).
#include <cuda_runtime.h>

#include <cstdint>

#include "act_type.hpp"
#include "direct_conv.hpp"
#include "dstk/dtype.hpp"
#include "optimizer_step.hpp"

namespace dstk::train::cuda {

// The forward: the batch statistics of the convolution's output from the
// input's moments as well, mean_k = w_k . s / N and var_k = w_k^T G w_k / N -
// mean_k^2 (the weights rounded as the forward takes them), before the
// convolution, whose epilogue then applies the batch norm and its ReLU
// (direct_conv.hpp, BnApply): neither the batch norm's reduction nor its
// element-wise pass over the convolution's output runs, and that output is
// never stored. The moments: M = P^T P on tensor cores over KP columns (the K
// patch values, a one, zeros; KP 32 or 48), per-block partials summed in a
// fixed order (sum_partials): the same result on every run. They depend on
// the batch alone, so they are taken apart, as the batch is converted and
// while the step before runs (CudaTrainer::convert), and kept for the
// backward of the step that reads the batch.
struct FirstBnForward {
    float *run_mean = nullptr, *run_var = nullptr;      // updated with the unbiased variance
    float *save_mean = nullptr, *save_invstd = nullptr; // the batch's, for the epilogue and the backward
    float momentum = 0.1f, eps = 1e-5f;
    const float* moments = nullptr; // launch_first_bn_moments' of the same batch
};

// Floats of the moments (KP x KP: row j the products of patch value j with
// each, then its sum, j = c * 9 + tap).
std::uint64_t first_bn_moments(const DirectConvShape& s);
// Workspace bytes launch_first_bn_moments needs.
std::uint64_t first_bn_moments_workspace(const DirectConvShape& s);
// x: the convolution's input as direct_conv reads it.
void launch_first_bn_moments(const void* x, ActType t, const DirectConvShape& s, float* moments, void* workspace,
                             cudaStream_t stream);

// The batch as stored, before launch_convert_input (input_layout.hpp): CHW
// samples of dtype, normalised with mean and inv_std per channel.
struct StoredBatch {
    const void* x = nullptr;
    const std::uint64_t* rows = nullptr; // sample i is row rows[i] of x (BatchField::rows); null: row i
    DType dtype = DType::u8;
    const float *mean = nullptr, *inv_std = nullptr;
};
// Whether launch_first_bn_moments_converting takes this shape: u8 or f32
// samples, NHWC, a 3x3 convolution of stride 1 and padding 1 (its output
// pixels are its input's), images at most 1,024 wide, bf16 pixels in whole
// fours of channels.
bool first_bn_converts(ActType t, DType dtype, const DirectConvShape& s);
// launch_first_bn_moments of the stored batch, converting it on the way: out
// receives what launch_convert_input writes (NHWC, s.cstride apart), except
// channels from the fourth on, pads the caller keeps at zero. The conversion
// pass and its second read of the converted input do not run.
void launch_first_bn_moments_converting(const StoredBatch& b, void* out, ActType t, const DirectConvShape& s,
                                        float* moments, void* workspace, cudaStream_t stream);
// The statistics from f.moments; w: the convolution's fp32 KCRS weights.
void launch_first_bn_forward(ActType t, const DirectConvShape& s, const float* w, const FirstBnForward& f,
                             cudaStream_t stream);

// What the combination reads besides the weight gradient's sums.
struct FirstBnBackward {
    const float* w = nullptr;      // the convolution's fp32 KCRS weights (rounded to bf16 as its forward takes them)
    const float* gamma = nullptr;  // the batch norm's scale
    const float* mean = nullptr;   // its saved batch mean
    const float* invstd = nullptr; // and 1 / std
    float* dgamma = nullptr;
    float* dbeta = nullptr;
    const float* moments = nullptr; // FirstBnForward's, of the same step
    // Where given (update.params), the convolution's weights and the batch
    // norm's scale and shift are updated as their gradients are stored:
    // parameters w_at + k * K + j of the flat vector, and gamma_at + k and
    // gamma_at + k + (output channels).
    ParamUpdate update;
    std::uint64_t w_at = 0, gamma_at = 0;
};

// The weight gradient's part (direct_conv.hpp): dy masked where relu_out (the
// ReLU's output after the batch norm, same layout as dy) is not positive, a
// column of ones beside the patches for S, then the combination.
struct FirstBnIn {
    const void* relu_out = nullptr; // null: no ReLU follows
    FirstBnBackward b;
};

// partials: the weight gradient's per-block rows of `count` floats, A (k x
// K, KCRS) then S (k), summed here in partial_sums.cuh's order (as
// launch_sum_partials would). Writes dw (KCRS, fp32), dgamma and dbeta.
void launch_first_bn_backward(const float* partials, unsigned rows, std::uint64_t count, ActType t,
                              const DirectConvShape& s, const FirstBnBackward& b, float* dw, cudaStream_t stream);

} // namespace dstk::train::cuda
