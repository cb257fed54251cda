#pragma once
// Weight gradient of a 3x3, stride 1, padding 1 convolution on tensor cores
// in TF32 (float activations) or bf16, NHWC, with channel counts that are
// multiples of 32: dW[k][r][s][c] = sum over pixels p of dy[p][k] * x[p +
// (r-1, s-1)][c].
//
// cuDNN's TF32 weight-gradient engines are slow on such layers (a small
// result summed over very many pixels) whatever the engine. Here each block of six
// warps (two per filter row) copies a tile of 128 output pixels of dy and the
// matching input rows into shared memory (cp.async, double-buffered: the next
// tile arrives while this one is multiplied), and each warp accumulates its
// filter row's three 32 x 32 blocks with mma.sync (m16n8k4 TF32, by
// truncation: the tensor cores read the top 19 bits of each fp32 value; or
// m16n8k16 bf16, m16n8k8 on images 8 wide), reusing each input pixel it
// loads for all three taps; a fixed grid strides over the tiles, and the
// blocks' partial sums are added in a fixed order by a second kernel: no
// atomics, the same result on every run.
#include <cuda_runtime.h>

#include <cstdint>

#include "act_type.hpp"
#include "optimizer_step.hpp"

namespace dstk::train::cuda {

struct TcWgradShape {
    std::uint32_t n = 0, c = 0, k = 0, h = 0, w = 0; // input c x h x w, output k x h x w
};

// Whether the kernel handles this shape: c and k multiples of 32, w a power of
// two from 8 to 64.
bool tc_wgrad_supported(const TcWgradShape& s);
// Workspace bytes launch_tc_wgrad needs for this shape (or smaller batches).
std::uint64_t tc_wgrad_workspace(const TcWgradShape& s);
// dw ([k][3][3][c], in the activation type t: float or bf16, fp32 sums) from
// x ([n][h][w][c]) and dy ([n][h][w][k]); with map, as float at
// dw[map[e]] for element e of that order, each then updated by update where
// one is given (launch_sum_partials).
void launch_tc_wgrad(const void* x, const void* dy, ActType t, const TcWgradShape& s, void* workspace, void* dw,
                     cudaStream_t stream, const std::uint32_t* map = nullptr, const ParamUpdate* update = nullptr);

} // namespace dstk::train::cuda
