#pragma once
// Forward and data gradient of a 3x3, stride 1, padding 1 convolution on
// tensor cores, NHWC: an implicit GEMM (rows the output pixels, columns the
// output channels, the reduction 9 taps x the input channels) with mma.sync
// and fp32 sums; bf16 data (m16n8k16) or float data with tf32 products
// (m16n8k8, the same kernel on 32 bytes of channels per step; the operands
// rounded to tf32 to nearest in shared memory).
//
// At a training batch of a few hundred images the layers after the first are
// small matrix products (32 to 128 channels, 8x8 to 32x32 pixels) on which
// cuDNN's engines reach a fraction of the tensor cores' rate. Here a block
// copies the input rows under its tile of output pixels (all channels; whole
// images per tile where they are small) and its 32 output channels' filters
// into shared memory (cp.async or TMA; one buffer per group of four warps,
// the other groups on the SM multiply while it fills; in float a block of
// up to three groups sharing one copy of the filters where that puts more
// warps on an SM), each warp multiplies its four (or, where the
// tile would not fit, two) 16-pixel row tiles by the four 8-channel column
// tiles through ldmatrix, the next step's fragments loaded during this
// step's products, and writes whole output pixels through staging rows. The data gradient is
// the same product on dy with the filters turned 180 degrees and their input
// and output channels swapped (a small kernel, launch_turn_filters, writes
// them so: into scratch at each call, or once ahead of the backward pass).
// Each output is summed by one thread in a fixed order: the same result on
// every run. The trainer times it against cuDNN's engines (a candidate of
// --kernels) and keeps the faster.
#include <cuda_runtime.h>

#include <cstdint>

#include "direct_conv.hpp"

namespace dstk::train::cuda {

struct TcConvShape {
    std::uint32_t n = 0, h = 0, w = 0; // batch and image size (input = output: stride 1, padding 1)
    std::uint32_t cin = 0, cout = 0;   // channels read and written by this call
    bool data_gradient = false;        // dx from dy: w is the forward's filter [cin][3][3][cout]
    bool tf32 = false;                 // float data and filters, tf32 products (else bf16 throughout)
    bool one_group = false;            // one group of warps per block even where groups would fit (below)
};

// Whether the kernel handles this shape: cin a multiple of 16 up to 128 (64
// in float), cout a multiple of 32, width up to 128, and the tiles fit in
// shared memory.
bool tc_conv_supported(const TcConvShape& s);
// The groups of four warps per block (sharing one copy of the filters) that
// launch_tc_conv runs s in: more than one only in float, on compute 9.0 and
// up, where they put more warps on an SM; 1 with s.one_group. Where the
// tiles are few for the SMs the groups may lose to one group per block (a
// last wave of fewer blocks): the kernel choice times both.
unsigned tc_conv_groups(const TcConvShape& s);
// Bytes of device memory launch_tc_conv needs as scratch (the data
// gradient's turned filters; 0 for the forward).
std::uint64_t tc_conv_scratch(const TcConvShape& s);
// The data gradient's filters (s.data_gradient) from the forward's w
// ([cin][3][3][cout]) into out (tc_conv_scratch(s) bytes), turned as the
// data gradient reads them.
void launch_turn_filters(const void* w, void* out, const TcConvShape& s, cudaStream_t stream);
// Where a forward call also writes batch-norm statistics of its output
// (training, a batch norm right after): per block, each channel's sums of
// (v - pivot[c]) and (v - pivot[c])^2 over its pixels, v as stored,
// into partials[(c * splits + block) * 2 + k] (batchnorm.hpp's layout; splits
// the returned block count, at most max_splits). Each sum in a fixed order.
struct TcConvStats {
    double* partials = nullptr; // none: no statistics
    const float* pivot = nullptr;
    unsigned max_splits = 0;
};
// The first convolution's weight gradient with its batch norm taken in
// (first_bn.hpp), summed in the epilogue of the data gradient of the
// convolution above it (bf16 or tf32): that data gradient is dy of the batch
// norm's output (of its ReLU's), masked where relu_out is not positive and
// rounded as direct_conv's weight gradient rounds the stored gradient (bf16;
// in tf32 the stored float to TF32), and is multiplied with the first
// convolution's input under each tap as direct_conv's weight gradient does,
// into per-block partials rows (launch_first_wgrad_sums sums them; the call
// returns the row count). The data gradient itself is not stored: nothing
// else reads it. Saves that weight gradient's pass over dy and the ReLU's
// output, and the data gradient's store.
struct TcConvFirstWgrad {
    const void* x0 = nullptr;       // the first convolution's input
    const void* relu_out = nullptr; // the ReLU's output (the mask), or null: no ReLU
    float* partials = nullptr;      // tc_conv_first_wgrad_workspace(first) bytes
    DirectConvShape first;
};
// Whether a data gradient of shape s can take that weight gradient: bf16 or
// tf32 (as the first convolution's), 32 output channels (the first convolution's, 3x3 stride 1 at s's size, on
// tensor cores: direct_conv_wgrad_takes_bn), tiles of whole rows of one image.
bool tc_conv_takes_first_wgrad(const TcConvShape& s, const DirectConvShape& first);
std::uint64_t tc_conv_first_wgrad_workspace(const DirectConvShape& first);
// y ([n][h][w][cout]) = conv(x ([n][h][w][cin]), w), all bf16 or (tf32) all float. Forward: w
// is [cout][3][3][cin] (cuDNN's NHWC filter, KRSC); data gradient: w is the
// forward filter [cin][3][3][cout], turned into scratch first, or, where
// scratch is null, w is what launch_turn_filters made of it; the call
// computes dx from dy. Returns the blocks per 32 output channels (the
// statistics' splits). With first (a data gradient where
// tc_conv_takes_first_wgrad, filters turned ahead), y is not written and the
// return is the partials rows written.
unsigned launch_tc_conv(const void* x, const void* w, void* y, const TcConvShape& s, void* scratch, cudaStream_t stream,
                        const TcConvStats& stats = {}, const TcConvFirstWgrad* first = nullptr);

} // namespace dstk::train::cuda
