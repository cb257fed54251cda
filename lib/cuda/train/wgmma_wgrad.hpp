#pragma once
// Weight gradient of a 3x3, stride 1, padding 1 convolution in TF32 on
// Hopper's warpgroup tensor-core instructions (wgmma, sm_90a), NHWC float:
// dW[k][r][s][c] = sum over pixels p of dy[p][k] * x[p + (r-1, s-1)][c].
//
// The reduction runs over pixels, which NHWC keeps apart (a pixel's channels
// are contiguous), and TF32 wgmma reads a shared-memory operand only with
// the reduction contiguous. So the input comes from registers (any layout:
// a GEMM row is an input channel, its reduction index a pixel) and dy is
// transposed on its way into shared memory by a producer warpgroup, while
// TMA brings the input rows with their halo (zeros outside the image).
// Each of three consumer warpgroups owns a filter row and its three taps:
// a k8 step is one column of 8 image rows, and the input column a step
// loads serves the three taps of three consecutive steps (a window in
// registers). A block's result is 64 input x 64 output channels x 9 taps;
// blocks split the pixels among them (a fixed split, fixed order), and
// launch_sum_partials adds their partial sums in block order: the same
// result on every run. tc_wgrad.cu (mma.sync) is the same product on
// Ampere's instructions; the trainer times both (own:wgmma_wgrad,
// own:tc_wgrad) against cuDNN and keeps the fastest.
#include <cuda_runtime.h>

#include <cstdint>

#include "optimizer_step.hpp"
#include "tc_wgrad.hpp"

namespace dstk::train::cuda {

// Whether this build and GPU run the kernel (sm90a_runs) and it takes shape
// s: c and k multiples of 64, h a multiple of 8, w 8 or a multiple of 16 up to 256.
bool wgmma_wgrad_supported(const TcWgradShape& s);
// Workspace bytes launch_wgmma_wgrad needs for this shape (or smaller batches).
std::uint64_t wgmma_wgrad_workspace(const TcWgradShape& s);
// dw ([k][3][3][c], float, fp32 sums) from x ([n][h][w][c]) and dy
// ([n][h][w][k]), both float (TF32 products, operands rounded to nearest);
// map and update as launch_tc_wgrad's.
void launch_wgmma_wgrad(const float* x, const float* dy, const TcWgradShape& s, void* workspace, void* dw,
                        cudaStream_t stream, const std::uint32_t* map = nullptr, const ParamUpdate* update = nullptr);

} // namespace dstk::train::cuda
