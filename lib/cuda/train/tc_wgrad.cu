#include "tc_wgrad.hpp"

#include <algorithm>

#include "cuda_check.hpp"
#include "device_common.cuh"
#include "kernels.hpp"

namespace dstk::train::cuda {
namespace {

constexpr unsigned chan = 32;      // output and input channels per block (the GEMM's M and N)
constexpr unsigned row_words = 40; // words per pixel in the shared tiles: 32 + 8 keeps fragment loads conflict-free
constexpr unsigned taps = 9;       // warps per block, one per (r, s)
constexpr unsigned threads = taps * 32;
constexpr unsigned tile_pixels = 128;
constexpr unsigned blocks_per_sm = 2;
constexpr unsigned max_shared = 112 * 1024; // two tile buffers

struct Geometry {
    TcWgradShape s;
    unsigned tile_rows, tiles_per_image, tiles, xrows, xcols, sub_c, grid_x;
    std::uint64_t shared;
    Div32 dw, dxcols;
};

Geometry geometry_of(const TcWgradShape& s) {
    Geometry g{};
    g.s = s;
    g.tile_rows = std::max(1u, std::min(tile_pixels / std::max(1u, s.w), s.h));
    g.tiles_per_image = (s.h + g.tile_rows - 1) / g.tile_rows;
    g.tiles = s.n * g.tiles_per_image;
    g.xrows = g.tile_rows + 2;
    g.xcols = s.w + 2;
    g.sub_c = s.c / chan;
    const unsigned subs = std::max(1u, g.sub_c * (s.k / chan));
    g.grid_x = std::max(1u, std::min(g.tiles, sm_count() * blocks_per_sm / subs));
    g.dw = Div32(s.w);
    g.dxcols = Div32(g.xcols);
    g.shared = 2 * (std::uint64_t{tile_pixels} + std::uint64_t{g.xrows} * g.xcols) * row_words * 4;
    return g;
}

__device__ __forceinline__ void mma_tf32(float (&d)[4], const std::uint32_t (&a)[4], std::uint32_t b0,
                                         std::uint32_t b1) {
    asm volatile("mma.sync.aligned.m16n8k8.row.col.f32.tf32.tf32.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
                 "{%0,%1,%2,%3};"
                 : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

__device__ __forceinline__ void cp_async16(std::uint32_t* dst, const float* src, bool valid) {
    const auto d = static_cast<unsigned>(__cvta_generic_to_shared(dst));
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;" ::"r"(d), "l"(src), "r"(valid ? 16 : 0));
}
__device__ __forceinline__ void cp_async_commit() {
    asm volatile("cp.async.commit_group;");
}
template <int N> __device__ __forceinline__ void cp_async_wait() {
    asm volatile("cp.async.wait_group %0;" ::"n"(N));
}

// Starts the copy of tile t's dy (npix pixels of k0..k0+31) and input rows
// (xrows x xcols pixels of c0..c0+31, zero outside the image) into buf.
__device__ __forceinline__ void stage_tile(const float* x, const float* dy, const Geometry& g, unsigned t, unsigned k0,
                                           unsigned c0, std::uint32_t* buf) {
    const unsigned H = g.s.h, W = g.s.w;
    const unsigned img = t / g.tiles_per_image, y0 = (t - img * g.tiles_per_image) * g.tile_rows;
    const unsigned ndy = g.tile_rows * W * 8, total = ndy + g.xrows * g.xcols * 8;
    for (unsigned e = threadIdx.x; e < total; e += threads) {
        if (e < ndy) {
            const unsigned p = e / 8, q = e % 8, py = g.dw.div(p), yy = y0 + py, xx = p - py * W;
            const bool in = yy < H;
            cp_async16(buf + p * row_words + q * 4,
                       in ? dy + ((std::uint64_t{img} * H + yy) * W + xx) * g.s.k + k0 + q * 4 : dy, in);
        } else {
            const unsigned p = (e - ndy) / 8, q = (e - ndy) % 8, ry = g.dxcols.div(p), rx = p - ry * g.xcols;
            const int iy = static_cast<int>(y0 + ry) - 1, ix = static_cast<int>(rx) - 1;
            const bool in = iy >= 0 && iy < static_cast<int>(H) && ix >= 0 && ix < static_cast<int>(W);
            cp_async16(buf + (tile_pixels + p) * row_words + q * 4,
                       in ? x + ((std::uint64_t{img} * H + iy) * W + ix) * g.s.c + c0 + q * 4 : x, in);
        }
    }
}

// Block (blockIdx.x, blockIdx.y = one 32 x 32 block of (k, c)): partials of
// the tiles blockIdx.x, blockIdx.x + gridDim.x, ... into
// partials[blockIdx.x][k][tap][c]. GEMM per tap: A = dy^T (k x pixels), B =
// the shifted input (pixels x c), eight pixels along a row per step. Tiles
// are double-buffered: the next one is copied (cp.async) while this one is
// multiplied. The fragments are the fp32 values as stored: the tensor cores
// read their TF32 part (the low 13 mantissa bits are dropped, not rounded),
// which spares a conversion per element and keeps the loop to its loads and
// MMAs.
__global__ void __launch_bounds__(threads, blocks_per_sm)
    tc_wgrad_kernel(const float* x, const float* dy, Geometry g, float* partials) {
    extern __shared__ std::uint32_t sm[];
    const unsigned buf_words = (tile_pixels + g.xrows * g.xcols) * row_words;
    const unsigned W = g.s.w, K = g.s.k, C = g.s.c;
    const unsigned k0 = blockIdx.y / g.sub_c * chan, c0 = blockIdx.y % g.sub_c * chan;
    const unsigned warp = threadIdx.x / 32, lane = threadIdx.x % 32, gid = lane / 4, t4 = lane % 4;
    const unsigned tap_r = warp / 3, tap_s = warp % 3;
    float acc[2][4][4] = {};
    if (blockIdx.x < g.tiles) stage_tile(x, dy, g, blockIdx.x, k0, c0, sm);
    cp_async_commit();
    unsigned cur = 0;
    for (unsigned t = blockIdx.x; t < g.tiles; t += gridDim.x, cur ^= 1) {
        if (t + gridDim.x < g.tiles) stage_tile(x, dy, g, t + gridDim.x, k0, c0, sm + (cur ^ 1) * buf_words);
        cp_async_commit();
        cp_async_wait<1>(); // this tile's copies are done
        __syncthreads();
        const std::uint32_t* dys = sm + cur * buf_words;
        const std::uint32_t* xt = dys + tile_pixels * row_words;
        const unsigned y0 = (t % g.tiles_per_image) * g.tile_rows, rows = min(g.tile_rows, g.s.h - y0);
        for (unsigned ty = 0; ty < rows; ++ty) {
            const std::uint32_t* arow = dys + (ty * W + t4) * row_words + gid;
            const std::uint32_t* brow = xt + ((ty + tap_r) * g.xcols + tap_s + t4) * row_words + gid;
#pragma unroll 2
            for (unsigned x0 = 0; x0 < W; x0 += 8) {
                const std::uint32_t* A = arow + x0 * row_words;
                const std::uint32_t* B = brow + x0 * row_words;
                std::uint32_t a[2][4];
#pragma unroll
                for (int mi = 0; mi < 2; ++mi) {
                    a[mi][0] = A[mi * 16];
                    a[mi][1] = A[mi * 16 + 8];
                    a[mi][2] = A[4 * row_words + mi * 16];
                    a[mi][3] = A[4 * row_words + mi * 16 + 8];
                }
#pragma unroll
                for (int ni = 0; ni < 4; ++ni) {
                    const std::uint32_t b0 = B[ni * 8], b1 = B[4 * row_words + ni * 8];
#pragma unroll
                    for (int mi = 0; mi < 2; ++mi) mma_tf32(acc[mi][ni], a[mi], b0, b1);
                }
            }
        }
        __syncthreads(); // done with this buffer before it is refilled
    }
    float* out = partials + std::uint64_t{blockIdx.x} * K * taps * C;
#pragma unroll
    for (int mi = 0; mi < 2; ++mi)
#pragma unroll
        for (int ni = 0; ni < 4; ++ni)
#pragma unroll
            for (int q = 0; q < 4; ++q) {
                const unsigned k = k0 + mi * 16 + gid + (q >> 1) * 8, c = c0 + ni * 8 + t4 * 2 + (q & 1);
                out[(std::uint64_t{k} * taps + warp) * C + c] = acc[mi][ni][q];
            }
}

} // namespace

bool tc_wgrad_supported(const TcWgradShape& s) {
    if (s.n < 1 || s.h < 1 || s.c == 0 || s.k == 0 || s.c % chan != 0 || s.k % chan != 0) return false;
    if (s.w % 8 != 0 || s.w > tile_pixels || s.w < 8) return false;
    if (std::uint64_t{s.n} * s.h * s.w * std::max(s.c, s.k) >= (std::uint64_t{1} << 40)) return false;
    const Geometry g = geometry_of(s);
    return g.shared <= max_shared && std::uint64_t{s.n} * g.tiles_per_image < 0x7fffffffu;
}

std::uint64_t tc_wgrad_workspace(const TcWgradShape& s) {
    const Geometry g = geometry_of(s);
    return std::uint64_t{g.grid_x} * s.k * taps * s.c * sizeof(float);
}

void launch_tc_wgrad(const float* x, const float* dy, const TcWgradShape& s, void* workspace, float* dw,
                     cudaStream_t stream) {
    const Geometry g = geometry_of(s);
    if (g.shared > 48 * 1024)
        CUDA_CHECK(cudaFuncSetAttribute(tc_wgrad_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                        static_cast<int>(g.shared)));
    auto* partials = static_cast<float*>(workspace);
    tc_wgrad_kernel<<<dim3(g.grid_x, g.sub_c * (s.k / chan)), threads, g.shared, stream>>>(x, dy, g, partials);
    CUDA_CHECK(cudaGetLastError());
    launch_sum_partials(partials, g.grid_x, std::uint64_t{s.k} * taps * s.c, dw, stream);
}

} // namespace dstk::train::cuda
