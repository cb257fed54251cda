#pragma once
// Helpers shared by the training kernels (launch_common.cuh, direct_conv.cu,
// tc_wgrad.cu): loads and stores of the activation types as float, 16-byte
// vector accesses, division by a divisor fixed at launch, the tensor-core
// products, and the current GPU's SM count (for grids sized to one wave).
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <algorithm>
#include <cstdint>
#include <type_traits>

#include "cuda_check.hpp"
#include "dstk/widen.hpp"

namespace dstk::train::cuda {

using bf16 = __nv_bfloat16;

__device__ __forceinline__ float ld(const float* p, std::uint64_t i) {
    return p[i];
}
__device__ __forceinline__ float ld(const bf16* p, std::uint64_t i) {
    return __bfloat162float(p[i]);
}
__device__ __forceinline__ float ld(const std::uint8_t* p, std::uint64_t i) {
    return p[i];
}
__device__ __forceinline__ float ld(const std::int8_t* p, std::uint64_t i) {
    return static_cast<float>(dstk::widen_as<dstk::DType::i8>(p, i)); // the core's widening (dstk/widen.hpp)
}
__device__ __forceinline__ float ld(const __half* p, std::uint64_t i) {
    return __half2float(p[i]);
}
// Sample s's row in a stored batch read through its rows
// (BatchField::rows; null: row s).
__device__ __forceinline__ std::uint64_t row_of(const std::uint64_t* rows, std::uint64_t s) {
    return rows ? rows[s] : s;
}
// Stored input value i of channel c normalised for the network, in this one
// order of operations, so that every kernel converting the input
// (input_layout.cu's pass, first_bn.cu's moments) gives the same bits.
template <class In>
__device__ __forceinline__ float normalised(const In* x, std::uint64_t i, std::uint32_t c, const float* mean,
                                            const float* inv_std) {
    return (ld(x, i) - mean[c]) * inv_std[c];
}
__device__ __forceinline__ void st(float* p, std::uint64_t i, float v) {
    p[i] = v;
}
__device__ __forceinline__ void st(bf16* p, std::uint64_t i, float v) {
    p[i] = __float2bfloat16(v);
}

// Division by a divisor fixed at launch, for dividends below 2^31: a multiply
// and a shift instead of the long integer division (Granlund-Montgomery, as in
// PyTorch's IntDivider). Kernels use it where every index of the tensor is
// below 2^31 ("narrow") and plain 64-bit division otherwise.
struct Div32 {
    std::uint32_t d = 1, m = 1, s = 0;
    Div32() = default;
    explicit Div32(std::uint64_t divisor) : d(static_cast<std::uint32_t>(divisor)) {
        if (divisor == 0 || divisor > 0x7fffffffu) return; // unused: the kernel runs wide
        while ((std::uint64_t{1} << s) < d) ++s;
        m = static_cast<std::uint32_t>(((std::uint64_t{1} << 32) * ((std::uint64_t{1} << s) - d)) / d + 1);
    }
    __device__ __forceinline__ std::uint32_t div(std::uint32_t n) const { return (__umulhi(n, m) + n) >> s; }
    __device__ __forceinline__ std::uint32_t mod(std::uint32_t n) const { return n - div(n) * d; }
};
constexpr std::uint64_t narrow_limit = 0x7fffffffu;

// 16-byte loads and stores of V = 16 / sizeof(T) consecutive elements (float:
// 4, bf16: 8), converted to and from float; V == 1 is a plain element.
template <class T> constexpr int vec_of = 16 / static_cast<int>(sizeof(T));
template <int V, class T> __device__ __forceinline__ void ldv(const T* p, std::uint64_t i, float (&v)[V]) {
    if constexpr (V == 1) {
        v[0] = ld(p, i);
    } else {
        static_assert(V * sizeof(T) == 16);
        const uint4 q = *reinterpret_cast<const uint4*>(p + i);
        const T* e = reinterpret_cast<const T*>(&q);
#pragma unroll
        for (int k = 0; k < V; ++k) v[k] = ld(e, k);
    }
}
template <int V, class T> __device__ __forceinline__ void stv(T* p, std::uint64_t i, const float (&v)[V]) {
    if constexpr (V == 1) {
        st(p, i, v[0]);
    } else {
        static_assert(V * sizeof(T) == 16);
        uint4 q;
        T* e = reinterpret_cast<T*>(&q);
#pragma unroll
        for (int k = 0; k < V; ++k) st(e, k, v[k]);
        *reinterpret_cast<uint4*>(p + i) = q;
    }
}

// Warp-level tensor-core products (mma.sync, compute capability 8.0 and up),
// fragments as PTX lays them out: gid = lane / 4, t4 = lane % 4.
// D += A B, m16n8k4 in TF32: a0, a1 rows gid and gid + 8 of k slot t4; b0 row t4 of column gid.
__device__ __forceinline__ void mma_tf32(float (&d)[4], std::uint32_t a0, std::uint32_t a1, std::uint32_t b0) {
    asm("mma.sync.aligned.m16n8k4.row.col.f32.tf32.tf32.f32 {%0,%1,%2,%3}, {%4,%5}, {%6}, {%0,%1,%2,%3};"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a0), "r"(a1), "r"(b0));
}

// D += A B, m16n8k8 in bf16: a0, a1 rows gid and gid + 8 of k slots 2 t4, 2 t4 + 1 (low half first); b0 rows
// 2 t4, 2 t4 + 1 of column gid.
__device__ __forceinline__ void mma_bf16(float (&d)[4], std::uint32_t a0, std::uint32_t a1, std::uint32_t b0) {
    asm("mma.sync.aligned.m16n8k8.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5}, {%6}, {%0,%1,%2,%3};"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a0), "r"(a1), "r"(b0));
}

// D += A B, m16n8k16 in bf16: a0..a3 rows gid, gid + 8 of k slots 2 t4 (+1), then the same at k + 8; b0, b1
// rows 2 t4 (+1) and 2 t4 + 8 (+1) of column gid.
__device__ __forceinline__ void mma_bf16_k16(float (&d)[4], const std::uint32_t (&a)[4], std::uint32_t b0,
                                             std::uint32_t b1) {
    asm("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

// D += A B, m16n8k8 in TF32: a0..a3 rows gid, gid + 8 of k slot t4, then the same at k + 4; b0, b1 rows t4 and
// t4 + 4 of column gid.
__device__ __forceinline__ void mma_tf32_k8(float (&d)[4], const std::uint32_t (&a)[4], std::uint32_t b0,
                                            std::uint32_t b1) {
    asm("mma.sync.aligned.m16n8k8.row.col.f32.tf32.tf32.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

// Four 8x8 b16 matrices from shared memory: lane l gives the address of row l % 8 of matrix l / 8 (16 bytes);
// v[q] is matrix q's fragment (row gid, elements 2 t4 and 2 t4 + 1; with .trans, column gid, rows 2 t4 and
// 2 t4 + 1).
__device__ __forceinline__ void ldmatrix_x4(std::uint32_t (&v)[4], const void* smem) {
    const auto a = static_cast<unsigned>(__cvta_generic_to_shared(smem));
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];"
                 : "=r"(v[0]), "=r"(v[1]), "=r"(v[2]), "=r"(v[3])
                 : "r"(a));
}
// The same from a shared-memory address (a kernel's byte offsets added to its
// buffer's address once converted, not to generic pointers at each load).
__device__ __forceinline__ unsigned smem_address(const void* p) {
    return static_cast<unsigned>(__cvta_generic_to_shared(p));
}
__device__ __forceinline__ void ldmatrix_x4(std::uint32_t (&v)[4], unsigned address) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];"
                 : "=r"(v[0]), "=r"(v[1]), "=r"(v[2]), "=r"(v[3])
                 : "r"(address));
}
__device__ __forceinline__ void ldmatrix_x4_trans(std::uint32_t (&v)[4], const void* smem) {
    const auto a = static_cast<unsigned>(__cvta_generic_to_shared(smem));
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];"
                 : "=r"(v[0]), "=r"(v[1]), "=r"(v[2]), "=r"(v[3])
                 : "r"(a));
}

// A hint that the 128-byte line at p is read soon: fetched into L2, no
// register held, nothing waited for.
__device__ __forceinline__ void prefetch_l2(const void* p) {
    asm volatile("prefetch.global.L2 [%0];" ::"l"(p));
}

// 16-byte copies from global to shared memory that do not hold a register
// (compute capability 8.0 and up): a zero-fill where !valid (src unread), a
// group per commit, and a wait until at most N groups are still in flight.
__device__ __forceinline__ void cp_async16(void* dst, const void* src, bool valid) {
    const auto d = static_cast<unsigned>(__cvta_generic_to_shared(dst));
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;" ::"r"(d), "l"(src), "r"(valid ? 16 : 0));
}
// 8 bytes (through L1: cp.async's cg form takes 16 only); zero where !valid.
__device__ __forceinline__ void cp_async8(void* dst, const void* src, bool valid) {
    const auto d = static_cast<unsigned>(__cvta_generic_to_shared(dst));
    asm volatile("cp.async.ca.shared.global [%0], [%1], 8, %2;" ::"r"(d), "l"(src), "r"(valid ? 8 : 0));
}
// 4 bytes (a float; through L1); zero where !valid.
__device__ __forceinline__ void cp_async4(void* dst, const void* src, bool valid) {
    const auto d = static_cast<unsigned>(__cvta_generic_to_shared(dst));
    asm volatile("cp.async.ca.shared.global [%0], [%1], 4, %2;" ::"r"(d), "l"(src), "r"(valid ? 4 : 0));
}
__device__ __forceinline__ void cp_async_commit() {
    asm volatile("cp.async.commit_group;");
}
template <int N> __device__ __forceinline__ void cp_async_wait() {
    asm volatile("cp.async.wait_group %0;" ::"n"(N));
}

// A value as an activation of type T stores it.
template <class T> __device__ __forceinline__ float stored(float v) {
    if constexpr (std::is_same_v<T, float>)
        return v;
    else
        return __bfloat162float(__float2bfloat16(v));
}

// The block's sums of its Warps warps' values v[V] (each lane its own), in a
// fixed tree: the upper half of the warps store theirs, the lower half add
// them, and so on down to warp 0, which ends with the sums in v (the same
// order on every run). slots: Warps / 2 x V x 32 floats of shared memory,
// lane-major (conflict-free). (Adding the warps one after another into one
// buffer chained Warps x V shared-memory updates per block.)
template <unsigned Warps, int V> __device__ void block_sum_warps(float (&v)[V], float* slots) {
    const unsigned lane = threadIdx.x % 32, warp = threadIdx.x / 32;
    for (unsigned half = Warps / 2; half >= 1; half /= 2) {
        if (warp >= half && warp < 2 * half)
#pragma unroll
            for (int i = 0; i < V; ++i) slots[((warp - half) * V + i) * 32 + lane] = v[i];
        __syncthreads();
        if (warp < half)
#pragma unroll
            for (int i = 0; i < V; ++i) v[i] += slots[(warp * V + i) * 32 + lane];
        __syncthreads();
    }
}

// A float rounded to TF32 (to nearest, ties away), as mma's tf32 operands take it.
__device__ __forceinline__ std::uint32_t to_tf32(float v) {
    std::uint32_t r;
    asm("cvt.rna.tf32.f32 %0, %1;" : "=r"(r) : "f"(v));
    return r;
}
// A 16-byte chunk of four floats, each rounded to TF32.
__device__ __forceinline__ uint4 to_tf32(uint4 v) {
    return make_uint4(to_tf32(__uint_as_float(v.x)), to_tf32(__uint_as_float(v.y)), to_tf32(__uint_as_float(v.z)),
                      to_tf32(__uint_as_float(v.w)));
}

// A ReLU's backward on one 32-bit word of stored gradient g: each value kept
// where the ReLU's output m (the same word of its output) is positive, zero
// elsewhere; a bf16 pair half by half, or one float.
__device__ __forceinline__ std::uint32_t relu_masked_bf16x2(std::uint32_t g, std::uint32_t m) {
    const float2 mf = __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(&m));
    return g & ((mf.x > 0.0f ? 0xffffu : 0u) | (mf.y > 0.0f ? 0xffff0000u : 0u));
}
__device__ __forceinline__ std::uint32_t relu_masked_f32(std::uint32_t g, std::uint32_t m) {
    return __uint_as_float(m) > 0.0f ? g : 0u;
}

// Two floats as a bf16 pair (lo in the low half).
__device__ __forceinline__ std::uint32_t pack_bf16(float lo, float hi) {
    const __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
    return *reinterpret_cast<const std::uint32_t*>(&v);
}

// f(std::integral_constant<int, v>{}) for v in 1..N (N where v >= N): one
// instantiation of a kernel template per value a launcher may meet.
template <int N, class F> void with_constant(unsigned v, F&& f) {
    if constexpr (N > 1)
        if (v < static_cast<unsigned>(N)) return with_constant<N - 1>(v, f);
    f(std::integral_constant<int, N>{});
}

inline unsigned sm_count() {
    int dev = 0, sms = 0;
    CUDA_CHECK(cudaGetDevice(&dev));
    CUDA_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev));
    return static_cast<unsigned>(std::max(1, sms));
}
// Shared memory one block may take on the current device (its opt-in
// maximum: 227 KB on compute capability 9.0, 163 KB on 8.0, 99 KB on 8.6 and
// 8.9); asking a kernel for more fails at launch.
inline std::uint64_t block_shared_limit() {
    int dev = 0, bytes = 0;
    CUDA_CHECK(cudaGetDevice(&dev));
    CUDA_CHECK(cudaDeviceGetAttribute(&bytes, cudaDevAttrMaxSharedMemoryPerBlockOptin, dev));
    return static_cast<std::uint64_t>(std::max(0, bytes));
}
// Shared memory one SM holds for all its blocks (228 KB on compute
// capability 9.0, each block reserving 1 KB of it).
inline std::uint64_t sm_shared_limit() {
    int dev = 0, bytes = 0;
    CUDA_CHECK(cudaGetDevice(&dev));
    CUDA_CHECK(cudaDeviceGetAttribute(&bytes, cudaDevAttrMaxSharedMemoryPerMultiprocessor, dev));
    return static_cast<std::uint64_t>(std::max(0, bytes));
}

} // namespace dstk::train::cuda
