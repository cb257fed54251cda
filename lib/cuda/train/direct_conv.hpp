#pragma once
// Direct 3x3 convolution for layers with 1 to 4 input channels: a network's
// first convolution on images. cuDNN's implicit GEMM pads such a layer's
// reduction (27 products for RGB) to a tensor-core tile and runs it at a
// fraction of its speed; here each thread keeps one output channel's filter
// in registers, reads a block's input rows from shared memory and computes
// four neighbouring output pixels at a time, in fp32.
//
// Forward: y = conv(x, w), w the fp32 parameters in KCRS order. Weight
// gradient: per-block partial sums (a fixed grid striding over the tiles)
// added up in a fixed order by a second kernel, no atomics, so the result is
// the same on every run; written as fp32 straight into the KCRS gradient.
// No data gradient: a first layer needs none (the trainer falls back to
// cuDNN when one is asked for).
#include <cuda_runtime.h>

#include <cstdint>

#include "act_type.hpp"

namespace dstk::train::cuda {

struct DirectConvShape {
    std::uint32_t n = 0;       // batch
    std::uint32_t c = 0;       // input channels used (the filter's C)
    std::uint32_t cstride = 0; // NHWC: channels stored per input pixel (>= c, padding zero); NCHW: c
    std::uint32_t h = 0, w = 0, k = 0, oh = 0, ow = 0, stride = 1, pad = 0, kernel = 3;
    bool nchw = false;
    bool tf32 = false; // fp32 activations whose products may be taken in TF32 (the tf32 precision)
};

// Whether the direct kernels handle this shape: a 3x3 kernel, stride 1 or 2,
// 1 to 4 input channels, at most 256 output channels, padding below 3, input
// rows narrow enough for a shared-memory tile (2,048 pixels: 3 rows up to
// about 680 wide at stride 1).
bool direct_conv_supported(const DirectConvShape& s);
// Workspace bytes launch_direct_conv_wgrad needs for this shape (or smaller batches).
std::uint64_t direct_conv_workspace(const DirectConvShape& s);

// The backward of a batch norm right after this convolution, taken into its
// weight gradient (first_bn.hpp), where direct_conv_wgrad_takes_bn.
struct FirstBnIn;

bool direct_conv_wgrad_takes_bn(ActType t, const DirectConvShape& s);

// A batch norm (and its ReLU) applied to the forward's output before it is
// stored: y = max(0, (v - mean) * gamma * invstd + beta), its statistics known
// before the convolution (first_bn.hpp). Where direct_conv_wgrad_takes_bn.
struct BnApply {
    const float *gamma = nullptr, *beta = nullptr, *mean = nullptr, *invstd = nullptr;
    bool relu = false;
};

void launch_direct_conv_forward(const void* x, const float* w, void* y, ActType t, const DirectConvShape& s,
                                cudaStream_t stream, const BnApply* bn = nullptr);
// dw[k][c][r][s] (fp32) = sum over the batch and output pixels of dy * x.
// With bn, dy is the gradient of the batch norm's output (of its ReLU's) and
// dw, dgamma and dbeta are the ones first_bn.hpp derives from it.
void launch_direct_conv_wgrad(const void* x, const void* dy, ActType t, const DirectConvShape& s, void* workspace,
                              float* dw, cudaStream_t stream, const FirstBnIn* bn = nullptr);
// The end of a weight gradient with a batch norm taken in: per-block partials
// rows (dw's KCRS, then the K sums of dy; blocks rows), summed in a fixed
// order within first_bn.hpp's combination into dw and the batch norm's
// gradients (and their update, where bn.b has one). launch_direct_conv_wgrad's
// own end, and that of a data gradient above that took this weight gradient in
// (tc_conv.hpp, TcConvFirstWgrad).
void launch_first_wgrad_sums(const float* partials, unsigned blocks, ActType t, const DirectConvShape& s, float* dw,
                             const FirstBnIn& bn, cudaStream_t stream);

} // namespace dstk::train::cuda
