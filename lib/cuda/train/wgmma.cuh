#pragma once
// Hopper's warpgroup tensor-core instructions (wgmma, sm_90a), shared by the
// kernels that use them (wgmma_conv.cu, wgmma_wgrad.cu): which code has
// them, the shared-memory operand's descriptor and the accumulators as asm
// operands. Each kernel keeps its own instruction forms.
#include <cstdint>

namespace dstk::train::cuda {

// The warpgroup instructions exist in sm_90a's code only: elsewhere a kernel
// using them is empty, and sm90a_runs() tells its host code not to launch it.
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
#define DSTK_WGMMA_BODY(...) __VA_ARGS__
#else
#define DSTK_WGMMA_BODY(...)
#endif

// Whether this process's kernels run sm_90a's code: a device of compute
// capability 9.0 given that code (the fat binary may also hold compute_90
// code, which such a device could be given instead). Host side.
bool sm90a_runs();

// A shared-memory operand: K-major, 128-byte swizzle, groups of 8 rows 1024
// bytes apart (a row: 128 bytes of the reduction; one instruction's k-step
// starts 32 bytes further along it).
__device__ __forceinline__ std::uint64_t operand_desc(unsigned addr) {
    std::uint64_t d = (addr & 0x3FFFF) >> 4;
    d |= std::uint64_t{1} << 16;
    d |= std::uint64_t{1024 >> 4} << 32;
    d |= std::uint64_t{1} << 62;
    return d;
}

// The warpgroup's products: a fence before those that read registers just
// written (accumulators, or an A operand from registers), the products issued
// since the last commit made one group, and a wait until at most Pending
// groups are in flight (registers they read may then be written again).
__device__ __forceinline__ void wgmma_fence() {
    asm volatile("wgmma.fence.sync.aligned;" ::: "memory");
}
__device__ __forceinline__ void wgmma_commit() {
    asm volatile("wgmma.commit_group.sync.aligned;" ::: "memory");
}
template <int Pending> __device__ __forceinline__ void wgmma_wait() {
    asm volatile("wgmma.wait_group.sync.aligned %0;" ::"n"(Pending) : "memory");
}

// Named barrier 1 + wg: consumer warpgroup wg's 128 threads alone.
__device__ __forceinline__ void warpgroup_sync(unsigned wg) {
    asm volatile("bar.sync %0, 128;" ::"r"(1 + wg) : "memory");
}

// The accumulators of one m64n128 (64) or m64n64 (32) instruction, as asm
// operands from %0 on.
#define DSTK_WGMMA_D32(d)                                                                                              \
    "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]),        \
        "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), "+f"(d[16]),         \
        "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]),        \
        "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31])
#define DSTK_WGMMA_D64(d)                                                                                              \
    DSTK_WGMMA_D32(d), "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]),      \
        "+f"(d[39]), "+f"(d[40]), "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]),        \
        "+f"(d[47]), "+f"(d[48]), "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]),        \
        "+f"(d[55]), "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]),        \
        "+f"(d[63])
#define DSTK_WGMMA_D32_LIST                                                                                            \
    "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, "  \
    "%24, %25, %26, %27, %28, %29, %30, %31}, "
#define DSTK_WGMMA_D64_LIST                                                                                            \
    "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, "  \
    "%24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, "   \
    "%46, %47, %48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63}, "

} // namespace dstk::train::cuda
