#include "direct_conv.hpp"

#include <algorithm>

#include "cuda_check.hpp"
#include "device_common.cuh"
#include "elementwise.hpp"

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

bool direct_conv_supported(const DirectConvShape& s) {
    if (s.kernel != 3 || s.c < 1 || s.c > 4 || s.k < 1 || s.k > block_target || s.pad > 2) return false;
    if (s.stride != 1 && s.stride != 2) return false;
    if (s.n < 1 || s.oh < 1 || s.ow < 1 || s.cstride < s.c || (s.nchw && s.cstride != s.c)) return false;
    if (s.ow > 0xffffu || s.oh > 0xffffu) return false;
    const Params p = params_of(s);
    return p.rows_in * p.cols_in <= max_tile_pixels && std::uint64_t{s.n} * p.tiles_per_image < 0x7fffffffu;
}

std::uint64_t direct_conv_workspace(const DirectConvShape& s) {
    const Params p = params_of(s);
    return std::uint64_t{wgrad_blocks(p)} * 9 * s.c * s.k * sizeof(float);
}

void launch_direct_conv_forward(const void* x, const float* w, void* y, ActType t, const DirectConvShape& s,
                                cudaStream_t stream) {
    const Params p = params_of(s);
    dispatch(t, s, [&](auto tag, auto c, auto st) {
        using T = std::remove_pointer_t<decltype(tag)>;
        direct_conv_forward_kernel<T, decltype(c)::value, decltype(st)::value>
            <<<s.n * p.tiles_per_image, p.threads, p.rows_in * p.cols_in * sizeof(float4), stream>>>(
                static_cast<const T*>(x), w, static_cast<T*>(y), p);
    });
    CUDA_CHECK(cudaGetLastError());
}

void launch_direct_conv_wgrad(const void* x, const void* dy, ActType t, const DirectConvShape& s, void* workspace,
                              float* dw, cudaStream_t stream) {
    const Params p = params_of(s);
    const unsigned blocks = wgrad_blocks(p);
    auto* partials = static_cast<float*>(workspace);
    const std::uint64_t shared = std::max<std::uint64_t>(std::uint64_t{p.rows_in} * p.cols_in * sizeof(float4),
                                                         std::uint64_t{p.threads} * 9 * s.c * sizeof(float));
    dispatch(t, s, [&](auto tag, auto c, auto st) {
        using T = std::remove_pointer_t<decltype(tag)>;
        direct_conv_wgrad_kernel<T, decltype(c)::value, decltype(st)::value>
            <<<blocks, p.threads, shared, stream>>>(static_cast<const T*>(x), static_cast<const T*>(dy), p, partials);
    });
    CUDA_CHECK(cudaGetLastError());
    const unsigned kw = 9 * s.c * s.k;
    launch_sum_partials(partials, blocks, kw, dw, ActType::f32, stream);
}

} // namespace dstk::train::cuda
