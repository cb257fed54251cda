#pragma once
// A 3x3, stride 1, padding 1 convolution (forward, or data gradient on
// turned filters) in bf16 or float with TF32 products on Hopper's warpgroup
// tensor-core instructions (wgmma, sm_90a), NHWC: an implicit GEMM whose rows
// are 128 output pixels and columns 128 output channels, the reduction 9
// taps x the input channels in steps of 128 bytes (64 bf16, 32 float).
//
// tc_conv (mma.sync) stops at 128 input channels and its warps wait on their
// own fragment loads; here one producer thread copies each tap's input box
// and the filters' slice into a ring of shared-memory stages by TMA (zeros
// outside the image) while two consumer warpgroups multiply from shared
// memory, each a tile of its own in turn (ping-pong: one's epilogue beside
// the other's products), in persistent blocks. The epilogue rounds to the
// data type, stores the tile through shared memory by TMA and, where asked,
// sums the next batch norm's statistics (tc_conv.hpp's TcConvStats; the
// per-block sums cover all of a block's tiles, each in a fixed order: the
// same result on every run). The trainer times it against tc_conv and cuDNN
// (own:wgmma_conv) and keeps the fastest.
#include <cuda_runtime.h>

#include "tc_conv.hpp"

namespace dstk::train::cuda {

// Whether this build and GPU run the kernel (code for sm_90a, a device of
// compute capability 9.0) and it takes shape s: input channels a multiple of
// 64 (bf16) or 32 (tf32), output channels a multiple of 128 up to 512 (a
// data gradient also exactly 64: tiles 64 wide, no statistics), and
// tiles of whole rows of one image (h*w a multiple of 128, w dividing 128)
// or of whole images (h*w dividing 128).
bool wgmma_conv_supported(const TcConvShape& s);
// y ([n][h][w][cout]) = conv(x ([n][h][w][cin]), w ([cout][3][3][cin])), all
// bf16 or (s.tf32) all float, fp32 sums. A data gradient (s.data_gradient:
// x is dy, y is dx) is the same product on the filters turned as
// launch_tc_conv's are (tc_conv.hpp): w is the forward filter, turned into
// scratch (tc_conv_scratch(s) bytes) first, or, where scratch is null, w is
// what launch_turn_filters made of it. With stats.partials, also each channel's sums of
// (v - pivot[c]) and (v - pivot[c])^2 over the output as stored, per block,
// into partials[(c * splits + block) * 2 + k]; returns splits (the blocks,
// at most stats.max_splits).
unsigned launch_wgmma_conv(const void* x, const void* w, void* y, const TcConvShape& s, void* scratch,
                           cudaStream_t stream, const TcConvStats& stats = {});

} // namespace dstk::train::cuda
