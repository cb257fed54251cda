#pragma once
// Launch helpers shared by the .cu files of dstrain's own kernels
// (elementwise, pooling, batchnorm, loss, optimizer_step, input_layout):
// grid sizes, the activation-type dispatch and the channel of an element.
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <algorithm>
#include <cstdint>
#include <type_traits>

#include "cuda_check.hpp"
#include "device_common.cuh"
#include "act_type.hpp"

namespace dstk::train::cuda {

constexpr int threads = 256;

inline unsigned blocks_for(std::uint64_t count, std::uint64_t per_thread = 1) {
    const std::uint64_t b = (count + threads * per_thread - 1) / (threads * per_thread);
    return static_cast<unsigned>(b < 1 ? 1 : (b > 65535u * 16 ? 65535u * 16 : b));
}

inline void check_launch() {
    CUDA_CHECK(cudaGetLastError());
}

// Calls f with a null T* for the activation type, T = float or bf16.
template <class F> void dispatch(ActType t, F&& f) {
    if (t == ActType::bf16)
        f(static_cast<bf16*>(nullptr));
    else
        f(static_cast<float*>(nullptr));
}
#define DSTK_T std::remove_pointer_t<decltype(tag)>

inline bool aligned16(const void* p) {
    return reinterpret_cast<std::uintptr_t>(p) % 16 == 0;
}

#define GRID_LOOP(i, count)                                                                                            \
    for (std::uint64_t i = blockIdx.x * std::uint64_t{blockDim.x} + threadIdx.x; i < (count);                          \
         i += std::uint64_t{gridDim.x} * blockDim.x)

// Block size for element-wise passes over [rows][c]: a multiple of c where one
// exists, so that each thread's channel never changes along its grid-stride
// loop (Fixed) and per-channel coefficients stay in registers.
inline unsigned channel_threads(std::uint32_t c) {
    if (c <= 256 && 256 % c == 0) return 256;
    if (c <= 1024 && c % 32 == 0) return c;
    return 256;
}
// Channel of element i of an [n][hw][c] (NHWC) or [n][c][hw] (NCHW) tensor.
struct Channels {
    std::uint32_t c;
    std::uint64_t hw;
    bool nchw, fixed, narrow; // fixed: NHWC with a block size that is a multiple of c; narrow: indices < 2^31
    Div32 dhw, dc;
    __device__ std::uint32_t operator()(std::uint64_t i, std::uint32_t c0) const {
        if (fixed) return c0;
        if (narrow) {
            const auto j = static_cast<std::uint32_t>(i);
            return dc.mod(nchw ? dhw.div(j) : j);
        }
        return static_cast<std::uint32_t>(nchw ? (i / hw) % c : i % c);
    }
};
inline Channels channels_of(std::uint32_t c, std::uint64_t hw, bool nchw, unsigned block, std::uint64_t count) {
    const bool narrow = count <= narrow_limit;
    return {c, hw, nchw, !nchw && block % c == 0, narrow, narrow ? Div32(hw) : Div32(), narrow ? Div32(c) : Div32()};
}
__device__ __forceinline__ std::uint32_t first_channel(std::uint32_t c) {
    return static_cast<std::uint32_t>((blockIdx.x * std::uint64_t{blockDim.x} + threadIdx.x) % c);
}

} // namespace dstk::train::cuda
