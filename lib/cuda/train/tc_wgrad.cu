#include "tc_wgrad.hpp"

#include <algorithm>
#include <type_traits>

#include "cuda_check.hpp"
#include "device_common.cuh"
#include "elementwise.hpp"
#include "launch_common.cuh"

namespace dstk::train::cuda {
namespace {

constexpr unsigned chan = 32;        // output and input channels per block (the GEMM's M and N)
constexpr unsigned pixel_words = 32; // one pixel's 32 channels in shared memory: 8 chunks of 16 bytes, swizzled
constexpr unsigned taps = 9;
constexpr unsigned row_groups = 2; // warps per filter row, each on every other pixel row
constexpr unsigned warps =
    3 * row_groups; // warp w: filter row w % 3 (its three taps), pixel rows w / 3, w / 3 + 2, ...
constexpr unsigned block_threads = warps * 32;
constexpr unsigned tile_pixels = 128;
constexpr unsigned blocks_per_sm = 2;
constexpr unsigned max_shared = 112 * 1024;  // two tile buffers
constexpr unsigned result_stride = chan + 1; // words per (k, tap) row of the block's result in shared memory
constexpr unsigned reduce_words = 3 * 3 * 2 * 4 * 4 * 32 + chan * taps * result_stride;

struct Geometry {
    TcWgradShape s;
    unsigned log_w, log_run; // w and w / 4 (the columns of a row each lane quarter walks) are powers of two
    unsigned tile_rows, tiles_per_image, tiles, xrows, xcols, sub_c, grid_x;
    std::uint64_t shared;
};

unsigned log2_of(unsigned v) {
    unsigned l = 0;
    while ((2u << l) <= v) ++l;
    return l;
}

Geometry geometry_of(const TcWgradShape& s) {
    Geometry g{};
    g.s = s;
    g.log_w = log2_of(std::max(1u, s.w));
    g.log_run = g.log_w >= 2 ? g.log_w - 2 : 0;
    g.tile_rows = std::max(1u, std::min(tile_pixels / std::max(1u, s.w), s.h));
    g.tiles_per_image = (s.h + g.tile_rows - 1) / g.tile_rows;
    g.tiles = s.n * g.tiles_per_image;
    g.xrows = g.tile_rows + 2;
    g.xcols = s.w + 2;
    g.sub_c = s.c / chan;
    const unsigned subs = std::max(1u, g.sub_c * (s.k / chan));
    g.grid_x = std::max(1u, std::min(g.tiles, sm_count() * blocks_per_sm / subs));
    const std::uint64_t buffers = 2 * (std::uint64_t{tile_pixels} + std::uint64_t{g.xrows} * g.xcols) * pixel_words * 4;
    g.shared = std::max<std::uint64_t>(buffers, std::uint64_t{reduce_words} * 4);
    return g;
}

// Shared-memory layout of a pixel at column col (of the dy tile, or of the
// input tile counting its left halo): chunk q (channels 4q..4q+3) is stored at
// chunk q ^ swizzle(col). The lanes of a 16-byte load read chunk gid of
// columns t4 * run + d (the same d): the swizzle spreads the four t4 over
// distinct bank groups, so a quarter-warp's loads are conflict-free.
__device__ __forceinline__ unsigned swizzle(unsigned quarter) {
    return (quarter & 3) << 1;
}

// Starts the copy of tile t's dy (tile_rows x w pixels of k0..k0+31) and
// input rows (xrows x w pixels of c0..c0+31; rows outside the image are
// zero-filled, the halo columns were zeroed once) into buf. Both are
// contiguous runs of pixels in global memory; a pixel's 32 channels are
// `chunks` 16-byte chunks (8 in float, 4 in bf16) and thread i copies chunk
// i % chunks of every (block_threads / chunks)-th pixel from i / chunks.
template <class T>
__device__ __forceinline__ void stage_tile(const T* x, const T* dy, const Geometry& g, unsigned t, unsigned k0,
                                           unsigned c0, std::uint32_t* buf) {
    constexpr unsigned chunks = chan * sizeof(T) / 16, per_chunk = 16 / sizeof(T), step = block_threads / chunks;
    const unsigned H = g.s.h, W = g.s.w, q = threadIdx.x % chunks, first = threadIdx.x / chunks;
    const unsigned img = t / g.tiles_per_image, y0 = (t - img * g.tiles_per_image) * g.tile_rows;
    const unsigned npix = g.tile_rows << g.log_w, dy_valid = min(g.tile_rows, H - y0) << g.log_w;
    // Pointers advance by `step` pixels; a copy outside the image reads nothing (size 0: zero fill).
    const T* src = dy + ((std::uint64_t{img} * H + y0) * W + first) * g.s.k + k0 + q * per_chunk;
    const std::uint64_t dy_step = std::uint64_t{step} * g.s.k;
#pragma unroll 2
    for (unsigned p = first; p < npix; p += step, src += dy_step) {
        const bool in = p < dy_valid;
        cp_async16(buf + p * pixel_words + ((q ^ swizzle(p >> g.log_run)) << 2), in ? src : dy, in);
    }
    // Input row y0 - 1 + ry, column ix (m = ry * w + ix): padded pixel (ry, ix + 1) = m + 2 ry + 1.
    const T* xsrc =
        x + (static_cast<std::int64_t>((std::uint64_t{img} * H + y0) * W + first) - W) * g.s.c + c0 + q * per_chunk;
    const std::uint64_t x_step = std::uint64_t{step} * g.s.c;
    std::uint32_t* xt = buf + tile_pixels * pixel_words;
#pragma unroll 2
    for (unsigned m = first; m < g.xrows << g.log_w; m += step, xsrc += x_step) {
        const unsigned ry = m >> g.log_w, col = (m & (W - 1)) + 1;
        const bool in = y0 + ry - 1 < H; // wraps below row 0
        cp_async16(xt + (m + 2 * ry + 1) * pixel_words + ((q ^ swizzle(col >> g.log_run)) << 2), in ? xsrc : x, in);
    }
}

// The 16-byte chunk `chunk` of the pixel at column col of a tile row.
__device__ __forceinline__ uint4 chunk_at(const std::uint32_t* row, unsigned col, unsigned chunk, unsigned quarter) {
    return *reinterpret_cast<const uint4*>(row + col * pixel_words + (chunk ^ swizzle(quarter)) * 4);
}
// The 8-byte unit `unit` (bf16 channels 4 unit .. 4 unit + 3) of the pixel at column col.
__device__ __forceinline__ uint2 unit_at(const std::uint32_t* row, unsigned col, unsigned unit, unsigned quarter) {
    return *reinterpret_cast<const uint2*>(row + col * pixel_words + ((unit >> 1) ^ swizzle(quarter)) * 4 +
                                           (unit & 1) * 2);
}
// Two bf16 of two pixels as one MMA register: the low (hi = false) or high halves of a and b, a's in the low half.
__device__ __forceinline__ std::uint32_t pair(std::uint32_t a, std::uint32_t b, bool hi) {
    return __byte_perm(a, b, hi ? 0x7632 : 0x5410);
}
// Input column col + j of a lane's window in bf16 (col = t4 * run: past its
// own run, the columns are the next lane quarter's).
__device__ __forceinline__ uint2 window_unit(const std::uint32_t* brow, unsigned col, unsigned j, unsigned run,
                                             unsigned gid, unsigned t4) {
    return unit_at(brow, col + j, gid, t4 + (j >= run));
}
// The bf16 A fragment word i (k slots 2 t4 + i...) of m-tile mi from two
// consecutive dy columns, and the B fragment word of n-tile ni from two
// consecutive input columns.
__device__ __forceinline__ std::uint32_t a_word(uint2 va, uint2 vb, int mi, int i) {
    return pair(mi ? va.y : va.x, mi ? vb.y : vb.x, i != 0);
}
__device__ __forceinline__ std::uint32_t b_word(uint2 pa, uint2 pb, int ni) {
    return pair(ni < 2 ? pa.x : pa.y, ni < 2 ? pb.x : pb.y, (ni & 1) != 0);
}
__device__ __forceinline__ std::uint32_t word(const uint4& v, int i) {
    return i == 0 ? v.x : i == 1 ? v.y : i == 2 ? v.z : v.w;
}

// Block (blockIdx.x, blockIdx.y = one 32 x 32 block of (k, c)): partials of
// the tiles blockIdx.x, blockIdx.x + gridDim.x, ... into
// partials[blockIdx.x][k][tap][c]. Per tap a GEMM over pixels: A = dy^T (k x
// pixels), B = the shifted input (pixels x c), mma.sync m16n8k4 in TF32 (float
// activations) or m16n8k16 in bf16 (m16n8k8 on images 8 wide).
//
// Each warp owns one filter row r and its three taps, and walks pixel rows
// of width W = 2^LogW. The MMA's four k slots are pixels, any order serving
// a sum: lane quarter t4 walks the columns t4 * run .. t4 * run + run - 1, so
// one 16-byte load gives a lane four channels of its pixel: both A fragments
// (m-tiles 0 and 1) at once, and for the input pixel, the B fragments of all
// four n-tiles. The input pixels of tap s + 1 are those of tap s one column
// on: a window of three input pixels per lane serves the three taps, sliding
// one column per step. The MMA rows and columns are channels in the matching
// order (row gid + 8i of m-tile mi is output channel 4 gid + 2 mi + i, column
// n of n-tile ni input channel 4 n + ni), so every fragment is a register pair
// or a single register as loaded: no moves. A step (four pixels) is 2 shared
// loads for 24 MMAs.
//
// Tiles are double-buffered: the next one is copied (cp.async) while this one
// is multiplied. The fragments are the fp32 values as stored: the tensor
// cores read their TF32 part (the low 13 mantissa bits are dropped, not
// rounded). At the end the two warps of each filter row add their sums in
// shared memory and the block writes its result in rows of 32 channels.
// One filter row's products over one tile row, fp32 (m16n8k4, TF32): lane
// quarter t4 walks columns col .. col + run - 1. Inlined, so the kernel's
// registers and code are those of one body.
template <unsigned LogW>
__device__ __forceinline__ void multiply_row_tf32(const std::uint32_t* arow, const std::uint32_t* brow, unsigned gid,
                                                  unsigned t4, float (&acc)[3][2][4][4]) {
    constexpr unsigned run = (1u << LogW) / 4;
    const unsigned col = t4 * run;
    // Window: input columns col + j + 0..2 (padded: the left halo is column 0).
    uint4 u[3];
    u[0] = chunk_at(brow, col, gid, t4);
    u[1] = chunk_at(brow, col + 1, gid, t4 + (1 >= run));
#pragma unroll
    for (unsigned j = 0; j < run; ++j) {
        u[(j + 2) % 3] = chunk_at(brow, col + j + 2, gid, t4 + (j + 2 >= run));
        const uint4 v = chunk_at(arow, col + j, gid, t4);
#pragma unroll
        for (unsigned s = 0; s < 3; ++s)
#pragma unroll
            for (int ni = 0; ni < 4; ++ni)
#pragma unroll
                for (int mi = 0; mi < 2; ++mi)
                    mma_tf32(acc[s][mi][ni], word(v, 2 * mi), word(v, 2 * mi + 1), word(u[(j + s) % 3], ni));
    }
}

// The same for bf16 (m16n8k8): lane quarter t4's k slots are columns col + 2j
// and col + 2j + 1, packed in pairs per channel.
template <unsigned LogW>
__device__ __forceinline__ void multiply_row_bf16(const std::uint32_t* arow, const std::uint32_t* brow, unsigned gid,
                                                  unsigned t4, float (&acc)[3][2][4][4]) {
    constexpr unsigned run = (1u << LogW) / 4;
    const unsigned col = t4 * run;
    // Window: input columns col + 2j + 0..3.
    uint2 u[4];
    u[0] = window_unit(brow, col, 0, run, gid, t4);
    u[1] = window_unit(brow, col, 1, run, gid, t4);
#pragma unroll
    for (unsigned j = 0; j < run; j += 2) {
        u[(j + 2) % 4] = window_unit(brow, col, j + 2, run, gid, t4);
        u[(j + 3) % 4] = window_unit(brow, col, j + 3, run, gid, t4);
        const uint2 va = unit_at(arow, col + j, gid, t4), vb = unit_at(arow, col + j + 1, gid, t4);
        std::uint32_t a[2][2];
#pragma unroll
        for (int mi = 0; mi < 2; ++mi)
#pragma unroll
            for (int i = 0; i < 2; ++i) a[mi][i] = a_word(va, vb, mi, i);
#pragma unroll
        for (unsigned s = 0; s < 3; ++s) {
            const uint2 pa = u[(j + s) % 4], pb = u[(j + s + 1) % 4];
#pragma unroll
            for (int ni = 0; ni < 4; ++ni) {
                const std::uint32_t b = b_word(pa, pb, ni);
#pragma unroll
                for (int mi = 0; mi < 2; ++mi) mma_bf16(acc[s][mi][ni], a[mi][0], a[mi][1], b);
            }
        }
    }
}

// The same for bf16 in m16n8k16, where run is a multiple of 4 (images 16
// wide and more): k slots 2 t4 (+1) are the lane quarter's columns j, j + 1,
// slots 2 t4 + 8 (+1) columns j + 2, j + 3, so that each product is the two
// m16n8k8 ones of consecutive steps: half the instructions and dependent
// accumulations, measured faster. (In TF32, m16n8k8 the same way over
// m16n8k4 measured slower.)
template <unsigned LogW>
__device__ __forceinline__ void multiply_row_bf16_k16(const std::uint32_t* arow, const std::uint32_t* brow,
                                                      unsigned gid, unsigned t4, float (&acc)[3][2][4][4]) {
    constexpr unsigned run = (1u << LogW) / 4;
    static_assert(run % 4 == 0, "four columns per product");
    const unsigned col = t4 * run;
    // Window: input columns col + j + 0..5.
    uint2 u[6];
    u[0] = window_unit(brow, col, 0, run, gid, t4);
    u[1] = window_unit(brow, col, 1, run, gid, t4);
#pragma unroll
    for (unsigned j = 0; j < run; j += 4) {
#pragma unroll
        for (unsigned d = 2; d < 6; ++d) u[(j + d) % 6] = window_unit(brow, col, j + d, run, gid, t4);
        uint2 v[4];
#pragma unroll
        for (unsigned q = 0; q < 4; ++q) v[q] = unit_at(arow, col + j + q, gid, t4);
        std::uint32_t a[2][4];
#pragma unroll
        for (int mi = 0; mi < 2; ++mi)
#pragma unroll
            for (int h = 0; h < 2; ++h)
#pragma unroll
                for (int i = 0; i < 2; ++i) a[mi][2 * h + i] = a_word(v[2 * h], v[2 * h + 1], mi, i);
#pragma unroll
        for (unsigned s = 0; s < 3; ++s) {
            const uint2 p0 = u[(j + s) % 6], p1 = u[(j + s + 1) % 6], p2 = u[(j + s + 2) % 6], p3 = u[(j + s + 3) % 6];
#pragma unroll
            for (int ni = 0; ni < 4; ++ni) {
                const std::uint32_t b0 = b_word(p0, p1, ni), b1 = b_word(p2, p3, ni);
#pragma unroll
                for (int mi = 0; mi < 2; ++mi) mma_bf16_k16(acc[s][mi][ni], a[mi], b0, b1);
            }
        }
    }
}

template <class T, unsigned LogW>
__global__ void __launch_bounds__(block_threads, blocks_per_sm)
    tc_wgrad_kernel(const T* x, const T* dy, Geometry g, float* partials) {
    constexpr unsigned W = 1u << LogW;
    extern __shared__ std::uint32_t sm[];
    const unsigned buf_words = (tile_pixels + g.xrows * g.xcols) * pixel_words;
    const unsigned K = g.s.k, C = g.s.c;
    const unsigned k0 = blockIdx.y / g.sub_c * chan, c0 = blockIdx.y % g.sub_c * chan;
    const unsigned warp = threadIdx.x / 32, lane = threadIdx.x % 32, gid = lane / 4, t4 = lane % 4;
    const unsigned r = warp % 3, rg = warp / 3;
    float acc[3][2][4][4] = {};
    // The halo columns (padded columns 0 and w + 1) of both buffers: zero for every tile.
    for (unsigned e = threadIdx.x; e < 2 * g.xrows * 2 * 8; e += block_threads) {
        const unsigned q = e % 8, side = e / 8 % 2, ry = e / 16 % g.xrows, b = e / (16 * g.xrows);
        const unsigned col = side ? W + 1 : 0;
        *reinterpret_cast<uint4*>(sm + b * buf_words + (tile_pixels + ry * g.xcols + col) * pixel_words +
                                  (q ^ swizzle(col >> g.log_run)) * 4) = make_uint4(0, 0, 0, 0);
    }
    if (blockIdx.x < g.tiles) stage_tile(x, dy, g, blockIdx.x, k0, c0, sm);
    cp_async_commit();
    unsigned cur = 0;
    for (unsigned t = blockIdx.x; t < g.tiles; t += gridDim.x, cur ^= 1) {
        if (t + gridDim.x < g.tiles) stage_tile(x, dy, g, t + gridDim.x, k0, c0, sm + (cur ^ 1) * buf_words);
        cp_async_commit();
        cp_async_wait<1>(); // this tile's copies are done
        __syncthreads();
        const std::uint32_t* dys = sm + cur * buf_words;
        const std::uint32_t* xt = dys + tile_pixels * pixel_words;
        const unsigned y0 = (t % g.tiles_per_image) * g.tile_rows, rows = min(g.tile_rows, g.s.h - y0);
        for (unsigned ty = rg; ty < rows; ty += row_groups) {
            const std::uint32_t* arow = dys + ty * W * pixel_words;
            const std::uint32_t* brow = xt + (ty + r) * g.xcols * pixel_words;
            if constexpr (std::is_same_v<T, float>) {
                multiply_row_tf32<LogW>(arow, brow, gid, t4, acc);
            } else if constexpr (LogW >= 4) {
                multiply_row_bf16_k16<LogW>(arow, brow, gid, t4, acc);
            } else {
                multiply_row_bf16<LogW>(arow, brow, gid, t4, acc);
            }
        }
        __syncthreads(); // done with this buffer before it is refilled
    }
    cp_async_wait<0>();
    // The second row group's sums into shared memory, lane-major (conflict-free).
    constexpr int per_warp = 3 * 2 * 4 * 4; // acc[s][mi][ni][q], flat
    auto* red = reinterpret_cast<float*>(sm);
    float* result = red + 3 * per_warp * 32; // [k][tap][c], rows of result_stride words
    const float(&flat)[per_warp] = reinterpret_cast<const float(&)[per_warp]>(acc);
    if (rg == 1)
#pragma unroll
        for (int i = 0; i < per_warp; ++i) red[(r * per_warp + i) * 32 + lane] = flat[i];
    __syncthreads();
    if (rg == 0)
#pragma unroll
        for (int i = 0; i < per_warp; ++i) {
            const int s = i / 32, mi = i / 16 % 2, ni = i / 4 % 4, q = i % 4;
            const unsigned k = 4 * gid + 2 * mi + (q >> 1), c = 4 * (2 * t4 + (q & 1)) + ni;
            result[(k * taps + r * 3 + s) * result_stride + c] = flat[i] + red[(r * per_warp + i) * 32 + lane];
        }
    __syncthreads();
    float* out = partials + std::uint64_t{blockIdx.x} * K * taps * C;
    for (unsigned e = threadIdx.x; e < chan * taps * chan; e += block_threads) {
        const unsigned row = e / chan, c = e % chan, k = row / taps, tap = row % taps;
        out[(std::uint64_t{k0 + k} * taps + tap) * C + c0 + c] = result[row * result_stride + c];
    }
}

} // namespace

bool tc_wgrad_supported(const TcWgradShape& s) {
    if (s.n < 1 || s.h < 1 || s.c == 0 || s.k == 0 || s.c % chan != 0 || s.k % chan != 0) return false;
    if (s.w < 8 || s.w > tile_pixels / 2 || (s.w & (s.w - 1)) != 0) return false;
    if (std::uint64_t{s.n} * s.h * s.w * std::max(s.c, s.k) >= (std::uint64_t{1} << 40)) return false;
    const Geometry g = geometry_of(s);
    return g.shared <= std::min<std::uint64_t>(max_shared, block_shared_limit()) &&
           std::uint64_t{s.n} * g.tiles_per_image < 0x7fffffffu;
}

std::uint64_t tc_wgrad_workspace(const TcWgradShape& s) {
    const Geometry g = geometry_of(s);
    return std::uint64_t{g.grid_x} * s.k * taps * s.c * sizeof(float);
}

void launch_tc_wgrad(const void* x, const void* dy, ActType t, const TcWgradShape& s, void* workspace, void* dw,
                     cudaStream_t stream, const std::uint32_t* map, const ParamUpdate* update) {
    const Geometry g = geometry_of(s);
    auto launch = [&](auto kernel, auto tag) {
        using T = std::remove_pointer_t<decltype(tag)>;
        if (g.shared > 48 * 1024)
            CUDA_CHECK(
                cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(g.shared)));
        plain_launch(kernel, dim3(g.grid_x, g.sub_c * (s.k / chan)), block_threads, g.shared, stream,
                     static_cast<const T*>(x), static_cast<const T*>(dy), g, static_cast<float*>(workspace));
    };
    auto by_width = [&](auto tag) {
        using T = std::remove_pointer_t<decltype(tag)>;
        switch (g.log_w) {
        case 3:
            launch(tc_wgrad_kernel<T, 3>, tag);
            break;
        case 4:
            launch(tc_wgrad_kernel<T, 4>, tag);
            break;
        case 5:
            launch(tc_wgrad_kernel<T, 5>, tag);
            break;
        default:
            launch(tc_wgrad_kernel<T, 6>, tag);
            break;
        }
    };
    if (t == ActType::bf16)
        by_width(static_cast<bf16*>(nullptr));
    else
        by_width(static_cast<float*>(nullptr));
    launch_sum_partials(static_cast<const float*>(workspace), g.grid_x, std::uint64_t{s.k} * taps * s.c, dw, t, stream,
                        map, update);
}

} // namespace dstk::train::cuda
