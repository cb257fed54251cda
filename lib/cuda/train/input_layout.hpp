#pragma once
// Launchers of the input conversion, layout changes and weight copies
// (input_layout.cu). Activations and their gradients are NHWC (channels last) or, where `nchw`
// says so, NCHW; stored as float or bf16 (ActType); arithmetic is float.
// Everything runs on the given stream and is safe to capture in a graph.
#include <cuda_runtime.h>

#include <cstdint>

#include "act_type.hpp"
#include "dstk/dtype.hpp"

namespace dstk::train::cuda {

// Stored CHW samples of dtype: sample i is row rows[i] of x (BatchField::rows),
// or row i where rows is null.
struct StoredSamples {
    const void* x = nullptr;
    const std::uint64_t* rows = nullptr;
    DType dtype = DType::u8;
};

// x' = (x - mean[c]) / std[c] from stored samples into `out` of type t,
// NHWC with out_channels >= channels (the extra channels zero), or NCHW with
// out_channels == channels; labels (rows as x's) copied into `labels_out`
// (unless null).
void launch_convert_input(const StoredSamples& x, const std::int32_t* labels, std::uint32_t n, std::uint32_t channels,
                          std::uint64_t hw, const float* mean, const float* inv_std, void* out, ActType t, bool nchw,
                          std::uint32_t out_channels, std::int32_t* labels_out, cudaStream_t s);

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

// The same scatter for one convolution's filters whose copy holds every
// input channel (no padding): gcopy [filters][rs][c] (KRSC) into grads
// [filters][c][rs] (KCRS, from the layer's first parameter), a filter at a
// time through shared memory, where it fits (filter_scatter_fits: rs odd,
// c * rs floats within filter_scatter_max_shared bytes).
constexpr std::uint64_t filter_scatter_max_shared = 48 * 1024;
bool filter_scatter_fits(std::uint32_t c, std::uint32_t rs);
void launch_scatter_filter_grads(const void* gcopy, ActType t, float* grads, std::uint32_t filters, std::uint32_t c,
                                 std::uint32_t rs, cudaStream_t s);

} // namespace dstk::train::cuda
