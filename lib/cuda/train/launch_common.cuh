#pragma once
// Launch helpers shared by the .cu files of dstrain's own kernels: grid
// sizes, the launch itself (launch_kernel, with programmatic dependent
// launch; plain_launch, without), the shared-memory carveout every launch
// asks for, the activation-type dispatch and the channel of an element.
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <type_traits>
#include <unordered_set>
#include <utility>

#include "dstk/env.hpp"
#include "cuda_check.hpp"
#include "device_common.cuh"
#include "act_type.hpp"

namespace dstk::train::cuda {

constexpr int threads = 256;

inline unsigned blocks_for(std::uint64_t count, std::uint64_t per_thread = 1) {
    const std::uint64_t b = (count + threads * per_thread - 1) / (threads * per_thread);
    return static_cast<unsigned>(b < 1 ? 1 : (b > 65535u * 16 ? 65535u * 16 : b));
}

// ---- programmatic dependent launch (PDL) ----
// A step is a chain of short kernels, each reading what the one before it
// wrote. launch_kernel() lets a kernel be scheduled while the kernel before it
// in its stream finishes (compute capability 9.0 and up), so the gap between
// the two leaves the critical path; in a captured graph the stream order
// becomes a programmatic edge. Every kernel launched by launch_kernel() calls
// await_predecessor() before its first access to global memory
// (scripts/check-pdl-waits.py checks it):
//  - the wait returns once every direct dependency (the stream predecessor,
//    and in a graph another stream's node joined through an event) has
//    completed with its writes visible: the kernel neither reads too early
//    nor overwrites what its predecessor still reads;
//  - it covers direct dependencies only, so a kernel that skipped it could
//    end before its own predecessor: with the wait first in every such kernel,
//    completion stays transitive, and whatever follows (ours, cuDNN's,
//    another stream through an event) sees the stream order it saw without
//    PDL. Nothing is computed differently: results are bit for bit those of
//    plain launches.
// Past the wait it lets its own successor be scheduled, whose blocks take the
// SMs this kernel's last wave leaves free, and wait in turn.
__device__ __forceinline__ void await_predecessor() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    cudaGridDependencySynchronize();
    cudaTriggerProgrammaticLaunchCompletion();
#endif
}

// Whether the kernel's code here uses compute capability 9.0: a device of 9.0
// or more (binaryVersion), and code compiled for compute_90 or later
// (ptxVersion): PTX of an older architecture, JIT-compiled for a newer GPU,
// has what __CUDA_ARCH__ >= 900 guards compiled out.
template <class K> bool compiled_for_sm90(K* kernel) {
    cudaFuncAttributes a{};
    CUDA_CHECK(cudaFuncGetAttributes(&a, kernel));
    return a.binaryVersion >= 90 && a.ptxVersion >= 90;
}
// Whether this kernel may be launched programmatically here: not where
// DSTK_PDL=0 (read at each launch: a graph keeps what held at its capture),
// and only where its code waits (compiled_for_sm90).
template <class K> bool programmatic_launch(K* kernel) {
    if (env_off("DSTK_PDL")) return false;
    return compiled_for_sm90(kernel);
}

// The shared-memory carveout each of dstrain's own kernels asks for
// (launch_kernel, plain_launch), as a percentage of the SM's unified L1 and
// shared memory: by default the most shared memory
// (cudaSharedmemCarveoutMaxShared). Left to the driver, a kernel with little
// shared memory runs with the SM split for a large L1, and an SM changes its
// split only once every block on it has ended: the convolutions before and
// after (tc_conv's, cuDNN's), which need the large shared memory, then wait
// for the SM to drain instead of taking the space the element-wise kernel's
// last blocks leave, and a programmatic launch's blocks cannot start beside
// their predecessor's. These kernels stream through memory once and gain
// nothing from a large L1. DSTK_SMEM_CARVEOUT=N (0 to 100) asks for N
// instead, -1 leaves it to the driver; read once, at the process's first
// launch.
inline int shared_carveout() {
    static const int c = [] {
        const long v = env_long("DSTK_SMEM_CARVEOUT", cudaSharedmemCarveoutMaxShared);
        return static_cast<int>(std::clamp(v, -1L, 100L));
    }();
    return c;
}
template <class K> void set_shared_carveout(K* kernel) {
    static std::mutex m;
    static std::unordered_set<const void*> done;
    const std::lock_guard<std::mutex> lock(m);
    if (shared_carveout() < 0 || !done.insert(reinterpret_cast<const void*>(kernel)).second) return;
    CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributePreferredSharedMemoryCarveout, shared_carveout()));
}

// kernel<<<grid, block, shared, s>>>(args...) with the PDL attribute where
// programmatic_launch() allows it; the kernel calls await_predecessor() first.
template <class... Params, class... Args>
void launch_kernel(void (*kernel)(Params...), dim3 grid, dim3 block, std::size_t shared, cudaStream_t s,
                   Args&&... args) {
    set_shared_carveout(kernel);
    cudaLaunchAttribute attr{};
    attr.id = cudaLaunchAttributeProgrammaticStreamSerialization;
    attr.val.programmaticStreamSerializationAllowed = 1;
    cudaLaunchConfig_t config{};
    config.gridDim = grid;
    config.blockDim = block;
    config.dynamicSmemBytes = shared;
    config.stream = s;
    config.attrs = &attr;
    config.numAttrs = programmatic_launch(kernel) ? 1 : 0;
    CUDA_CHECK(cudaLaunchKernelEx(&config, kernel, std::forward<Args>(args)...));
}

// kernel<<<grid, block, shared, s>>>(args...) with the same shared-memory
// carveout, for the kernels launched without the PDL attribute (their
// files' kernels do not wait: scheduled early, an optimiser update's many
// blocks sat on the SMs waiting and held back the other streams).
template <class... Params, class... Args>
void plain_launch(void (*kernel)(Params...), dim3 grid, dim3 block, std::size_t shared, cudaStream_t s,
                  Args&&... args) {
    set_shared_carveout(kernel);
    kernel<<<grid, block, shared, s>>>(std::forward<Args>(args)...);
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
