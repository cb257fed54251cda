#pragma once
// The first convolution's tensor-core tiles (direct_conv.cu): whole output
// rows of one image, their input rows in shared memory, and the weight
// gradient's bf16 products over them. Shared with tc_conv.cu, whose data
// gradient of the convolution above can take the first convolution's weight
// gradient into its epilogue (TcConvFirstWgrad): the same products, in the
// same partials, from dy as that data gradient computes it.
#include <algorithm>

#include "device_common.cuh"
#include "direct_conv.hpp"

namespace dstk::train::cuda {

// A tile: tile_rows output rows of one image; its input rows (rows_in x
// cols_in pixels, the halo included) in shared memory.
struct TcParams {
    DirectConvShape s;
    unsigned tile_rows, tiles_per_image, rows_in, cols_in;
    Div32 dow;
};

inline TcParams tc_params_with_rows(const DirectConvShape& s, unsigned tile_rows) {
    TcParams p{};
    p.s = s;
    p.tile_rows = std::max(1u, std::min(s.oh, tile_rows));
    p.tiles_per_image = (s.oh + p.tile_rows - 1) / p.tile_rows;
    p.rows_in = p.tile_rows + 2;
    p.cols_in = s.ow + 2;
    p.dow = Div32(s.ow);
    return p;
}

// f(e, src) for each of the input pixels (their first four channels: 8
// bytes in bf16, 16 in float) under the output rows from oy0 of image img:
// rows_in x cols_in, the block's threads in turn; src null outside the image.
template <class T, class F>
__device__ __forceinline__ void for_input_pixels(const T* x, const TcParams& p, unsigned img, unsigned oy0, F&& f) {
    const int iy0 = static_cast<int>(oy0) - static_cast<int>(p.s.pad);
    for (unsigned e = threadIdx.x; e < p.rows_in * p.cols_in; e += blockDim.x) {
        const unsigned ry = e / p.cols_in, rx = e - ry * p.cols_in;
        const int iy = iy0 + static_cast<int>(ry), ix = static_cast<int>(rx) - static_cast<int>(p.s.pad);
        const bool in = iy >= 0 && iy < static_cast<int>(p.s.h) && ix >= 0 && ix < static_cast<int>(p.s.w);
        f(e, in ? x + ((std::uint64_t{img} * p.s.h + iy) * p.s.w + ix) * p.s.cstride : nullptr);
    }
}

// Those pixels into xs, zero outside the image.
__device__ __forceinline__ void load_input_pixels(const bf16* x, const TcParams& p, unsigned img, unsigned oy0,
                                                  uint2* xs) {
    for_input_pixels(x, p, img, oy0, [&](unsigned e, const bf16* src) {
        xs[e] = src ? *reinterpret_cast<const uint2*>(src) : make_uint2(0u, 0u);
    });
}

// The same, copied asynchronously (cp.async): the caller waits for its
// group. Floats come as they are stored (c of them, zero after), not rounded
// to TF32: tcw_products_tf32 rounds them as it reads them.
__device__ __forceinline__ void copy_input_pixels(const bf16* x, const TcParams& p, unsigned img, unsigned oy0,
                                                  uint2* xs) {
    for_input_pixels(x, p, img, oy0,
                     [&](unsigned e, const bf16* src) { cp_async8(xs + e, src ? src : x, src != nullptr); });
}
__device__ __forceinline__ void copy_input_pixels(const float* x, const TcParams& p, unsigned img, unsigned oy0,
                                                  uint4* xs) {
    for_input_pixels(x, p, img, oy0, [&](unsigned e, const float* src) {
        auto* dst = reinterpret_cast<float*>(xs + e);
        for (unsigned c = 0; c < 4; ++c) cp_async4(dst + c, src && c < p.s.c ? src + c : x, src && c < p.s.c);
    });
}

// Tile pixel q's top-left tap in the input tile; pixels past the tile's last
// read that one instead (their rows of the MMA are computed, not stored, or
// their gradients are zero).
__device__ __forceinline__ unsigned tile_pixel_base(const TcParams& p, unsigned q, unsigned pixels) {
    q = min(q, pixels - 1);
    const unsigned y = p.dow.div(q);
    return y * p.cols_in + (q - y * p.s.ow);
}

// The weight gradient's columns: the 9 taps x 4 input channels in five n8
// tiles (two taps each; the tenth tap's first channel, with Sums, a column of
// ones that sums dy), rows the output channels (MT m16 tiles).
constexpr int tcw_ntiles = 5;
__device__ __forceinline__ void tcw_tap_of(int j, unsigned gid, unsigned cols_in, unsigned& tap, unsigned& off) {
    tap = 2 * j + gid / 4;
    off = (tap / 3) * cols_in + tap % 3;
}

// One bf16 k8 step: A (dy^T: MT m-tiles of output channels x 8 pixels) as
// loaded by the caller, B two pixels to a register: tile pixels qa and qb
// (this lane's k slots) under each tap, from the input tile xs.
template <int MT, bool Sums>
__device__ __forceinline__ void tcw_products_bf16(const std::uint32_t (&a)[MT][2], const uint2* xs, const TcParams& p,
                                                  unsigned qa, unsigned qb, unsigned pixels,
                                                  float (&acc)[MT][tcw_ntiles][4]) {
    const unsigned gid = threadIdx.x % 32 / 4, c = gid % 4;
    const auto* xh = reinterpret_cast<const unsigned short*>(xs);
    const unsigned ba = tile_pixel_base(p, qa, pixels), bb = tile_pixel_base(p, qb, pixels);
    const std::uint32_t one = Sums && c == 0 ? 0x3f803f80u : 0u; // two bf16 ones
#pragma unroll
    for (int j = 0; j < tcw_ntiles; ++j) {
        unsigned tap, off;
        tcw_tap_of(j, gid, p.cols_in, tap, off);
        const std::uint32_t b = tap < 9 ? xh[(ba + off) * 4 + c] | (std::uint32_t{xh[(bb + off) * 4 + c]} << 16) : one;
#pragma unroll
        for (int m = 0; m < MT; ++m) mma_bf16(acc[m][j], a[m][0], a[m][1], b);
    }
}

// One tf32 k8 step: A (dy^T: MT m-tiles of output channels x 8 pixels, rows
// gid and gid + 8 of pixels qa = t4 and qb = t4 + 4 of the step) as loaded by
// the caller, B those two pixels under each tap from the input tile xs (four
// floats a pixel), rounded to TF32 here where Round (else as xs holds them).
template <int MT, bool Sums, bool Round>
__device__ __forceinline__ void tcw_products_tf32(const std::uint32_t (&a)[MT][4], const uint4* xs, const TcParams& p,
                                                  unsigned qa, unsigned qb, unsigned pixels,
                                                  float (&acc)[MT][tcw_ntiles][4]) {
    const unsigned gid = threadIdx.x % 32 / 4, c = gid % 4;
    const auto* xw = reinterpret_cast<const std::uint32_t*>(xs);
    const unsigned ba = tile_pixel_base(p, qa, pixels), bb = tile_pixel_base(p, qb, pixels);
    const std::uint32_t one = Sums && c == 0 ? 0x3f800000u : 0u; // 1.0f
    const auto word = [&](unsigned at) { return Round ? to_tf32(__uint_as_float(xw[at])) : xw[at]; };
#pragma unroll
    for (int j = 0; j < tcw_ntiles; ++j) {
        unsigned tap, off;
        tcw_tap_of(j, gid, p.cols_in, tap, off);
        const std::uint32_t b0 = tap < 9 ? word((ba + off) * 4 + c) : one;
        const std::uint32_t b1 = tap < 9 ? word((bb + off) * 4 + c) : one;
#pragma unroll
        for (int m = 0; m < MT; ++m) mma_tf32_k8(acc[m][j], a[m], b0, b1);
    }
}

// Floats in one block's row of the first convolution's weight-gradient
// partials (write_tcw_partials; c input, k output channels): the k x c x 9
// products, then, with a batch norm taken in (sums), each channel's sum of dy.
constexpr unsigned tcw_partials_row(unsigned c, unsigned k, bool sums) {
    return 9 * c * k + (sums ? k : 0);
}

// The block's sums of every warp's acc (Warps warps, in a fixed order), as
// its row of partials: dw's KCRS (C input channels, K = 16 MT outputs), then
// with Sums the K sums of dy. red: shared memory for block_sum_warps's slots
// and the block's [K][40] sums. Every thread of the block calls it.
template <unsigned Warps, int MT, bool Sums>
__device__ void write_tcw_partials(const float (&acc)[MT][tcw_ntiles][4], float* red, unsigned C, float* row) {
    constexpr int K = 16 * MT, V = MT * tcw_ntiles * 4;
    constexpr unsigned cols = 8 * tcw_ntiles;
    const unsigned lane = threadIdx.x % 32, gid = lane / 4, t4 = lane % 4;
    float v[V];
#pragma unroll
    for (int i = 0; i < V; ++i) v[i] = acc[i / (tcw_ntiles * 4)][i / 4 % tcw_ntiles][i % 4];
    block_sum_warps<Warps>(v, red);
    if (threadIdx.x / 32 == 0)
#pragma unroll
        for (int i = 0; i < V; ++i) {
            const int m = i / (tcw_ntiles * 4), j = i / 4 % tcw_ntiles, e = i % 4;
            red[(16 * m + gid + (e >= 2 ? 8 : 0)) * cols + 8 * j + 2 * t4 + (e & 1)] = v[i];
        }
    __syncthreads();
    const unsigned kw = 9 * C * K, stride = tcw_partials_row(C, K, Sums);
    for (unsigned e = threadIdx.x; e < stride; e += blockDim.x) {
        const unsigned k = e / (9 * C), c = (e / 9) % C, tap = e % 9;
        row[e] = e < kw ? red[k * cols + tap * 4 + c] : red[(e - kw) * cols + 36];
    }
}

// Shared memory write_tcw_partials takes (bytes).
constexpr unsigned tcw_partials_shared(unsigned warps, unsigned mt) {
    const unsigned slots = warps / 2 * mt * tcw_ntiles * 4 * 32, sums = 16 * mt * 8 * tcw_ntiles;
    return (slots > sums ? slots : sums) * 4;
}

} // namespace dstk::train::cuda
