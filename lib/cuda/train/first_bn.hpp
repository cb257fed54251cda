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
// weight-gradient pass, which also sums the moments from the input patches
// it holds anyway (direct_conv.cu: M = P^T P over 40 columns, tap * 4 +
// channel, the tenth tap's first channel a one, so that M's column 36 holds
// s; only its 16-row blocks on and above the diagonal).
#include <cuda_runtime.h>

#include <cstdint>

#include "act_type.hpp"
#include "direct_conv.hpp"

namespace dstk::train::cuda {

// Floats of the moments the weight gradient sums after A and S (40 x 40).
std::uint64_t first_bn_moments(const DirectConvShape& s);

// What the combination reads besides the weight gradient's sums.
struct FirstBnBackward {
    const float* w = nullptr;      // the convolution's fp32 KCRS weights (rounded to bf16 as its forward takes them)
    const float* gamma = nullptr;  // the batch norm's scale
    const float* mean = nullptr;   // its saved batch mean
    const float* invstd = nullptr; // and 1 / std
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

// sums: A (k x K, KCRS), S (k), then the moments. Writes dw (KCRS, fp32), dgamma and dbeta.
void launch_first_bn_backward(const float* sums, ActType t, const DirectConvShape& s, const FirstBnBackward& b,
                              float* dw, cudaStream_t stream);

} // namespace dstk::train::cuda
