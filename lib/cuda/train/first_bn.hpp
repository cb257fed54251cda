#pragma once
// The batch norm right after a network's first convolution, its backward
// taken from moments of the convolution's input (first_bn.cu).
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
// weight-gradient pass. The moments depend on the input alone and are taken
// beside the forward pass.
//
// Moments: M = P^T P, P the patch rows with a one after the K values (M's
// column K: the sums s; its first K x K: G), KP x KP floats (KP: K + 1 rounded
// up to 32 or 48); per-block partials summed in a fixed order (sum_partials):
// the same result on every run. Indices j = c * 9 + tap, as in the KCRS weights.
#include <cuda_runtime.h>

#include <cstdint>

#include "act_type.hpp"
#include "direct_conv.hpp"

namespace dstk::train::cuda {

// Floats of the moments of shape s (KP x KP).
std::uint64_t first_bn_moments(const DirectConvShape& s);
// Workspace bytes launch_first_bn_moments needs.
std::uint64_t first_bn_moments_workspace(const DirectConvShape& s);
// x: the convolution's input as direct_conv reads it (NHWC, s.cstride
// channels stored, s.c used; bf16, or fp32 in the tf32 precision).
void launch_first_bn_moments(const void* x, ActType t, const DirectConvShape& s, void* workspace, float* moments,
                             cudaStream_t stream);

// What the combination reads besides the weight gradient's sums.
struct FirstBnBackward {
    const float* w = nullptr;      // the convolution's fp32 KCRS weights (rounded to bf16 as its forward takes them)
    const float* gamma = nullptr;  // the batch norm's scale
    const float* mean = nullptr;   // its saved batch mean
    const float* invstd = nullptr; // and 1 / std
    const float* moments = nullptr;
    float* dgamma = nullptr;
    float* dbeta = nullptr;
};

// The weight gradient's part (direct_conv.hpp): dy masked where relu_out (the
// ReLU's output after the batch norm, same layout as dy) is not positive, a
// column of ones beside the patches for S, then the combination.
struct FirstBnIn {
    const void* relu_out = nullptr; // null: no ReLU follows
    FirstBnBackward b;
};

// sums: A (k x K, KCRS) then S (k). Writes dw (KCRS, fp32), dgamma and dbeta.
void launch_first_bn_backward(const float* sums, ActType t, const DirectConvShape& s, const FirstBnBackward& b,
                              float* dw, cudaStream_t stream);

} // namespace dstk::train::cuda
