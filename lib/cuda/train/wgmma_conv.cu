#include "wgmma_conv.hpp"

#include <algorithm>
#include <mutex>
#include <stdexcept>
#include <string>

#include "launch_common.cuh"
#include "tma.cuh"
#include "wgmma.cuh"

namespace dstk::train::cuda {
namespace {

// Output pixels of a tile, and its output channels: 128, or 64 where a data
// gradient writes 64 (no statistics there).
constexpr unsigned tile_m = 128, tile_n = 128, narrow_n = 64;
constexpr unsigned row_bytes = 128; // a row of a stage or a staged box: the swizzle's span
// Input channels of one stage (a 128-byte row): 64 in bf16, 32 in float.
template <class T> constexpr unsigned step_k = row_bytes / sizeof(T);
constexpr unsigned stages = 4;                                           // the ring of stages the producer fills ahead
constexpr unsigned consumers = 2, block_threads = (consumers + 1) * 128; // two consumer warpgroups, the producer's
constexpr unsigned box_bytes = tile_m * row_bytes; // a stage's input box, its filters' slice, a staged box
constexpr unsigned a_bytes = box_bytes;            // (a stage: the input box, then N filters' slice)
template <unsigned N> constexpr unsigned stage_bytes = a_bytes + N* row_bytes;
// A consumer's staging boxes: the whole output tile in bf16 (64 channels a
// box), half of it at a time in float (32 channels a box).
constexpr unsigned staging_bytes = 2 * box_bytes;
constexpr unsigned max_cout = 512; // (a consumer's sums of every channel in shared memory)
// Dynamic shared memory: the stages (128 channels wide or less), each
// consumer's staging boxes and sums (double, two per channel), and room to
// align the stages to 1024 bytes.
constexpr std::size_t shared_bytes(unsigned cout) {
    return stages * stage_bytes<tile_n> + consumers * (staging_bytes + std::size_t{cout} * 16) + 1024;
}

struct Geo {
    unsigned cin = 0, cout = 0;
    unsigned rows = 0;            // image rows per tile where an image has 128 pixels or more, else 0
    unsigned images = 1;          // whole images per tile otherwise
    unsigned tiles_per_image = 0; // where rows > 0
    unsigned mtiles = 0, ntiles = 0;
    unsigned long long pixels = 0; // n * h * w: rows of the output
};

struct Shared {
    std::uint64_t full[stages], empty[stages]; // a stage filled by TMA; a stage read
    std::uint64_t turn[consumers];             // a consumer may start its next main loop
    float red[consumers * 4][tile_n][2];       // per warp, a tile's column sums
    float pivot[max_cout];
};

struct TileAt {
    int image = 0, row = 0; // the tile's first image and its first row there
    unsigned mtile = 0, ntile = 0;
};

// The device code proper: compiled for sm_90a only (elsewhere nothing calls it).
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)

// A consumer holds a whole tile's accumulators (128 per thread): the producer's
// warpgroup gives up the registers it does not use (setmaxnreg).
constexpr unsigned producer_registers = 40, consumer_registers = 232;

__device__ __forceinline__ TileAt tile_at(const Geo& g, unsigned t) {
    TileAt at;
    at.ntile = t % g.ntiles;
    at.mtile = t / g.ntiles;
    if (g.rows) {
        at.image = static_cast<int>(at.mtile / g.tiles_per_image);
        at.row = static_cast<int>((at.mtile % g.tiles_per_image) * g.rows);
    } else {
        at.image = static_cast<int>(at.mtile * g.images);
    }
    return at;
}

// Named barrier 3: both consumers' (1 and 2 are each one's own: warpgroup_sync).
__device__ __forceinline__ void consumers_sync() {
    asm volatile("bar.sync 3, %0;" ::"n"(consumers * 128) : "memory");
}

// d (+)= a * b, 64 rows by N columns over 32 bytes of the reduction
// (m64nNk16 in bf16, k8 in tf32), both operands from shared memory
// (descriptors; in tf32 TMA rounded them to TF32 on the way: encode).
template <class T, unsigned N>
__device__ __forceinline__ void wgmma_m64(float (&d)[N / 2], std::uint64_t a, std::uint64_t b, int accumulate) {
    constexpr bool tf32 = std::is_same_v<T, float>;
    if constexpr (tf32 && N == 128)
        asm volatile("{\n\t.reg .pred p;\n\tsetp.ne.b32 p, %66, 0;\n\t"
                     "wgmma.mma_async.sync.aligned.m64n128k8.f32.tf32.tf32 " DSTK_WGMMA_D64_LIST
                     "%64, %65, p, 1, 1;\n\t}"
                     : DSTK_WGMMA_D64(d)
                     : "l"(a), "l"(b), "r"(accumulate));
    else if constexpr (N == 128)
        asm volatile("{\n\t.reg .pred p;\n\tsetp.ne.b32 p, %66, 0;\n\t"
                     "wgmma.mma_async.sync.aligned.m64n128k16.f32.bf16.bf16 " DSTK_WGMMA_D64_LIST
                     "%64, %65, p, 1, 1, 0, 0;\n\t}"
                     : DSTK_WGMMA_D64(d)
                     : "l"(a), "l"(b), "r"(accumulate));
    else if constexpr (tf32)
        asm volatile("{\n\t.reg .pred p;\n\tsetp.ne.b32 p, %34, 0;\n\t"
                     "wgmma.mma_async.sync.aligned.m64n64k8.f32.tf32.tf32 " DSTK_WGMMA_D32_LIST
                     "%32, %33, p, 1, 1;\n\t}"
                     : DSTK_WGMMA_D32(d)
                     : "l"(a), "l"(b), "r"(accumulate));
    else
        asm volatile("{\n\t.reg .pred p;\n\tsetp.ne.b32 p, %34, 0;\n\t"
                     "wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16 " DSTK_WGMMA_D32_LIST
                     "%32, %33, p, 1, 1, 0, 0;\n\t}"
                     : DSTK_WGMMA_D32(d)
                     : "l"(a), "l"(b), "r"(accumulate));
}

// The producer's first thread: for each of the block's tiles, each tap and
// step of input channels (128 bytes), the input box under the tap (zeros
// outside the image) and the filters' slice into the next free stage.
template <class T, unsigned N>
__device__ void produce(const CUtensorMap& xmap, const CUtensorMap& wmap, const Geo& g, unsigned char* smem,
                        Shared& sh) {
    const unsigned kc = g.cin / step_k<T>, steps = 9 * kc, tiles = g.mtiles * g.ntiles;
    unsigned it = 0;
    for (unsigned t = blockIdx.x; t < tiles; t += gridDim.x) {
        const TileAt at = tile_at(g, t);
        for (unsigned kb = 0; kb < steps; ++kb, ++it) {
            const unsigned s = it % stages;
            if (it >= stages) mbarrier_wait(smem_address(&sh.empty[s]), (it / stages - 1) & 1);
            const int tap = static_cast<int>(kb / kc), c0 = static_cast<int>((kb % kc) * step_k<T>);
            const unsigned a = smem_address(smem + s * stage_bytes<N>), bar = smem_address(&sh.full[s]);
            mbarrier_expect(bar, stage_bytes<N>);
            tma_load_4d(a, xmap, c0, tap % 3 - 1, at.row + tap / 3 - 1, at.image, bar);
            tma_load_2d(a + a_bytes, wmap, tap * static_cast<int>(g.cin) + c0, static_cast<int>(at.ntile * N), bar);
        }
    }
}

// A consumer warpgroup's tile (two blocks of 64 rows, N columns) from stage
// it on: each stage's products as it lands, the stage handed back once the
// next one's are issued, and the other consumer's turn given once the last are.
template <class T, unsigned N>
__device__ void multiply(float (&d)[2][N / 2], const Geo& g, unsigned char* smem, Shared& sh, unsigned it) {
    const unsigned steps = 9 * (g.cin / step_k<T>), wg = threadIdx.x / 128;
    const bool leader = threadIdx.x % 128 == 0;
    for (unsigned kb = 0; kb < steps; ++kb, ++it) {
        const unsigned s = it % stages;
        mbarrier_wait(smem_address(&sh.full[s]), (it / stages) & 1);
        const unsigned a = smem_address(smem + s * stage_bytes<N>), b = a + a_bytes;
        wgmma_fence();
#pragma unroll
        for (unsigned k = 0; k < row_bytes / 32; ++k)
#pragma unroll
            for (unsigned m = 0; m < 2; ++m)
                wgmma_m64<T, N>(d[m], operand_desc(a + m * 64 * row_bytes + 32 * k), operand_desc(b + 32 * k),
                                kb > 0 || k > 0);
        wgmma_commit();
        wgmma_wait<1>();
        if (kb > 0 && leader) mbarrier_arrive(smem_address(&sh.empty[(it - 1) % stages]));
    }
    if (leader) mbarrier_arrive(smem_address(&sh.turn[1 - wg]));
    wgmma_wait<0>();
    if (leader) mbarrier_arrive(smem_address(&sh.empty[(it - 1) % stages]));
#pragma unroll
    for (int m = 0; m < 2; ++m)
#pragma unroll
        for (unsigned i = 0; i < N / 2; ++i)
            asm volatile("" : "+f"(d[m][i])::"memory"); // nothing reads d before the wait
}

// v[j] = this lane's v[j] + its partner's v[j + Half] (or the reverse, where
// up): the lane keeps half the column pairs, summed over both lanes.
template <int Half> __device__ __forceinline__ void halve(float (&v)[8][4], bool up, int offset) {
#pragma unroll
    for (int j = 0; j < Half; ++j)
#pragma unroll
        for (int k = 0; k < 4; ++k) {
            const float send = up ? v[j][k] : v[j + Half][k], keep = up ? v[j + Half][k] : v[j][k];
            v[j][k] = keep + __shfl_xor_sync(0xffffffffu, send, offset);
        }
}

// Where the pair at row r, columns 8j + 2q and + 1 (q = lane % 4) of a tile
// goes among a consumer's staging boxes (rows swizzled by 128 bytes, as the
// store's tensor map reads them): in bf16 the whole tile (j < 16: box j / 8,
// 4 bytes), in float one half at a time (j % 8: box (j % 8) / 4, 8 bytes).
template <class T> __device__ __forceinline__ unsigned staged_at(unsigned staging, unsigned r, unsigned j, unsigned q) {
    if constexpr (std::is_same_v<T, float>) {
        const unsigned jh = j % 8, chunk = 2 * (jh % 4) + q / 2;
        return staging + (jh / 4) * box_bytes + r * row_bytes + ((chunk ^ (r % 8)) * 16) + 8 * (q % 2);
    } else {
        return staging + (j / 8) * box_bytes + r * row_bytes + (((j % 8) ^ (r % 8)) * 16) + 4 * q;
    }
}

// Stages the pair (a, b) at shared address at; returns it as stored (bf16: rounded).
template <class T> __device__ __forceinline__ float2 put(unsigned at, float a, float b) {
    if constexpr (std::is_same_v<T, float>) {
        asm volatile("st.shared.v2.f32 [%0], {%1, %2};" ::"r"(at), "f"(a), "f"(b));
        return {a, b};
    } else {
        const __nv_bfloat162 v = __floats2bfloat162_rn(a, b);
        asm volatile("st.shared.b32 [%0], %1;" ::"r"(at), "r"(*reinterpret_cast<const unsigned*>(&v)));
        return __bfloat1622float2(v);
    }
}

// A consumer warpgroup's staged boxes (two, or the one a 64-column bf16 tile
// fills) into the output at the tile's columns from 64 * half on, as one bulk
// group that its first thread issues once every thread's staging is visible
// to TMA.
template <class T, unsigned N>
__device__ __forceinline__ void flush_boxes(const CUtensorMap& ymap, unsigned staging, const TileAt& at,
                                            unsigned half) {
    fence_proxy_async();
    warpgroup_sync(threadIdx.x / 128);
    if (threadIdx.x % 128 != 0) return;
    const int c = static_cast<int>(at.ntile * N + 64 * half), r0 = static_cast<int>(at.mtile * tile_m);
    tma_store_2d(ymap, staging, c, r0);
    if constexpr (N * sizeof(T) > row_bytes)
        tma_store_2d(ymap, staging + box_bytes, c + static_cast<int>(step_k<T>), r0);
    tma_store_commit();
}

// A consumer's tile into its staging boxes as stored (bf16 or float) and,
// with Stats (128 columns), each warp's column sums of (v - pivot) and its
// square over its rows into sh.red. A lane holds rows r and r + 8 of each
// 64-row block, column pairs 8j + 2(lane % 4); the 8 lanes of a column are
// summed by halving (32 + 16 + 8 shuffles, not 3 x 64). A float tile of 128
// columns is staged in two halves of 64: the first stored (and its boxes
// read) before the second is staged, so that a consumer's staging stays 32 KB.
template <class T, unsigned N, bool Stats>
__device__ void stage_tile(const float (&d)[2][N / 2], const Geo& g, const TileAt& at, unsigned staging, Shared& sh,
                           const CUtensorMap& ymap) {
    static_assert(N == tile_n || !Stats, "the statistics' halving takes 128 columns");
    constexpr bool halves = std::is_same_v<T, float> && N == tile_n;
    const unsigned lane = threadIdx.x % 32, warp = threadIdx.x / 32, q = lane % 4;
    const unsigned r = (warp % 4) * 16 + lane / 4;
    const unsigned long long first = static_cast<unsigned long long>(at.mtile) * tile_m + r;
    float ok[2][2]; // rows inside the output (the last tile may be partial)
#pragma unroll
    for (unsigned m = 0; m < 2; ++m)
        for (unsigned e = 0; e < 2; ++e) ok[m][e] = first + m * 64 + e * 8 < g.pixels ? 1.0f : 0.0f;
    [[maybe_unused]] float v[8][4]; // columns jj's sums, then jj's or jj + 8's over this lane and lane ^ 16
#pragma unroll
    for (unsigned h = 0; h < N / 64; ++h) {
        if constexpr (halves) {
            if (h == 1) {
                flush_boxes<T, N>(ymap, staging, at, 0);
                if (threadIdx.x % 128 == 0) tma_store_wait_read();
                warpgroup_sync(threadIdx.x / 128);
            }
        }
#pragma unroll
        for (unsigned jj = 0; jj < 8; ++jj) {
            const unsigned j = jj + 8 * h;
            [[maybe_unused]] float w[4] = {};
            [[maybe_unused]] float2 p{};
            if constexpr (Stats) p = *reinterpret_cast<const float2*>(&sh.pivot[at.ntile * tile_n + 8 * j + 2 * q]);
#pragma unroll
            for (unsigned m = 0; m < 2; ++m) {
                const unsigned r0 = r + m * 64;
                const float2 lo = put<T>(staged_at<T>(staging, r0, j, q), d[m][4 * j], d[m][4 * j + 1]);
                const float2 hi = put<T>(staged_at<T>(staging, r0 + 8, j, q), d[m][4 * j + 2], d[m][4 * j + 3]);
                if constexpr (Stats) {
                    const float v0 = (lo.x - p.x) * ok[m][0], v1 = (lo.y - p.y) * ok[m][0];
                    const float v2 = (hi.x - p.x) * ok[m][1], v3 = (hi.y - p.y) * ok[m][1];
                    w[0] += v0 + v2, w[1] += v1 + v3, w[2] += v0 * v0 + v2 * v2, w[3] += v1 * v1 + v3 * v3;
                }
            }
            if constexpr (Stats) {
                const bool up = lane & 16;
#pragma unroll
                for (int k = 0; k < 4; ++k)
                    v[jj][k] =
                        h == 0 ? w[k] : (up ? w[k] : v[jj][k]) + __shfl_xor_sync(0xffffffffu, up ? v[jj][k] : w[k], 16);
            }
        }
    }
    if constexpr (Stats) {
        halve<4>(v, lane & 8, 8);
        halve<2>(v, lane & 4, 4);
#pragma unroll
        for (int t = 0; t < 2; ++t) {
            const unsigned j = t + 2 * ((lane >> 2) & 1) + 4 * ((lane >> 3) & 1) + 8 * ((lane >> 4) & 1);
            const unsigned c = 8 * j + 2 * q;
            sh.red[warp][c][0] = v[t][0], sh.red[warp][c][1] = v[t][2];
            sh.red[warp][c + 1][0] = v[t][1], sh.red[warp][c + 1][1] = v[t][3];
        }
    }
}

// A consumer's epilogue: its tile staged, stored by TMA (its first thread),
// and its column sums added to its own (in double, one thread per column:
// a fixed order).
template <class T, unsigned N, bool Stats>
__device__ void finish_tile(const float (&d)[2][N / 2], const Geo& g, const TileAt& at, unsigned staging, Shared& sh,
                            const CUtensorMap& ymap, double* sums) {
    const unsigned wg = threadIdx.x / 128, lt = threadIdx.x % 128;
    if (lt == 0) tma_store_wait_read(); // its last tile's store has read the staging boxes
    warpgroup_sync(wg);
    stage_tile<T, N, Stats>(d, g, at, staging, sh, ymap);
    flush_boxes<T, N>(ymap, staging, at, std::is_same_v<T, float> && N == tile_n ? 1 : 0); // (float: the second half)
    if constexpr (Stats) {
        double s = 0.0, q = 0.0;
        for (unsigned w = 4 * wg; w < 4 * wg + 4; ++w) s += sh.red[w][lt][0], q += sh.red[w][lt][1];
        double* at_c = sums + (at.ntile * tile_n + lt) * 2;
        at_c[0] += s, at_c[1] += q;
    }
}

// A consumer warpgroup: every other tile of the block (ping-pong: its
// epilogue runs beside the other's main loop, the main loops in turn, so that
// a stage's full barrier is never waited on more than one phase ahead), then
// (with Stats) both consumers' sums of every channel into the block's
// column of the partials.
template <class T, unsigned N, bool Stats>
__device__ void consume(const CUtensorMap& ymap, const Geo& g, unsigned char* smem, Shared& sh, double* sums,
                        double* partials) {
    const unsigned wg = threadIdx.x / 128, steps = 9 * (g.cin / step_k<T>), tiles = g.mtiles * g.ntiles;
    const unsigned staging = smem_address(smem + stages * stage_bytes<N> + wg * staging_bytes);
    unsigned nth = 0;
    for (unsigned k = wg, t = blockIdx.x + wg * gridDim.x; t < tiles; k += 2, t += 2 * gridDim.x, ++nth) {
        if (wg == 1)
            mbarrier_wait(smem_address(&sh.turn[1]), nth & 1);
        else if (nth > 0)
            mbarrier_wait(smem_address(&sh.turn[0]), (nth - 1) & 1);
        float d[2][N / 2];
        multiply<T, N>(d, g, smem, sh, k * steps);
        finish_tile<T, N, Stats>(d, g, tile_at(g, t), staging, sh, ymap, sums + wg * 2 * g.cout);
    }
    if (threadIdx.x % 128 == 0) tma_store_wait();
    if constexpr (Stats) {
        consumers_sync();
        for (unsigned i = threadIdx.x; i < 2 * g.cout; i += consumers * 128)
            partials[(std::uint64_t{i / 2} * gridDim.x + blockIdx.x) * 2 + i % 2] = sums[i] + sums[2 * g.cout + i];
    }
}

#endif // __CUDA_ARCH_FEAT_SM90_ALL

template <class T, unsigned N, bool Stats>
__global__ void __launch_bounds__(block_threads, 1)
    wgmma_conv_kernel(const __grid_constant__ CUtensorMap xmap, const __grid_constant__ CUtensorMap wmap,
                      const __grid_constant__ CUtensorMap ymap, Geo g, const float* pivot, double* partials) {
    await_predecessor();
    DSTK_WGMMA_BODY({
        extern __shared__ unsigned char dynamic_smem[];
        __shared__ Shared sh;
        // The swizzle's pattern repeats every 1024 bytes: the stages start on such a boundary.
        auto* smem = reinterpret_cast<unsigned char*>((reinterpret_cast<std::uintptr_t>(dynamic_smem) + 1023) &
                                                      ~std::uintptr_t{1023});
        auto* sums = reinterpret_cast<double*>(smem + stages * stage_bytes<N> + consumers * staging_bytes);
        if constexpr (Stats) {
            for (unsigned c = threadIdx.x; c < g.cout; c += block_threads) sh.pivot[c] = pivot[c];
            for (unsigned i = threadIdx.x; i < consumers * 2 * g.cout; i += block_threads) sums[i] = 0.0;
        }
        if (threadIdx.x == 0) {
            for (unsigned s = 0; s < stages; ++s) {
                mbarrier_init(smem_address(&sh.full[s]), 1);
                mbarrier_init(smem_address(&sh.empty[s]), 1);
            }
            for (unsigned c = 0; c < consumers; ++c) mbarrier_init(smem_address(&sh.turn[c]), 1);
        }
        __syncthreads();
        if (threadIdx.x >= consumers * 128) {
            asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;" ::"n"(producer_registers));
            if (threadIdx.x == consumers * 128) produce<T, N>(xmap, wmap, g, smem, sh);
            return;
        }
        asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;" ::"n"(consumer_registers));
        consume<T, N, Stats>(ymap, g, smem, sh, sums, partials);
    })
}

// Output channels per tile: 128, or 64 for a data gradient into 64 (wgmma_conv_supported).
unsigned tile_width(unsigned cout) {
    return cout % tile_n == 0 ? tile_n : narrow_n;
}

Geo geo_of(const TcConvShape& s) {
    Geo g;
    g.cin = s.cin;
    g.cout = s.cout;
    const unsigned hw = s.h * s.w;
    if (hw >= tile_m) {
        g.rows = tile_m / s.w;
        g.tiles_per_image = hw / tile_m;
    } else {
        g.images = tile_m / hw;
    }
    g.pixels = static_cast<unsigned long long>(s.n) * hw;
    g.mtiles = static_cast<unsigned>((g.pixels + tile_m - 1) / tile_m);
    g.ntiles = s.cout / tile_width(s.cout);
    return g;
}

// A tensor map of the kernel's: 128-byte swizzle. In tf32 the loads round
// the operands to TF32 (to nearest, as tc_conv's), the output is float.
CUtensorMap encode(CUtensorMapDataType type, const void* base, unsigned rank, const cuuint64_t* dims,
                   const cuuint64_t* strides, const cuuint32_t* box, CUtensorMapL2promotion promotion,
                   const char* what) {
    return encode_tensor_map(type, rank, base, dims, strides, box, CU_TENSOR_MAP_SWIZZLE_128B, promotion,
                             std::string("wgmma_conv's ") + what);
}

// The kernel with its shared-memory limit raised once (per instantiation).
template <class T, unsigned N, bool Stats>
void launch_with(const CUtensorMap& xmap, const CUtensorMap& wmap, const CUtensorMap& ymap, const Geo& g, unsigned grid,
                 std::size_t shared, cudaStream_t stream, const TcConvStats& stats) {
    static std::once_flag once;
    std::call_once(once, [] {
        CUDA_CHECK(cudaFuncSetAttribute(wgmma_conv_kernel<T, N, Stats>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                        static_cast<int>(shared_bytes(max_cout))));
    });
    launch_kernel(wgmma_conv_kernel<T, N, Stats>, grid, block_threads, shared, stream, xmap, wmap, ymap, g, stats.pivot,
                  stats.partials);
}

// The probe of sm90a_runs: it writes only in sm_90a's code.
__global__ void sm90a_probe(int* out) {
    await_predecessor();
    DSTK_WGMMA_BODY(*out = 1;)
}

} // namespace

// (wgmma.cuh)
bool sm90a_runs() {
    static const bool yes = [] {
        int device = 0, major = 0, minor = 0;
        CUDA_CHECK(cudaGetDevice(&device));
        CUDA_CHECK(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device));
        CUDA_CHECK(cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, device));
        if (major != 9 || minor != 0) return false;
        int* flag = nullptr;
        int found = 0;
        CUDA_CHECK(cudaMalloc(&flag, sizeof(int)));
        CUDA_CHECK(cudaMemset(flag, 0, sizeof(int)));
        launch_kernel(sm90a_probe, 1, 1, 0, nullptr, flag);
        CUDA_CHECK(cudaMemcpy(&found, flag, sizeof(int), cudaMemcpyDeviceToHost));
        CUDA_CHECK(cudaFree(flag));
        return found == 1;
    }();
    return yes;
}

bool wgmma_conv_supported(const TcConvShape& s) {
    if (s.n < 1 || s.h < 1 || s.w < 1) return false;
    const unsigned step = s.tf32 ? step_k<float> : step_k<bf16>;
    if (s.cin == 0 || s.cin % step != 0 || s.cout == 0 || s.cout > max_cout) return false;
    if (s.cout % tile_n != 0 && !(s.data_gradient && s.cout == narrow_n)) return false;
    const unsigned hw = s.h * s.w;
    const bool rows = hw >= tile_m && hw % tile_m == 0 && tile_m % s.w == 0, images = hw < tile_m && tile_m % hw == 0;
    if (!rows && !images) return false;
    return sm90a_runs();
}

unsigned launch_wgmma_conv(const void* x, const void* w, void* y, const TcConvShape& s, void* scratch,
                           cudaStream_t stream, const TcConvStats& stats) {
    if (s.data_gradient && scratch) {
        launch_turn_filters(w, scratch, s, stream);
        w = scratch;
    }
    const Geo g = geo_of(s);
    const std::uint64_t bytes = s.tf32 ? sizeof(float) : sizeof(bf16), pixel = s.cin * bytes;
    const cuuint32_t step = row_bytes / static_cast<cuuint32_t>(bytes);
    const cuuint64_t xdims[4] = {s.cin, s.w, s.h, s.n}, xstrides[3] = {pixel, pixel * s.w, pixel * s.w * s.h};
    const cuuint32_t xbox[4] = {step, s.w, g.rows ? g.rows : s.h, g.images};
    const cuuint64_t wdims[2] = {std::uint64_t{9} * s.cin, s.cout}, wstrides[1] = {9 * pixel};
    const unsigned n = tile_width(s.cout);
    const cuuint32_t wbox[2] = {step, n};
    const cuuint64_t ydims[2] = {s.cout, g.pixels}, ystrides[1] = {s.cout * bytes};
    const cuuint32_t ybox[2] = {step, tile_m};
    const CUtensorMapDataType load = s.tf32 ? CU_TENSOR_MAP_DATA_TYPE_TFLOAT32 : CU_TENSOR_MAP_DATA_TYPE_BFLOAT16;
    const CUtensorMapDataType store = s.tf32 ? CU_TENSOR_MAP_DATA_TYPE_FLOAT32 : CU_TENSOR_MAP_DATA_TYPE_BFLOAT16;
    const CUtensorMap xmap = encode(load, x, 4, xdims, xstrides, xbox, CU_TENSOR_MAP_L2_PROMOTION_L2_256B, "input");
    const CUtensorMap wmap = encode(load, w, 2, wdims, wstrides, wbox, CU_TENSOR_MAP_L2_PROMOTION_L2_256B, "filters");
    const CUtensorMap ymap = encode(store, y, 2, ydims, ystrides, ybox, CU_TENSOR_MAP_L2_PROMOTION_NONE, "output");
    const unsigned tiles = g.mtiles * g.ntiles;
    unsigned grid = std::min(tiles, sm_count());
    if (stats.partials) grid = std::min(grid, stats.max_splits);
    const std::size_t shared = shared_bytes(s.cout);
    if (stats.partials && n != tile_n) throw std::logic_error("wgmma_conv: statistics of a 64-channel output");
    const auto run = [&](auto t) {
        using T = decltype(t);
        if (stats.partials)
            launch_with<T, tile_n, true>(xmap, wmap, ymap, g, grid, shared, stream, stats);
        else if (n == tile_n)
            launch_with<T, tile_n, false>(xmap, wmap, ymap, g, grid, shared, stream, stats);
        else
            launch_with<T, narrow_n, false>(xmap, wmap, ymap, g, grid, shared, stream, stats);
    };
    if (s.tf32)
        run(float{});
    else
        run(bf16{});
    return grid;
}

} // namespace dstk::train::cuda
