#include "tc_conv.hpp"

#include <algorithm>
#include <mutex>

#include "cuda_check.hpp"
#include "device_common.cuh"

namespace dstk::train::cuda {
namespace {

constexpr unsigned warps = 4, threads = warps * 32;
constexpr unsigned tile_pixels = 128; // output pixels per tile, at most: whole rows of one image
constexpr unsigned block_n = 32;      // output channels per block (four n8 tiles)
constexpr unsigned max_cin = 128, max_width = 128;
constexpr std::uint64_t max_shared = 160 * 1024;
constexpr unsigned stage_words = 16 * block_n / 2; // a warp's staging rows: 16 pixels x 32 bf16

// Shared memory, in bf16 elements: the input tile's pixels and the block's
// filter rows ([n][tap]) each padded by 8 so that the eight 16-byte rows an
// ldmatrix reads (consecutive pixels, or consecutive n) fall in distinct banks.
struct Geometry {
    TcConvShape s;
    unsigned tile_rows, tiles_per_image, tiles, rows_in, cols_in, pitch;
    Div32 dw;
    std::uint64_t x_elems, w_elems, shared;
};

Geometry geometry_of(const TcConvShape& s) {
    Geometry g{};
    g.s = s;
    g.tile_rows = std::max(1u, std::min(s.h, tile_pixels / std::max(1u, s.w)));
    g.tiles_per_image = (s.h + g.tile_rows - 1) / g.tile_rows;
    g.tiles = s.n * g.tiles_per_image;
    g.rows_in = g.tile_rows + 2;
    g.cols_in = s.w + 2;
    g.pitch = s.cin + 8;
    g.dw = Div32(s.w);
    g.x_elems = std::uint64_t{g.rows_in} * g.cols_in * g.pitch;
    g.w_elems = std::uint64_t{block_n} * 9 * g.pitch;
    g.shared = (2 * g.x_elems + g.w_elems) * sizeof(bf16) + std::uint64_t{warps} * stage_words * 4;
    return g;
}

// The block's 32 filters as B[n][tap][c] (c the reduction's input channel):
// rows of the [cout][3][3][cin] filter (the forward's own, or the data
// gradient's, turned by turn_filters), copied asynchronously.
__device__ void load_filters(const bf16* w, const Geometry& g, unsigned n0, bf16* ws) {
    const unsigned chunks = g.s.cin / 8;
    for (unsigned e = threadIdx.x; e < block_n * 9 * chunks; e += blockDim.x) {
        const unsigned row = e / chunks, ch = e - row * chunks; // row = n * 9 + tap
        cp_async16(ws + row * g.pitch + ch * 8, w + (std::uint64_t{n0} * 9 + row) * g.s.cin + ch * 8, true);
    }
}

// The data gradient's filter from the forward's: out[c][tap][k] =
// w[k][8 - tap][c] (dx = conv(dy) with the taps turned 180 degrees and the
// channels swapped), once per call into scratch.
__global__ void turn_filters_kernel(const bf16* w, bf16* out, unsigned k, unsigned c) {
    const unsigned total = 9 * k * c;
    for (unsigned e = blockIdx.x * blockDim.x + threadIdx.x; e < total; e += gridDim.x * blockDim.x) {
        const unsigned kk = e % k, rest = e / k, tap = rest % 9, cc = rest / 9; // e = (cc * 9 + tap) * k + kk
        out[e] = w[(std::uint64_t{kk} * 9 + (8 - tap)) * c + cc];
    }
}

// Starts the copy of the input rows under tile t (zero outside the image);
// returns the tile's output pixel count and first pixel.
__device__ unsigned load_tile(const bf16* x, const Geometry& g, unsigned t, bf16* xs, std::uint64_t& first) {
    const unsigned img = t / g.tiles_per_image, oy0 = (t - img * g.tiles_per_image) * g.tile_rows;
    const unsigned chunks = g.s.cin / 8, total = g.rows_in * g.cols_in * chunks;
    for (unsigned e = threadIdx.x; e < total; e += blockDim.x) {
        const unsigned pix = e / chunks, ch = e - pix * chunks;
        const unsigned ry = pix / g.cols_in, rx = pix - ry * g.cols_in;
        const int iy = static_cast<int>(oy0 + ry) - 1, ix = static_cast<int>(rx) - 1;
        const bool in = iy >= 0 && iy < static_cast<int>(g.s.h) && ix >= 0 && ix < static_cast<int>(g.s.w);
        cp_async16(xs + pix * g.pitch + ch * 8,
                   in ? x + ((std::uint64_t{img} * g.s.h + iy) * g.s.w + ix) * g.s.cin + ch * 8 : x, in);
    }
    first = (std::uint64_t{img} * g.s.h + oy0) * g.s.w;
    return min(g.tile_rows, g.s.h - oy0) * g.s.w;
}

// A warp's 16-pixel row tiles m0 and m0 + warps (where they exist) times the
// block's four column tiles, then each through the staging rows to 16-byte
// stores of the output pixels' 32 channels.
template <unsigned CIN>
__device__ void multiply_tiles(const Geometry& g, const bf16* xs, const bf16* ws, unsigned pixels, unsigned m0, bf16* y,
                               std::uint32_t* stage) {
    const unsigned lane = threadIdx.x % 32, gid = lane / 4, t4 = lane % 4;
    const unsigned mtiles = (pixels + 15) / 16;
    bool live[2];
    unsigned base[2];
#pragma unroll
    for (int m = 0; m < 2; ++m) {
        const unsigned mt = m0 + m * warps;
        live[m] = mt < mtiles;
        const unsigned p = min(mt * 16 + lane % 16, pixels - 1), py = g.dw.div(p);
        base[m] = (py * g.cols_in + (p - py * g.s.w)) * g.pitch + (lane / 16) * 8;
    }
    float acc[2][4][4] = {};
    // ldmatrix rows for B: lane l reads n = (2 jp + l / 16) * 8 + l % 8, k half (l / 8) % 2.
    const unsigned brow = ((lane / 16) * 8 + lane % 8) * 9 * g.pitch + ((lane / 8) % 2) * 8;
    // Both loops unrolled (CIN a constant): the next steps' ldmatrix are
    // issued ahead of this step's products instead of waiting on each.
#pragma unroll
    for (unsigned tap = 0; tap < 9; ++tap) {
        const unsigned off = ((tap / 3) * g.cols_in + tap % 3) * g.pitch;
#pragma unroll
        for (unsigned c0 = 0; c0 < CIN; c0 += 16) {
            std::uint32_t b[2][4];
#pragma unroll
            for (int jp = 0; jp < 2; ++jp) ldmatrix_x4(b[jp], ws + brow + jp * 16 * 9 * g.pitch + tap * g.pitch + c0);
#pragma unroll
            for (int m = 0; m < 2; ++m) {
                if (!live[m]) continue;
                std::uint32_t a[4];
                ldmatrix_x4(a, xs + base[m] + off + c0);
#pragma unroll
                for (int jp = 0; jp < 2; ++jp) {
                    mma_bf16_k16(acc[m][2 * jp], a, b[jp][0], b[jp][1]);
                    mma_bf16_k16(acc[m][2 * jp + 1], a, b[jp][2], b[jp][3]);
                }
            }
        }
    }
#pragma unroll
    for (int m = 0; m < 2; ++m) {
        if (!live[m]) continue;
        const unsigned mt = m0 + m * warps;
#pragma unroll
        for (int j = 0; j < 4; ++j) {
            stage[gid * 16 + 4 * j + t4] = pack_bf16(acc[m][j][0], acc[m][j][1]);
            stage[(gid + 8) * 16 + 4 * j + t4] = pack_bf16(acc[m][j][2], acc[m][j][3]);
        }
        __syncwarp();
        const unsigned valid = min(16u, pixels - mt * 16) * 4; // 16-byte chunks: 4 per pixel
        for (unsigned e = lane; e < valid; e += 32)
            *reinterpret_cast<uint4*>(y + std::uint64_t{mt * 16 + e / 4} * g.s.cout + (e % 4) * 8) =
                reinterpret_cast<const uint4*>(stage)[e];
        __syncwarp();
    }
}

// Blocks stride over the pixel tiles with their 32 filters loaded once;
// blockIdx.y picks the output channels. The next tile's rows arrive while
// this one is multiplied (two buffers).
template <unsigned CIN>
__global__ void __launch_bounds__(threads) tc_conv_kernel(const bf16* x, const bf16* w, bf16* y, Geometry g) {
    extern __shared__ uint4 smem[];
    bf16* const xs0 = reinterpret_cast<bf16*>(smem);
    bf16* const xs1 = xs0 + g.x_elems;
    bf16* ws = xs1 + g.x_elems;
    auto* stage = reinterpret_cast<std::uint32_t*>(ws + g.w_elems) + (threadIdx.x / 32) * stage_words;
    const unsigned n0 = blockIdx.y * block_n;
    load_filters(w, g, n0, ws);
    // This tile's buffer, first pixel and pixel count, then the next one's
    // (plain variables swapped each round: indexed arrays went to local memory).
    std::uint64_t first = 0, next_first = 0;
    unsigned pixels = 0, next_pixels = 0;
    if (blockIdx.x < g.tiles) pixels = load_tile(x, g, blockIdx.x, xs0, first);
    cp_async_commit();
    bool odd = false;
    for (unsigned t = blockIdx.x; t < g.tiles; t += gridDim.x, odd = !odd) {
        if (t + gridDim.x < g.tiles) next_pixels = load_tile(x, g, t + gridDim.x, odd ? xs0 : xs1, next_first);
        cp_async_commit();
        cp_async_wait<1>(); // this tile's copies (and the filters) are done
        __syncthreads();
        multiply_tiles<CIN>(g, odd ? xs1 : xs0, ws, pixels, threadIdx.x / 32, y + first * g.s.cout + n0, stage);
        __syncthreads(); // every warp is done with this buffer before the copy into it starts
        pixels = next_pixels;
        first = next_first;
    }
}

template <unsigned CIN> unsigned blocks_x(const Geometry& g) {
    static std::once_flag once;
    std::call_once(once, [] {
        CUDA_CHECK(cudaFuncSetAttribute(tc_conv_kernel<CIN>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                        static_cast<int>(max_shared)));
    });
    int per_sm = 0;
    CUDA_CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, tc_conv_kernel<CIN>, threads, g.shared));
    const unsigned ny = g.s.cout / block_n;
    const std::uint64_t slots = std::uint64_t{sm_count()} * static_cast<unsigned>(std::max(1, per_sm));
    return static_cast<unsigned>(std::clamp<std::uint64_t>(slots / ny, 1, g.tiles));
}

template <unsigned CIN>
void launch_for(const void* x, const bf16* filters, void* y, const Geometry& g, cudaStream_t s) {
    const dim3 grid(blocks_x<CIN>(g), g.s.cout / block_n);
    tc_conv_kernel<CIN><<<grid, threads, g.shared, s>>>(static_cast<const bf16*>(x), filters, static_cast<bf16*>(y), g);
}

} // namespace

std::uint64_t tc_conv_scratch(const TcConvShape& s) {
    return s.data_gradient ? std::uint64_t{9} * s.cin * s.cout * sizeof(bf16) : 0;
}

bool tc_conv_supported(const TcConvShape& s) {
    if (s.n < 1 || s.h < 1 || s.w < 1 || s.w > max_width) return false;
    if (s.cin == 0 || s.cin % 16 != 0 || s.cin > max_cin || s.cout == 0 || s.cout % block_n != 0) return false;
    if (std::uint64_t{s.n} * s.h * s.w * std::max(s.cin, s.cout) >= narrow_limit) return false;
    return geometry_of(s).shared <= max_shared;
}

void launch_tc_conv(const void* x, const void* w, void* y, const TcConvShape& s, void* scratch, cudaStream_t stream) {
    const Geometry g = geometry_of(s);
    const auto* filters = static_cast<const bf16*>(w);
    if (s.data_gradient) {
        const unsigned total = 9 * s.cin * s.cout;
        turn_filters_kernel<<<(total + 255) / 256, 256, 0, stream>>>(filters, static_cast<bf16*>(scratch), s.cin,
                                                                     s.cout);
        CUDA_CHECK(cudaGetLastError());
        filters = static_cast<const bf16*>(scratch);
    }
    // tc_conv_supported: cin a multiple of 16 up to max_cin.
    with_constant<max_cin / 16>(s.cin / 16,
                                [&](auto c) { launch_for<16 * decltype(c)::value>(x, filters, y, g, stream); });
    CUDA_CHECK(cudaGetLastError());
}

} // namespace dstk::train::cuda
