#pragma once
// The tensor memory accelerator (compute capability 9.0): a box of a tensor
// copied into shared memory by one thread's instruction, the parts outside
// the tensor filled with zeros, its arrival counted on a barrier in shared
// memory (mbarrier) that the block's threads wait on. Device side only; the
// tensor map (CUtensorMap) is encoded on the host by whoever launches.
// Compiled for older architectures, the functions are empty: their callers
// take them only where the kernel's code is compute_90 or later
// (launch_common.cuh's programmatic_launch tells the same from the host).
#include <cuda.h>
#include <cudaTypedefs.h>

#include <cstdint>
#include <string>

namespace dstk::train::cuda {

#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
#define DSTK_TMA_BODY(...) __VA_ARGS__
#else
#define DSTK_TMA_BODY(...)
#endif

// A barrier at shared address bar that completes once `count` threads have
// arrived (and the bytes announced have landed); visible to the async proxy.
__device__ __forceinline__ void mbarrier_init(unsigned bar, unsigned count = 1) {
    DSTK_TMA_BODY(asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n\t"
                               "fence.mbarrier_init.release.cluster;" ::"r"(bar),
                               "r"(count)
                               : "memory");)
}
// The calling thread's arrival, announcing no bytes.
__device__ __forceinline__ void mbarrier_arrive(unsigned bar) {
    DSTK_TMA_BODY(asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];" ::"r"(bar) : "memory");)
}
// The calling thread's arrival, announcing the bytes the copies it issues next bring.
__device__ __forceinline__ void mbarrier_expect(unsigned bar, unsigned bytes) {
    DSTK_TMA_BODY(asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(bar), "r"(bytes)
                               : "memory");)
}
// Waits until the barrier's phase with this parity has completed.
__device__ __forceinline__ void mbarrier_wait(unsigned bar, unsigned parity) {
    DSTK_TMA_BODY(unsigned done = 0; do {
        asm volatile("{\n\t.reg .pred p;\n\t"
                     "mbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\n\t"
                     "selp.u32 %0, 1, 0, p;\n\t}"
                     : "=r"(done)
                     : "r"(bar), "r"(parity)
                     : "memory");
    } while (!done);)
}
// Orders this thread's earlier shared-memory accesses (and, after a block
// barrier, the block's) before copies it issues next, which write there
// through the async proxy.
__device__ __forceinline__ void fence_proxy_async() {
    DSTK_TMA_BODY(asm volatile("fence.proxy.async.shared::cta;" ::: "memory");)
}
// The box of a 4-dimensional tensor map at coordinates c (innermost first,
// signed: a box may start outside) into shared address dst, counted on bar.
__device__ __forceinline__ void tma_load_4d(unsigned dst, const CUtensorMap& map, int c0, int c1, int c2, int c3,
                                            unsigned bar) {
    DSTK_TMA_BODY(asm volatile("cp.async.bulk.tensor.4d.shared::cluster.global.tile.mbarrier::complete_tx::bytes"
                               " [%0], [%1, {%2, %3, %4, %5}], [%6];" ::"r"(dst),
                               "l"(reinterpret_cast<std::uint64_t>(&map)), "r"(c0), "r"(c1), "r"(c2), "r"(c3), "r"(bar)
                               : "memory");)
}
// The box of a 2-dimensional tensor map at coordinates (c0, c1) into dst, counted on bar.
__device__ __forceinline__ void tma_load_2d(unsigned dst, const CUtensorMap& map, int c0, int c1, unsigned bar) {
    DSTK_TMA_BODY(asm volatile("cp.async.bulk.tensor.2d.shared::cluster.global.tile.mbarrier::complete_tx::bytes"
                               " [%0], [%1, {%2, %3}], [%4];" ::"r"(dst),
                               "l"(reinterpret_cast<std::uint64_t>(&map)), "r"(c0), "r"(c1), "r"(bar)
                               : "memory");)
}
// Shared address src into the box of a 2-dimensional tensor map at (c0, c1)
// (the parts outside the tensor not written), in this thread's current bulk
// group: commit it with tma_store_commit, and wait before src is written again.
__device__ __forceinline__ void tma_store_2d(const CUtensorMap& map, unsigned src, int c0, int c1) {
    DSTK_TMA_BODY(asm volatile("cp.async.bulk.tensor.2d.global.shared::cta.bulk_group [%0, {%2, %3}], [%1];" ::"l"(
                                   reinterpret_cast<std::uint64_t>(&map)),
                               "r"(src), "r"(c0), "r"(c1)
                               : "memory");)
}
__device__ __forceinline__ void tma_store_commit() {
    DSTK_TMA_BODY(asm volatile("cp.async.bulk.commit_group;" ::: "memory");)
}
// Until this thread's committed stores have read their shared memory (it may be written again).
__device__ __forceinline__ void tma_store_wait_read() {
    DSTK_TMA_BODY(asm volatile("cp.async.bulk.wait_group.read 0;" ::: "memory");)
}
// Until this thread's committed stores are done (written to global memory).
__device__ __forceinline__ void tma_store_wait() {
    DSTK_TMA_BODY(asm volatile("cp.async.bulk.wait_group 0;" ::: "memory");)
}
// The same box into L2 only: nothing to wait for.
__device__ __forceinline__ void tma_prefetch_4d(const CUtensorMap& map, int c0, int c1, int c2, int c3) {
    DSTK_TMA_BODY(asm volatile("cp.async.bulk.prefetch.tensor.4d.L2.global.tile [%0, {%1, %2, %3, %4}];" ::"l"(
                                   reinterpret_cast<std::uint64_t>(&map)),
                               "r"(c0), "r"(c1), "r"(c2), "r"(c3)
                               : "memory");)
}

#undef DSTK_TMA_BODY

// A tiled tensor map of `rank` dimensions (innermost first; element steps
// of 1, no interleave), encoded by the driver's cuTensorMapEncodeTiled (found
// once through the runtime: no link against the driver library); an Error
// naming `what` where the driver refuses it. Host side.
CUtensorMap encode_tensor_map(CUtensorMapDataType type, unsigned rank, const void* base, const cuuint64_t* dims,
                              const cuuint64_t* strides, const cuuint32_t* box, CUtensorMapSwizzle swizzle,
                              CUtensorMapL2promotion promotion, const std::string& what);

} // namespace dstk::train::cuda
