#include "direct_conv.hpp"

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <type_traits>

#include "dstk/env.hpp"
#include "cuda_check.hpp"
#include "device_common.cuh"
#include "elementwise.hpp"
#include "first_bn.hpp"
#include "first_conv_tiles.cuh"
#include "launch_common.cuh"

namespace dstk::train::cuda {
namespace {

constexpr unsigned block_target = 256; // threads per block, at most
constexpr unsigned tile_groups = 32;   // pixel groups per tile, about
constexpr unsigned max_tile_pixels = 2048;
constexpr unsigned blocks_per_sm = 4; // the weight-gradient grid
constexpr int px = 4;                 // output pixels per thread, along a row

// Launch geometry. Threads: one output channel each (k = t % K in NHWC, where
// a warp then shares its pixels and reads the tile by broadcast; t / lanes in
// NCHW, where a warp's stores then run along rows), `lanes` threads per
// channel walking the tile's groups of px pixels along a row. A tile:
// `tile_rows` output rows of one image, whose input rows (zero outside the
// image and past its last column) sit in shared memory as float4 pixels, the
// channels in .x to .w: 3 rows x (px + 2) 16-byte loads give a thread px x 27
// products (stride 1), where one 4-byte load per product left the kernels
// bound by shared-memory instructions.
struct Params {
    DirectConvShape s;
    unsigned threads, lanes, tile_rows, tiles_per_image, rows_in, cols_in, groups_per_row;
    Div32 dgroups, dcols;
};

Params params_of(const DirectConvShape& s) {
    Params p{};
    p.s = s;
    p.lanes = std::max(1u, block_target / std::max(1u, s.k));
    p.threads = s.k * p.lanes;
    p.groups_per_row = (s.ow + px - 1) / px;
    p.cols_in = (p.groups_per_row * px - 1) * s.stride + s.kernel;
    unsigned tr = std::min(std::max(1u, tile_groups / p.groups_per_row), std::max(1u, s.oh));
    while (tr > 1 && ((tr - 1) * s.stride + s.kernel) * p.cols_in > max_tile_pixels) --tr;
    p.tile_rows = tr;
    p.rows_in = (tr - 1) * s.stride + s.kernel;
    p.tiles_per_image = (s.oh + tr - 1) / tr;
    p.dgroups = Div32(p.groups_per_row);
    p.dcols = Div32(p.cols_in);
    return p;
}

unsigned wgrad_blocks(const Params& p) {
    const std::uint64_t tiles = std::uint64_t{p.s.n} * p.tiles_per_image;
    return static_cast<unsigned>(std::min<std::uint64_t>(tiles, std::uint64_t{sm_count()} * blocks_per_sm));
}

__device__ __forceinline__ unsigned channel_of(const Params& p) {
    return p.s.nchw ? threadIdx.x / p.lanes : threadIdx.x % p.s.k;
}
__device__ __forceinline__ unsigned lane_of(const Params& p) {
    return p.s.nchw ? threadIdx.x % p.lanes : threadIdx.x / p.s.k;
}
__device__ __forceinline__ std::uint64_t out_index(const Params& p, unsigned img, unsigned k, unsigned oy,
                                                   unsigned ox) {
    return p.s.nchw ? ((std::uint64_t{img} * p.s.k + k) * p.s.oh + oy) * p.s.ow + ox
                    : ((std::uint64_t{img} * p.s.oh + oy) * p.s.ow + ox) * p.s.k + k;
}
// Channel c of a tile pixel (c a constant in the unrolled loops).
__device__ __forceinline__ float channel(const float4& v, int c) {
    return c == 0 ? v.x : c == 1 ? v.y : c == 2 ? v.z : v.w;
}

// The input rows of the tile starting at output row oy0 of image img.
template <class T, int C>
__device__ void load_tile(const T* x, const Params& p, unsigned img, unsigned oy0, float4* tile) {
    const int iy0 = static_cast<int>(oy0 * p.s.stride) - static_cast<int>(p.s.pad);
    const unsigned total = p.rows_in * p.cols_in;
    for (unsigned e = threadIdx.x; e < total; e += blockDim.x) {
        const unsigned ry = p.dcols.div(e), rx = e - ry * p.cols_in;
        const int iy = iy0 + static_cast<int>(ry), ix = static_cast<int>(rx) - static_cast<int>(p.s.pad);
        float v[4] = {0.0f, 0.0f, 0.0f, 0.0f};
        if (iy >= 0 && iy < static_cast<int>(p.s.h) && ix >= 0 && ix < static_cast<int>(p.s.w)) {
#pragma unroll
            for (int c = 0; c < C; ++c)
                v[c] = ld(x, p.s.nchw ? ((std::uint64_t{img} * p.s.cstride + c) * p.s.h + iy) * p.s.w + ix
                                      : ((std::uint64_t{img} * p.s.h + iy) * p.s.w + ix) * p.s.cstride + c);
        }
        tile[e] = make_float4(v[0], v[1], v[2], v[3]);
    }
}

// Input pixels a thread's px outputs read from one tile row.
template <int ST> constexpr int span = (px - 1) * ST + 3;
template <int ST> __device__ __forceinline__ void load_span(const float4* row, float4 (&v)[span<ST>]) {
#pragma unroll
    for (int j = 0; j < span<ST>; ++j) v[j] = row[j];
}

template <class T, int C, int ST>
__global__ void __launch_bounds__(block_target)
    direct_conv_forward_kernel(const T* x, const float* wt, T* y, Params p) {
    extern __shared__ float4 tile[];
    const unsigned k = channel_of(p), lane = lane_of(p);
    float w[3][3][C];
#pragma unroll
    for (int c = 0; c < C; ++c)
#pragma unroll
        for (int r = 0; r < 3; ++r)
#pragma unroll
            for (int s = 0; s < 3; ++s) w[r][s][c] = wt[((k * C + c) * 3 + r) * 3 + s];
    const unsigned img = blockIdx.x / p.tiles_per_image;
    const unsigned oy0 = (blockIdx.x - img * p.tiles_per_image) * p.tile_rows;
    load_tile<T, C>(x, p, img, oy0, tile);
    __syncthreads();
    const unsigned groups = min(p.tile_rows, p.s.oh - oy0) * p.groups_per_row;
    for (unsigned q = lane; q < groups; q += p.lanes) {
        const unsigned ty = p.dgroups.div(q), ox0 = (q - ty * p.groups_per_row) * px;
        float acc[px] = {};
#pragma unroll
        for (int r = 0; r < 3; ++r) {
            float4 v[span<ST>];
            load_span<ST>(tile + (ty * ST + r) * p.cols_in + ox0 * ST, v);
#pragma unroll
            for (int o = 0; o < px; ++o)
#pragma unroll
                for (int s = 0; s < 3; ++s)
#pragma unroll
                    for (int c = 0; c < C; ++c) {
                        const float4& u = v[o * ST + s];
                        const float in = channel(u, c);
                        acc[o] = fmaf(w[r][s][c], in, acc[o]);
                    }
        }
#pragma unroll
        for (int o = 0; o < px; ++o)
            if (ox0 + o < p.s.ow) st(y, out_index(p, img, k, oy0 + ty, ox0 + o), acc[o]);
    }
}

// Partial weight gradients of the tiles blockIdx.x, blockIdx.x + gridDim.x,
// ...: partials[block][k][c][r][s] (dw's layout).
template <class T, int C, int ST>
__global__ void __launch_bounds__(block_target)
    direct_conv_wgrad_kernel(const T* x, const T* dy, Params p, float* partials) {
    extern __shared__ float4 sh4[];
    constexpr int nw = 9 * C;
    const unsigned k = channel_of(p), lane = lane_of(p);
    float acc[3][3][C] = {};
    const unsigned tiles = p.s.n * p.tiles_per_image;
    for (unsigned t = blockIdx.x; t < tiles; t += gridDim.x) {
        const unsigned img = t / p.tiles_per_image, oy0 = (t - img * p.tiles_per_image) * p.tile_rows;
        __syncthreads(); // the previous tile's reads are done
        load_tile<T, C>(x, p, img, oy0, sh4);
        __syncthreads();
        const unsigned groups = min(p.tile_rows, p.s.oh - oy0) * p.groups_per_row;
        for (unsigned q = lane; q < groups; q += p.lanes) {
            const unsigned ty = p.dgroups.div(q), ox0 = (q - ty * p.groups_per_row) * px;
            float g[px];
#pragma unroll
            for (int o = 0; o < px; ++o)
                g[o] = ox0 + o < p.s.ow ? ld(dy, out_index(p, img, k, oy0 + ty, ox0 + o)) : 0.0f;
#pragma unroll
            for (int r = 0; r < 3; ++r) {
                float4 v[span<ST>];
                load_span<ST>(sh4 + (ty * ST + r) * p.cols_in + ox0 * ST, v);
#pragma unroll
                for (int o = 0; o < px; ++o)
#pragma unroll
                    for (int s = 0; s < 3; ++s)
#pragma unroll
                        for (int c = 0; c < C; ++c) {
                            const float4& u = v[o * ST + s];
                            const float in = channel(u, c);
                            acc[r][s][c] = fmaf(g[o], in, acc[r][s][c]);
                        }
            }
        }
    }
    // The block's sum over its lanes, per (j, k), in lane order.
    float* sh = reinterpret_cast<float*>(sh4);
    __syncthreads();
#pragma unroll
    for (int r = 0; r < 3; ++r)
#pragma unroll
        for (int s = 0; s < 3; ++s)
#pragma unroll
            for (int c = 0; c < C; ++c) sh[((r * 3 + s) * C + c) * blockDim.x + threadIdx.x] = acc[r][s][c];
    __syncthreads();
    const unsigned kw = p.s.k * nw;
    for (unsigned e = threadIdx.x; e < kw; e += blockDim.x) {
        const unsigned j = e / p.s.k, kk = e - j * p.s.k;
        float sum = 0.0f;
        for (unsigned l = 0; l < p.lanes; ++l)
            sum += sh[j * blockDim.x + (p.s.nchw ? kk * p.lanes + l : l * p.s.k + kk)];
        const unsigned rs = j / C, c = j - rs * C; // j = (r * 3 + s) * C + c; partials in dw's KCRS order
        partials[std::uint64_t{blockIdx.x} * kw + (kk * C + c) * 9 + rs] = sum;
    }
}

// ---- forward on tensor cores (bf16, NHWC, stride 1) ----
// The same product as a GEMM: rows the output pixels, columns the output
// channels, the reduction 9 taps x 4 channels (the input's first four stored
// channels; weights of channels past c zero) in five k8 steps of two taps
// each (the tenth tap zero). The
// layer moves little data for its arithmetic on CUDA cores (27 products per
// output); on tensor cores it is bound by writing its output. Weights are
// rounded to bf16, as cuDNN's bf16 convolutions round theirs.
constexpr unsigned tc_warps = 4, tc_threads = tc_warps * 32;
constexpr unsigned tc_tile_pixels = 256; // output pixels per block, about: whole rows of one image
constexpr int tc_ksteps = 5;
constexpr unsigned tc_max_k = 64;
constexpr std::uint64_t tc_max_shared = 48 * 1024;

TcParams tc_params_of(const DirectConvShape& s) {
    return tc_params_with_rows(s, tc_tile_pixels / std::max(1u, s.ow));
}

// The input tile's 8-byte pixels, rounded up to keep the staging rows after it 16-byte aligned.
__host__ __device__ unsigned tc_tile_words(const TcParams& p) {
    return (p.rows_in * p.cols_in + 1) / 2 * 2;
}

// The input tile, then each warp's staging rows for its outputs (16 pixels x k bf16).
std::uint64_t tc_forward_shared(const TcParams& p) {
    return std::uint64_t{tc_tile_words(p)} * sizeof(uint2) + std::uint64_t{tc_warps} * 16 * p.s.k * sizeof(bf16);
}

// The TF32 kernel's: the input tile as 16-byte pixels, then each warp's
// staging rows (16 pixels x k floats, padded by 4 against bank conflicts).
__host__ __device__ unsigned tc_tf32_row_floats(const TcParams& p) {
    return p.s.k + 4;
}
std::uint64_t tc_forward_tf32_shared(const TcParams& p) {
    return std::uint64_t{p.rows_in} * p.cols_in * sizeof(uint4) +
           std::uint64_t{tc_warps} * 16 * tc_tf32_row_floats(p) * sizeof(float);
}

// bf16 (input channels padded to a multiple of 4), or fp32 where the
// precision is tf32 (any stride of at most 4 channels).
bool tc_forward_applies(ActType t, const DirectConvShape& s) {
    if (env_off("DSTK_FIRST_CONV_TC")) return false;
    const bool bf = t == ActType::bf16 && s.cstride % 4 == 0, tf = t == ActType::f32 && s.tf32;
    if (!(bf || tf) || s.nchw || s.c > 4 || s.stride != 1 || s.kernel != 3) return false;
    if (s.k % 8 != 0 || s.k > tc_max_k || s.oh != s.h + 2 * s.pad - 2 || s.ow != s.w + 2 * s.pad - 2) return false;
    const TcParams p = tc_params_of(s);
    const std::uint64_t shared = bf ? tc_forward_shared(p) : tc_forward_tf32_shared(p);
    return shared <= tc_max_shared && std::uint64_t{s.n} * s.oh * s.ow * s.k < narrow_limit;
}

// The batch norm of BnApply as y = v a + b (a = gamma * invstd, b = beta -
// mean * a), then its ReLU, per channel; the coefficients in shared memory
// (pair q: channels 2 q and 2 q + 1), written before the kernel's first
// barrier, so that the epilogue holds no registers for them.
struct EpilogueBn {
    const float4* pairs;
    bool on, relu;
    __device__ EpilogueBn(const BnApply& bn, float4* shared, unsigned k)
        : pairs(shared), on(bn.gamma != nullptr), relu(bn.relu) {
        if (!on) return;
        for (unsigned q = threadIdx.x; q < k / 2; q += blockDim.x) {
            float ab[4];
#pragma unroll
            for (int h = 0; h < 2; ++h) {
                const unsigned c = 2 * q + h;
                ab[2 * h] = bn.gamma[c] * bn.invstd[c];
                ab[2 * h + 1] = bn.beta[c] - bn.mean[c] * ab[2 * h];
            }
            shared[q] = make_float4(ab[0], ab[1], ab[2], ab[3]);
        }
    }
    // Channels 2 q and 2 q + 1.
    __device__ float2 operator()(float v0, float v1, unsigned q) const {
        if (!on) return make_float2(v0, v1);
        const float4 c = pairs[q];
        const float o0 = fmaf(v0, c.x, c.y), o1 = fmaf(v1, c.z, c.w);
        return relu ? make_float2(fmaxf(o0, 0.0f), fmaxf(o1, 0.0f)) : make_float2(o0, o1);
    }
};

// Block: tile_rows output rows of one image; warp w takes the 16-pixel row
// tiles w, w + 4, ... Fragments (gid = lane / 4, t4 = lane % 4): A rows gid
// and gid + 8 are two output pixels, its k slots 2 t4, 2 t4 + 1 of step s are
// tap 2 s + t4 / 2, channels (t4 % 2) * 2 + {0, 1}: one 32-bit word of the
// input pixel under that tap. B column gid of n-tile j is output channel
// 8 j + gid, in registers for the whole block.
template <int NT>
__global__ void __launch_bounds__(tc_threads)
    tc_forward_kernel(const bf16* x, const float* wt, bf16* y, TcParams p, BnApply bn) {
    extern __shared__ uint2 px4[]; // rows_in x cols_in input pixels, their first 4 channels; then the staging rows
    const unsigned lane = threadIdx.x % 32, warp = threadIdx.x / 32, gid = lane / 4, t4 = lane % 4;
    const unsigned C = p.s.c;
    std::uint32_t b[tc_ksteps][NT];
#pragma unroll
    for (int s = 0; s < tc_ksteps; ++s) {
        const unsigned tap = 2 * s + t4 / 2, c0 = (t4 % 2) * 2;
#pragma unroll
        for (int j = 0; j < NT; ++j) {
            const unsigned n = 8 * j + gid;
            const float w0 = tap < 9 && c0 < C ? wt[(n * C + c0) * 9 + tap] : 0.0f;
            const float w1 = tap < 9 && c0 + 1 < C ? wt[(n * C + c0 + 1) * 9 + tap] : 0.0f;
            b[s][j] = pack_bf16(w0, w1);
        }
    }
    __shared__ float4 bn_pairs[tc_max_k / 2];
    const EpilogueBn ep(bn, bn_pairs, p.s.k);
    const unsigned img = blockIdx.x / p.tiles_per_image;
    const unsigned oy0 = (blockIdx.x - img * p.tiles_per_image) * p.tile_rows;
    load_input_pixels(x, p, img, oy0, px4);
    __syncthreads();
    const auto* words = reinterpret_cast<const std::uint32_t*>(px4);
    auto* stage = reinterpret_cast<std::uint32_t*>(px4 + tc_tile_words(p));
    const unsigned pixels = min(p.tile_rows, p.s.oh - oy0) * p.s.ow, mtiles = (pixels + 15) / 16;
    bf16* out = y + (std::uint64_t{img} * p.s.oh + oy0) * p.s.ow * p.s.k;
    for (unsigned m = warp; m < mtiles; m += tc_warps) {
        const unsigned base0 = tile_pixel_base(p, m * 16 + gid, pixels),
                       base1 = tile_pixel_base(p, m * 16 + gid + 8, pixels);
        float d[NT][4] = {};
#pragma unroll
        for (int s = 0; s < tc_ksteps; ++s) {
            const unsigned tap = 2 * s + t4 / 2;
            const unsigned off = (tap / 3) * p.cols_in + tap % 3;
            const std::uint32_t a0 = tap < 9 ? words[(base0 + off) * 2 + t4 % 2] : 0u;
            const std::uint32_t a1 = tap < 9 ? words[(base1 + off) * 2 + t4 % 2] : 0u;
#pragma unroll
            for (int j = 0; j < NT; ++j) mma_bf16(d[j], a0, a1, b[s][j]);
        }
        // Through the warp's staging rows to 16-byte stores of whole pixels:
        // the fragments' 4-byte pieces, stored directly, left half of every
        // written sector to a second store.
        std::uint32_t* rows = stage + warp * 16 * 4 * NT; // 16 pixels x 8 NT bf16
#pragma unroll
        for (int j = 0; j < NT; ++j) {
            const float2 lo = ep(d[j][0], d[j][1], 4 * j + t4), hi = ep(d[j][2], d[j][3], 4 * j + t4);
            rows[gid * 4 * NT + 4 * j + t4] = pack_bf16(lo.x, lo.y);
            rows[(gid + 8) * 4 * NT + 4 * j + t4] = pack_bf16(hi.x, hi.y);
        }
        __syncwarp();
        const unsigned valid = min(16u, pixels - m * 16) * NT; // 16-byte chunks of this tile's pixels
        uint4* dst = reinterpret_cast<uint4*>(out + std::uint64_t{m} * 16 * p.s.k);
        for (unsigned e = lane; e < valid; e += 32) dst[e] = reinterpret_cast<const uint4*>(rows)[e];
        __syncwarp();
    }
}

// ---- the same forward in 3xTF32 (fp32 activations, the tf32 precision) ----
// m16n8k4: one k4 step per tap, its four slots the input's first four
// channels (zero past c), nine steps. Each fp32 operand is split into a TF32
// value and the TF32 rounding of its remainder, and a product is taken as
// hi*hi + hi*lo + lo*hi: about fp32's accuracy, as the CUDA-core kernel has.
// A single TF32 product here moved the gradients of a first layer followed by
// batch norm at small batches by several percent (the normalisation divides
// by the batch's spread, which the rounding shifts). The layer stays bound by
// writing its output, so the two extra products cost little.
// Round: each value rounded to TF32 (to nearest), for a single-product kernel.
template <bool Round = false>
__device__ void load_input_pixels(const float* x, const TcParams& p, unsigned img, unsigned oy0, uint4* xs) {
    const int iy0 = static_cast<int>(oy0) - static_cast<int>(p.s.pad);
    const unsigned c = p.s.c;
    for (unsigned e = threadIdx.x; e < p.rows_in * p.cols_in; e += blockDim.x) {
        const unsigned ry = e / p.cols_in, rx = e - ry * p.cols_in;
        const int iy = iy0 + static_cast<int>(ry), ix = static_cast<int>(rx) - static_cast<int>(p.s.pad);
        float4 v = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
        if (iy >= 0 && iy < static_cast<int>(p.s.h) && ix >= 0 && ix < static_cast<int>(p.s.w)) {
            const float* src = x + ((std::uint64_t{img} * p.s.h + iy) * p.s.w + ix) * p.s.cstride;
            v = make_float4(src[0], c > 1 ? src[1] : 0.0f, c > 2 ? src[2] : 0.0f, c > 3 ? src[3] : 0.0f);
        }
        xs[e] = Round ? to_tf32(*reinterpret_cast<const uint4*>(&v)) : *reinterpret_cast<const uint4*>(&v);
    }
}

// An fp32 value as TF32 hi + lo.
struct SplitTf32 {
    std::uint32_t hi, lo;
};
__device__ __forceinline__ SplitTf32 split_tf32(float v) {
    const std::uint32_t hi = to_tf32(v);
    return {hi, to_tf32(v - __uint_as_float(hi))};
}

// Fragments (m16n8k4): A rows gid and gid + 8 are two output pixels, k slot
// t4 channel t4 under the step's tap; B row t4 of column gid the weight of
// output channel 8 j + gid, channel t4, that tap.
template <int NT>
__global__ void __launch_bounds__(tc_threads)
    tc_forward_tf32_kernel(const float* x, const float* wt, float* y, TcParams p, BnApply bn) {
    extern __shared__ uint4 px16[]; // rows_in x cols_in input pixels (fp32); then the staging rows
    const unsigned lane = threadIdx.x % 32, warp = threadIdx.x / 32, gid = lane / 4, t4 = lane % 4;
    const unsigned C = p.s.c, row = tc_tf32_row_floats(p);
    SplitTf32 b[9][NT];
#pragma unroll
    for (int tap = 0; tap < 9; ++tap)
#pragma unroll
        for (int j = 0; j < NT; ++j) b[tap][j] = split_tf32(t4 < C ? wt[((8 * j + gid) * C + t4) * 9 + tap] : 0.0f);
    __shared__ float4 bn_pairs[tc_max_k / 2];
    const EpilogueBn ep(bn, bn_pairs, p.s.k);
    const unsigned img = blockIdx.x / p.tiles_per_image;
    const unsigned oy0 = (blockIdx.x - img * p.tiles_per_image) * p.tile_rows;
    load_input_pixels(x, p, img, oy0, px16);
    __syncthreads();
    const auto* words = reinterpret_cast<const std::uint32_t*>(px16);
    auto* stage = reinterpret_cast<float*>(px16 + p.rows_in * p.cols_in);
    const unsigned pixels = min(p.tile_rows, p.s.oh - oy0) * p.s.ow, mtiles = (pixels + 15) / 16;
    float* out = y + (std::uint64_t{img} * p.s.oh + oy0) * p.s.ow * p.s.k;
    for (unsigned m = warp; m < mtiles; m += tc_warps) {
        const unsigned base0 = tile_pixel_base(p, m * 16 + gid, pixels),
                       base1 = tile_pixel_base(p, m * 16 + gid + 8, pixels);
        float d[NT][4] = {};
#pragma unroll
        for (int tap = 0; tap < 9; ++tap) {
            const unsigned off = (tap / 3) * p.cols_in + tap % 3;
            const SplitTf32 a0 = split_tf32(__uint_as_float(words[(base0 + off) * 4 + t4]));
            const SplitTf32 a1 = split_tf32(__uint_as_float(words[(base1 + off) * 4 + t4]));
#pragma unroll
            for (int j = 0; j < NT; ++j) { // the small terms first
                mma_tf32(d[j], a0.lo, a1.lo, b[tap][j].hi);
                mma_tf32(d[j], a0.hi, a1.hi, b[tap][j].lo);
                mma_tf32(d[j], a0.hi, a1.hi, b[tap][j].hi);
            }
        }
        // Through the warp's staging rows to 16-byte stores of whole pixels.
        float* rows = stage + warp * 16 * row;
#pragma unroll
        for (int j = 0; j < NT; ++j) {
            *reinterpret_cast<float2*>(rows + gid * row + 8 * j + 2 * t4) = ep(d[j][0], d[j][1], 4 * j + t4);
            *reinterpret_cast<float2*>(rows + (gid + 8) * row + 8 * j + 2 * t4) = ep(d[j][2], d[j][3], 4 * j + t4);
        }
        __syncwarp();
        constexpr unsigned chunks = 2 * NT; // 16-byte chunks per pixel
        const unsigned valid = min(16u, pixels - m * 16) * chunks;
        uint4* dst = reinterpret_cast<uint4*>(out + std::uint64_t{m} * 16 * p.s.k);
        for (unsigned e = lane; e < valid; e += 32)
            dst[e] = *reinterpret_cast<const uint4*>(rows + (e / chunks) * row + (e % chunks) * 4);
        __syncwarp();
    }
}

void launch_tc_forward(const void* x, const float* w, void* y, ActType t, const DirectConvShape& s, const BnApply& bn,
                       cudaStream_t stream) {
    const TcParams p = tc_params_of(s);
    const unsigned blocks = s.n * p.tiles_per_image;
    const bool bf = t == ActType::bf16;
    const std::uint64_t shared = bf ? tc_forward_shared(p) : tc_forward_tf32_shared(p);
    auto go = [&](auto nt) {
        constexpr int NT = decltype(nt)::value;
        if (bf)
            plain_launch(tc_forward_kernel<NT>, blocks, tc_threads, shared, stream, static_cast<const bf16*>(x), w,
                         static_cast<bf16*>(y), p, bn);
        else
            plain_launch(tc_forward_tf32_kernel<NT>, blocks, tc_threads, shared, stream, static_cast<const float*>(x),
                         w, static_cast<float*>(y), p, bn);
    };
    with_constant<8>(s.k / 8, go); // tc_forward_applies: k a multiple of 8 up to 64
}

// ---- weight gradient on tensor cores (NHWC, stride 1, 32 or 64 output channels) ----
// dw as a GEMM reduced over the output pixels: rows the output channels,
// columns the 9 taps x 4 input channels (five n8 tiles, the last half
// empty), k8 steps of 8 pixels. A (dy, channels x pixels) comes from a
// shared-memory tile of the block's output pixels; B (the inputs under each
// tap) from the input tile. bf16: A through ldmatrix.trans, B two pixels to
// a register. tf32 (fp32 activations): m16n8k8 in TF32, every fragment a
// scalar load; dy and the inputs rounded to TF32 as they are staged (to
// nearest: dropping the low bits biases every term toward zero, and the sums
// run over the whole batch's pixels). One product, not the forward's three:
// a weight gradient's error stays in its own tensor, where cuDNN's TF32
// weight gradients leave theirs too. Blocks stride over the tiles and sum
// their warps in a fixed order into per-block partials, added up by
// sum_partials as for the CUDA-core kernel: the same result on every run.
constexpr unsigned tcw_warps = 8, tcw_threads = tcw_warps * 32, tcw_blocks_per_sm = 2;

bool tc_wgrad_applies(ActType t, const DirectConvShape& s) {
    return (t == ActType::bf16 || t == ActType::f32) && tc_forward_applies(t, s) && (s.k == 32 || s.k == 64);
}

unsigned tc_wgrad_blocks(const TcParams& p) {
    const std::uint64_t tiles = std::uint64_t{p.s.n} * p.tiles_per_image;
    return static_cast<unsigned>(std::min<std::uint64_t>(tiles, std::uint64_t{sm_count()} * tcw_blocks_per_sm));
}

// Output pixels of a tile, rounded up to whole k8 steps (the rows past the tile's pixels zero).
__host__ __device__ unsigned tc_tile_rows_padded(const TcParams& p) {
    return (p.tile_rows * p.s.ow + 7) / 8 * 8;
}

// A dy row of k channels in shared memory: `chunks` 16-byte chunks, at a
// stride of `stride` chunks. bf16 rows are swizzled (dy_chunk) for
// ldmatrix; fp32 rows padded by two chunks, so that the eight channels and
// four pixels of a fragment's scalar loads fall in distinct banks.
template <class T> struct DyRows {
    static constexpr bool bf = std::is_same_v<T, bf16>;
    unsigned chunks, stride;
    __host__ __device__ explicit DyRows(unsigned k) : chunks(k * sizeof(T) / 16), stride(chunks + (bf ? 0 : 2)) {}
};

// The input tile's pixels: their first four channels, 8 bytes (bf16) or 16 (fp32).
template <class T> using InPixel = std::conditional_t<std::is_same_v<T, bf16>, uint2, uint4>;

// The tiles, or at the end block_sum_warps' slots, then the block's sums.
template <class T> std::uint64_t tc_wgrad_shared(const TcParams& p) {
    const std::uint64_t tiles = std::uint64_t{tc_tile_rows_padded(p)} * DyRows<T>(p.s.k).stride * 16 +
                                std::uint64_t{p.rows_in} * p.cols_in * sizeof(InPixel<T>);
    return std::max<std::uint64_t>(tiles, tcw_partials_shared(tcw_warps, p.s.k / 16));
}

// The 16-byte chunk q of dy's pixel row r in shared memory; bf16 swizzled so
// that the eight rows one ldmatrix reads fall in distinct banks (rows of 64 or 128 bytes).
template <class T, int CH> __device__ __forceinline__ unsigned dy_chunk(unsigned r, unsigned q) {
    if constexpr (std::is_same_v<T, bf16>)
        return r * CH + (q ^ (CH == 4 ? (r >> 1) & 3u : r & 7u));
    else
        return r * (CH + 2) + q;
}

// FirstBnIn as the kernels take it: the ReLU mask's source (null: none).
template <class T> struct MaskIn { const T* relu_out; };

// dy's chunk where relu_out's chunk m is positive, zero elsewhere.
template <class T> __device__ __forceinline__ uint4 masked(uint4 g, uint4 m) {
    std::uint32_t* gw = &g.x;
    const std::uint32_t* mw = &m.x;
#pragma unroll
    for (int h = 0; h < 4; ++h)
        gw[h] = std::is_same_v<T, bf16> ? relu_masked_bf16x2(gw[h], mw[h]) : relu_masked_f32(gw[h], mw[h]);
    return g;
}

// dy's chunk as the tile stores it: fp32 rounded to TF32.
template <class T> __device__ __forceinline__ uint4 staged(uint4 v) {
    if constexpr (std::is_same_v<T, bf16>)
        return v;
    else
        return to_tf32(v);
}

// Loads tile t's dy rows (zero past its pixels; masked by the ReLU's output
// where bn.relu_out) and input pixels; returns its pixel count.
template <class T, int CH>
__device__ unsigned tcw_load_tile(const T* x, const T* dy, const MaskIn<T>& bn, const TcParams& p, unsigned t,
                                  uint4* dys, InPixel<T>* xs) {
    const unsigned img = t / p.tiles_per_image, oy0 = (t - img * p.tiles_per_image) * p.tile_rows;
    const unsigned pixels = min(p.tile_rows, p.s.oh - oy0) * p.s.ow, padded = (pixels + 7) / 8 * 8;
    const std::uint64_t first = (std::uint64_t{img} * p.s.oh + oy0) * p.s.ow * p.s.k;
    const uint4* src = reinterpret_cast<const uint4*>(dy + first);
    const uint4* msrc = bn.relu_out ? reinterpret_cast<const uint4*>(bn.relu_out + first) : nullptr;
    const uint4 zero = make_uint4(0u, 0u, 0u, 0u);
    // Four loads in flight per thread before any store: one at a time left
    // the pass bound by latency, not bandwidth.
    constexpr unsigned batch = 4;
    for (unsigned e0 = threadIdx.x; e0 < padded * CH; e0 += batch * blockDim.x) {
        uint4 v[batch], m[batch];
#pragma unroll
        for (unsigned u = 0; u < batch; ++u) {
            const unsigned e = e0 + u * blockDim.x;
            v[u] = e < pixels * CH ? src[e] : zero;
            if (msrc) m[u] = e < pixels * CH ? msrc[e] : zero;
        }
#pragma unroll
        for (unsigned u = 0; u < batch; ++u) {
            const unsigned e = e0 + u * blockDim.x;
            if (msrc) v[u] = masked<T>(v[u], m[u]);
            if (e < padded * CH) dys[dy_chunk<T, CH>(e / CH, e % CH)] = staged<T>(v[u]);
        }
    }
    if constexpr (std::is_same_v<T, bf16>)
        load_input_pixels(x, p, img, oy0, xs);
    else
        load_input_pixels<true>(x, p, img, oy0, xs); // rounded to TF32 once, for every fragment that reads them
    return pixels;
}

// Tile t's dy rows (and the ReLU's output that masks them), on their way into
// L2 while the tile before is multiplied: the next tile's loads then wait on
// L2, not on memory (two blocks per SM leave little else to hide them).
template <class T> __device__ void tcw_prefetch_tile(const T* dy, const MaskIn<T>& bn, const TcParams& p, unsigned t) {
    const unsigned img = t / p.tiles_per_image, oy0 = (t - img * p.tiles_per_image) * p.tile_rows;
    const std::uint64_t first = (std::uint64_t{img} * p.s.oh + oy0) * p.s.ow * p.s.k;
    const std::uint64_t bytes = std::uint64_t{min(p.tile_rows, p.s.oh - oy0)} * p.s.ow * p.s.k * sizeof(T);
    for (std::uint64_t off = std::uint64_t{threadIdx.x} * 128; off < bytes; off += std::uint64_t{blockDim.x} * 128) {
        prefetch_l2(reinterpret_cast<const char*>(dy + first) + off);
        if (bn.relu_out) prefetch_l2(reinterpret_cast<const char*>(bn.relu_out + first) + off);
    }
}

// One k8 step of 8 pixels from ks * 8 (bf16: m16n8k8, A by ldmatrix.trans
// and B two pixels to a register; fp32: m16n8k8 TF32, A rows gid, gid + 8 of
// pixels t4 and t4 + 4, B those pixels under each tap). With Sums, the tenth
// tap's first channel is 1 under every pixel: that column sums dy (rows past
// the tile's pixels are zero).
template <class T, int CH, int MT, bool Sums>
__device__ __forceinline__ void tcw_step(const uint4* dys, const InPixel<T>* xs, const TcParams& p, unsigned ks,
                                         unsigned pixels, float (&acc)[MT][tcw_ntiles][4]) {
    const unsigned lane = threadIdx.x % 32, gid = lane / 4, t4 = lane % 4;
    if constexpr (std::is_same_v<T, bf16>) {
        const unsigned r = ks * 8 + lane % 8;
        std::uint32_t a[MT][2];
#pragma unroll
        for (int h = 0; h < MT / 2; ++h) {
            std::uint32_t v[4];
            ldmatrix_x4_trans(v, dys + dy_chunk<T, CH>(r, 4 * h + lane / 8));
            a[2 * h][0] = v[0], a[2 * h][1] = v[1], a[2 * h + 1][0] = v[2], a[2 * h + 1][1] = v[3];
        }
        tcw_products_bf16<MT, Sums>(a, xs, p, ks * 8 + 2 * t4, ks * 8 + 2 * t4 + 1, pixels, acc);
    } else {
        const auto* dw = reinterpret_cast<const std::uint32_t*>(dys);
        constexpr unsigned row = (CH + 2) * 4; // words per dy row
        const unsigned r0 = ks * 8 + t4;
        std::uint32_t a[MT][4];
#pragma unroll
        for (int m = 0; m < MT; ++m) {
            const unsigned k = 16 * m + gid;
            a[m][0] = dw[r0 * row + k], a[m][1] = dw[r0 * row + k + 8];
            a[m][2] = dw[(r0 + 4) * row + k], a[m][3] = dw[(r0 + 4) * row + k + 8];
        }
        tcw_products_tf32<MT, Sums, false>(a, xs, p, r0, r0 + 4, pixels, acc); // rounded as loaded
    }
}

// K output channels: CH 16-byte chunks per dy row, MT = K / 16 m-tiles. Each
// block's partials: dw's (KCRS), then with Sums (a batch norm taken in,
// first_bn.hpp) the K sums of dy. The block's sums by block_sum_warps, warp 0
// writing them to red ([k][40]) over the slots.
template <class T, int K, bool Sums>
__global__ void __launch_bounds__(tcw_threads)
    tc_wgrad_kernel(const T* x, const T* dy, TcParams p, float* partials, MaskIn<T> bn) {
    constexpr int CH = K * sizeof(T) / 16, MT = K / 16;
    extern __shared__ uint4 smem[];
    uint4* dys = smem;
    auto* xs = reinterpret_cast<InPixel<T>*>(smem + tc_tile_rows_padded(p) * DyRows<T>(K).stride);
    const unsigned warp = threadIdx.x / 32;
    float acc[MT][tcw_ntiles][4] = {};
    const unsigned tiles = p.s.n * p.tiles_per_image;
    for (unsigned t = blockIdx.x; t < tiles; t += gridDim.x) {
        __syncthreads(); // the previous tile's reads are done
        const unsigned pixels = tcw_load_tile<T, CH>(x, dy, bn, p, t, dys, xs);
        if (t + gridDim.x < tiles) tcw_prefetch_tile(dy, bn, p, t + gridDim.x);
        __syncthreads();
        for (unsigned ks = warp; ks * 8 < pixels; ks += tcw_warps)
            tcw_step<T, CH, MT, Sums>(dys, xs, p, ks, pixels, acc);
    }
    __syncthreads();
    write_tcw_partials<tcw_warps, MT, Sums>(acc, reinterpret_cast<float*>(smem), p.s.c,
                                            partials + std::uint64_t{blockIdx.x} * tcw_partials_row(p.s.c, K, Sums));
}

template <class T>
void launch_tc_wgrad_typed(const void* x, const void* dy, const TcParams& p, unsigned blocks, float* partials,
                           const FirstBnIn* bn, cudaStream_t stream) {
    const std::uint64_t shared = tc_wgrad_shared<T>(p);
    const MaskIn<T> b{bn ? static_cast<const T*>(bn->relu_out) : nullptr};
    auto go = [&](auto kernel) {
        if (shared > 48 * 1024)
            CUDA_CHECK(
                cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(shared)));
        plain_launch(kernel, blocks, tcw_threads, shared, stream, static_cast<const T*>(x), static_cast<const T*>(dy),
                     p, partials, b);
    };
    if (p.s.k == 32)
        bn ? go(tc_wgrad_kernel<T, 32, true>) : go(tc_wgrad_kernel<T, 32, false>);
    else
        bn ? go(tc_wgrad_kernel<T, 64, true>) : go(tc_wgrad_kernel<T, 64, false>);
}

// With bn, the sums (A, then S) go to the workspace after the partials and
// first_bn's combination writes dw.
void launch_tc_wgrad(const void* x, const void* dy, ActType t, const DirectConvShape& s, float* partials, float* dw,
                     const FirstBnIn* bn, cudaStream_t stream) {
    const TcParams p = tc_params_of(s);
    const unsigned blocks = tc_wgrad_blocks(p);
    if (t == ActType::bf16)
        launch_tc_wgrad_typed<bf16>(x, dy, p, blocks, partials, bn, stream);
    else
        launch_tc_wgrad_typed<float>(x, dy, p, blocks, partials, bn, stream);
    if (bn) {
        launch_first_wgrad_sums(partials, blocks, t, s, dw, *bn, stream);
        return;
    }
    launch_sum_partials(partials, blocks, std::uint64_t{9} * s.c * s.k, dw, ActType::f32, stream);
}

// Calls f with a null T*, an integral constant C and an integral constant stride.
template <class F> void dispatch(ActType t, const DirectConvShape& s, F&& f) {
    auto with_c = [&](auto tag) {
        auto with_stride = [&](auto c) {
            if (s.stride == 1)
                f(tag, c, std::integral_constant<int, 1>{});
            else
                f(tag, c, std::integral_constant<int, 2>{});
        };
        switch (s.c) {
        case 1:
            with_stride(std::integral_constant<int, 1>{});
            break;
        case 2:
            with_stride(std::integral_constant<int, 2>{});
            break;
        case 3:
            with_stride(std::integral_constant<int, 3>{});
            break;
        default:
            with_stride(std::integral_constant<int, 4>{});
            break;
        }
    };
    if (t == ActType::bf16)
        with_c(static_cast<bf16*>(nullptr));
    else
        with_c(static_cast<float*>(nullptr));
}

} // namespace

void launch_first_wgrad_sums(const float* partials, unsigned blocks, ActType t, const DirectConvShape& s, float* dw,
                             const FirstBnIn& bn, cudaStream_t stream) {
    launch_first_bn_backward(partials, blocks, tcw_partials_row(s.c, s.k, true), t, s, bn.b, dw, stream);
}

bool direct_conv_supported(const DirectConvShape& s) {
    if (s.kernel != 3 || s.c < 1 || s.c > 4 || s.k < 1 || s.k > block_target || s.pad > 2) return false;
    if (s.stride != 1 && s.stride != 2) return false;
    if (s.n < 1 || s.oh < 1 || s.ow < 1 || s.cstride < s.c || (s.nchw && s.cstride != s.c)) return false;
    if (s.ow > 0xffffu || s.oh > 0xffffu) return false;
    const Params p = params_of(s);
    return p.rows_in * p.cols_in <= max_tile_pixels && std::uint64_t{s.n} * p.tiles_per_image < 0x7fffffffu;
}

bool direct_conv_wgrad_takes_bn(ActType t, const DirectConvShape& s) {
    return tc_wgrad_applies(t, s);
}

std::uint64_t direct_conv_workspace(const DirectConvShape& s) {
    const Params p = params_of(s);
    const std::uint64_t blocks = std::max(wgrad_blocks(p), tc_wgrad_blocks(tc_params_of(s)));
    return blocks * std::uint64_t{tcw_partials_row(s.c, s.k, true)} * sizeof(float);
}

void launch_direct_conv_forward(const void* x, const float* w, void* y, ActType t, const DirectConvShape& s,
                                cudaStream_t stream, const BnApply* bn) {
    if (tc_forward_applies(t, s)) {
        launch_tc_forward(x, w, y, t, s, bn ? *bn : BnApply{}, stream);
        return;
    }
    if (bn) throw std::logic_error("a batch norm given to a forward convolution that cannot take it");
    const Params p = params_of(s);
    dispatch(t, s, [&](auto tag, auto c, auto st) {
        using T = std::remove_pointer_t<decltype(tag)>;
        plain_launch(direct_conv_forward_kernel<T, decltype(c)::value, decltype(st)::value>, s.n * p.tiles_per_image,
                     p.threads, p.rows_in * p.cols_in * sizeof(float4), stream, static_cast<const T*>(x), w,
                     static_cast<T*>(y), p);
    });
}

void launch_direct_conv_wgrad(const void* x, const void* dy, ActType t, const DirectConvShape& s, void* workspace,
                              float* dw, cudaStream_t stream, const FirstBnIn* bn) {
    if (tc_wgrad_applies(t, s)) {
        launch_tc_wgrad(x, dy, t, s, static_cast<float*>(workspace), dw, bn, stream);
        return;
    }
    if (bn) throw std::logic_error("a batch norm's backward pass given to a weight gradient that cannot take it");
    const Params p = params_of(s);
    const unsigned blocks = wgrad_blocks(p);
    auto* partials = static_cast<float*>(workspace);
    const std::uint64_t shared = std::max<std::uint64_t>(std::uint64_t{p.rows_in} * p.cols_in * sizeof(float4),
                                                         std::uint64_t{p.threads} * 9 * s.c * sizeof(float));
    dispatch(t, s, [&](auto tag, auto c, auto st) {
        using T = std::remove_pointer_t<decltype(tag)>;
        plain_launch(direct_conv_wgrad_kernel<T, decltype(c)::value, decltype(st)::value>, blocks, p.threads, shared,
                     stream, static_cast<const T*>(x), static_cast<const T*>(dy), p, partials);
    });
    const unsigned kw = 9 * s.c * s.k;
    launch_sum_partials(partials, blocks, kw, dw, ActType::f32, stream);
}

} // namespace dstk::train::cuda
