// The first batch norm's backward from the input's moments (first_bn.hpp).
#include "first_bn.hpp"

#include "elementwise.hpp"
#include "launch_common.cuh"

namespace dstk::train::cuda {
namespace {

constexpr unsigned taps = 9;
constexpr unsigned mom_warps = 8, mom_threads = mom_warps * 32;
constexpr unsigned mom_tile = mom_threads; // output pixels per tile: one patch row per thread

unsigned patch_values(const DirectConvShape& s) {
    return taps * s.c;
}

// Columns of the patch matrix: the K patch values, a one (its products are
// the sums), zeros to a multiple of 16.
unsigned moment_cols(const DirectConvShape& s) {
    return patch_values(s) + 1 <= 32 ? 32 : 48;
}

unsigned moments_blocks(const DirectConvShape& s) {
    const std::uint64_t tiles = (std::uint64_t{s.n} * s.oh * s.ow + mom_tile - 1) / mom_tile;
    return static_cast<unsigned>(std::min<std::uint64_t>(tiles, std::uint64_t{sm_count()} * 4));
}

// Shared memory: the tile's patch rows (KP + 8 bf16 each: rows 16 bytes apart
// mod 128, so an ldmatrix's eight rows fall in distinct banks), fp32 inputs
// as a high and a low bf16 part (two matrices).
template <class T, int KP> constexpr unsigned row_stride = KP + 8;
template <class T, int KP> constexpr unsigned patch_matrices = std::is_same_v<T, bf16> ? 1 : 2;
template <class T, int KP> std::uint64_t moments_shared() {
    const std::uint64_t rows = std::uint64_t{patch_matrices<T, KP>} * mom_tile * row_stride<T, KP> * sizeof(bf16);
    return std::max<std::uint64_t>(rows, std::uint64_t{KP} * KP * sizeof(float));
}

// Thread q's patch row of tile pixel `first + q` (zeros past the last pixel):
// x under its nine taps, channel-major as in the KCRS weights, then a one.
template <class T, int C, int KP>
__device__ void build_patch_row(const T* x, const DirectConvShape& s, Div32 dow, Div32 doh, unsigned pixel,
                                unsigned pixels, bf16* hi, bf16* lo) {
    constexpr unsigned K = taps * C;
    float v[KP] = {};
    if (pixel < pixels) {
        const unsigned row = dow.div(pixel), ox = pixel - row * s.ow, img = doh.div(row), oy = row - img * s.oh;
        const int iy0 = static_cast<int>(oy * s.stride) - static_cast<int>(s.pad);
        const int ix0 = static_cast<int>(ox * s.stride) - static_cast<int>(s.pad);
#pragma unroll
        for (int t = 0; t < static_cast<int>(taps); ++t) {
            const int iy = iy0 + t / 3, ix = ix0 + t % 3;
            if (iy < 0 || ix < 0 || iy >= static_cast<int>(s.h) || ix >= static_cast<int>(s.w)) continue;
            const std::uint64_t at = ((std::uint64_t{img} * s.h + iy) * s.w + ix) * s.cstride;
            if constexpr (std::is_same_v<T, bf16>) { // tc_forward_applies: channels stored in fours
                const uint2 q = *reinterpret_cast<const uint2*>(x + at);
                const float2 lo2 = __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(&q.x));
                const float2 hi2 = __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(&q.y));
                const float c4[4] = {lo2.x, lo2.y, hi2.x, hi2.y};
#pragma unroll
                for (int c = 0; c < C; ++c) v[c * taps + t] = c4[c];
            } else {
#pragma unroll
                for (int c = 0; c < C; ++c) v[c * taps + t] = ld(x, at + c);
            }
        }
        v[K] = 1.0f;
    }
#pragma unroll
    for (int j = 0; j < KP; j += 8) {
        std::uint32_t h[4], l[4];
#pragma unroll
        for (int e = 0; e < 4; ++e) {
            const bf16 h0 = __float2bfloat16(v[j + 2 * e]), h1 = __float2bfloat16(v[j + 2 * e + 1]);
            h[e] = pack_bf16(__bfloat162float(h0), __bfloat162float(h1));
            l[e] = pack_bf16(v[j + 2 * e] - __bfloat162float(h0), v[j + 2 * e + 1] - __bfloat162float(h1));
        }
        *reinterpret_cast<uint4*>(hi + j) = make_uint4(h[0], h[1], h[2], h[3]);
        if (lo) *reinterpret_cast<uint4*>(lo + j) = make_uint4(l[0], l[1], l[2], l[3]);
    }
}

// Per block: M = P^T P over its tiles' pixels, P the tiles' patch rows (KP
// columns, the last used one a one: M's column K holds the sums), on tensor
// cores in bf16: exact products of bf16 inputs; fp32 inputs as hi + lo
// (hi hi + hi lo + lo hi, the small terms first: about 16 bits of each).
// One ldmatrix.x4.trans of 16 columns x 16 pixels is at once the A fragment
// of those 16 rows of M and the B fragments of those 16 columns.
template <class T, int C, int KP>
__global__ void __launch_bounds__(mom_threads)
    first_bn_moments_kernel(const T* x, DirectConvShape s, Div32 dow, Div32 doh, float* partials) {
    await_predecessor();
    constexpr int MT = KP / 16, NT = KP / 8, RS = row_stride<T, KP>;
    constexpr bool split = patch_matrices<T, KP> == 2;
    extern __shared__ uint4 mom_smem[];
    auto* hi = reinterpret_cast<bf16*>(mom_smem);
    bf16* lo = split ? hi + mom_tile * RS : nullptr;
    const unsigned lane = threadIdx.x % 32, warp = threadIdx.x / 32, gid = lane / 4, t4 = lane % 4;
    const unsigned pixels = s.n * s.oh * s.ow; // first_bn_applies: below 2^31
    float acc[MT][NT][4] = {};
    for (unsigned first = blockIdx.x * mom_tile; first < pixels; first += gridDim.x * mom_tile) {
        __syncthreads(); // the previous tile's reads are done
        build_patch_row<T, C, KP>(x, s, dow, doh, first + threadIdx.x, pixels, hi + threadIdx.x * RS,
                                  split ? lo + threadIdx.x * RS : nullptr);
        __syncthreads();
        for (unsigned ks = warp; ks < mom_tile / 16; ks += mom_warps) {
            const unsigned row = ks * 16 + (lane / 16) * 8 + lane % 8, col = ((lane / 8) % 2) * 8;
            std::uint32_t h[MT][4], l[MT][4];
#pragma unroll
            for (int m = 0; m < MT; ++m) {
                ldmatrix_x4_trans(h[m], hi + row * RS + 16 * m + col);
                if constexpr (split) ldmatrix_x4_trans(l[m], lo + row * RS + 16 * m + col);
            }
#pragma unroll
            for (int m = 0; m < MT; ++m)
#pragma unroll
                for (int n = 0; n < NT; ++n) {
                    const int bm = n / 2, b0 = n % 2, b1 = 2 + n % 2; // n-tile n: matrices b0, b1 of block n / 2
                    if constexpr (split) {
                        mma_bf16_k16(acc[m][n], h[m], l[bm][b0], l[bm][b1]);
                        mma_bf16_k16(acc[m][n], l[m], h[bm][b0], h[bm][b1]);
                    }
                    mma_bf16_k16(acc[m][n], h[m], h[bm][b0], h[bm][b1]);
                }
        }
    }
    // The warps' sums in warp order into M (KP x KP), then the block's partials.
    __syncthreads();
    auto* red = reinterpret_cast<float*>(mom_smem);
    for (unsigned e = threadIdx.x; e < KP * KP; e += blockDim.x) red[e] = 0.0f;
    for (unsigned w = 0; w < mom_warps; ++w) {
        __syncthreads();
        if (warp != w) continue;
#pragma unroll
        for (int m = 0; m < MT; ++m)
#pragma unroll
            for (int n = 0; n < NT; ++n)
#pragma unroll
                for (int e = 0; e < 4; ++e)
                    red[(16 * m + gid + (e >= 2 ? 8 : 0)) * KP + 8 * n + 2 * t4 + (e & 1)] += acc[m][n][e];
    }
    __syncthreads();
    for (unsigned e = threadIdx.x; e < KP * KP; e += blockDim.x)
        partials[std::uint64_t{blockIdx.x} * KP * KP + e] = red[e];
}

// One block per output channel k, thread j one patch value (first_bn.hpp's formula).
__global__ void first_bn_backward_kernel(const float* sums, unsigned K, unsigned kp, unsigned kout, double count,
                                         bool bf16_weights, FirstBnBackward b, float* dw) {
    await_predecessor();
    constexpr unsigned max_k = 4 * taps;
    __shared__ double w[max_k], wa[max_k];
    const unsigned k = blockIdx.x, j = threadIdx.x;
    if (j < K) {
        const float wf = b.w[std::uint64_t{k} * K + j];
        w[j] = bf16_weights ? __bfloat162float(__float2bfloat16(wf)) : wf;
        wa[j] = w[j] * sums[std::uint64_t{k} * K + j];
    }
    __syncthreads();
    double w_a = 0.0; // w_k . A_k = sum_p g (y - 0), in index order
    for (unsigned i = 0; i < K; ++i) w_a += wa[i];
    const double sg = sums[std::uint64_t{kout} * K + k], mean = b.mean[k], is = b.invstd[k];
    const double sgy = w_a - mean * sg; // T
    if (j == 0) {
        b.dgamma[k] = static_cast<float>(is * sgy);
        b.dbeta[k] = static_cast<float>(sg);
    }
    if (j >= K) return;
    const float* m = b.moments + std::uint64_t{j} * kp; // row j: products with every column, then the sum
    double gw = 0.0;
    for (unsigned i = 0; i < K; ++i) gw += m[i] * w[i];
    const double sx = m[K];
    const double z = gw - mean * sx; // sum_p x_p[j] (y - mean)
    const double a = sums[std::uint64_t{k} * K + j];
    dw[std::uint64_t{k} * K + j] =
        static_cast<float>(b.gamma[k] * is * (a - sg / count * sx - is * is * sgy / count * z));
}

} // namespace

std::uint64_t first_bn_moments(const DirectConvShape& s) {
    return std::uint64_t{moment_cols(s)} * moment_cols(s);
}

std::uint64_t first_bn_moments_workspace(const DirectConvShape& s) {
    return std::uint64_t{moments_blocks(s)} * moment_cols(s) * moment_cols(s) * sizeof(float);
}

void launch_first_bn_moments(const void* x, ActType t, const DirectConvShape& s, void* workspace, float* moments,
                             cudaStream_t stream) {
    const unsigned blocks = moments_blocks(s), kp = moment_cols(s);
    auto* partials = static_cast<float*>(workspace);
    const Div32 dow(s.ow), doh(s.oh);
    auto go = [&](auto tag, auto c) {
        using T = std::remove_pointer_t<decltype(tag)>;
        constexpr int C = decltype(c)::value, KP = taps * C + 1 <= 32 ? 32 : 48;
        const std::uint64_t shared = moments_shared<T, KP>();
        if (shared > 48 * 1024)
            CUDA_CHECK(cudaFuncSetAttribute(first_bn_moments_kernel<T, C, KP>,
                                            cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(shared)));
        launch_kernel(first_bn_moments_kernel<T, C, KP>, blocks, mom_threads, shared, stream, static_cast<const T*>(x),
                      s, dow, doh, partials);
    };
    dispatch(t, [&](auto tag) {
        switch (s.c) {
        case 1:
            go(tag, std::integral_constant<int, 1>{});
            break;
        case 2:
            go(tag, std::integral_constant<int, 2>{});
            break;
        case 3:
            go(tag, std::integral_constant<int, 3>{});
            break;
        default:
            go(tag, std::integral_constant<int, 4>{});
            break;
        }
    });
    launch_sum_partials(partials, blocks, std::uint64_t{kp} * kp, moments, ActType::f32, stream);
}

void launch_first_bn_backward(const float* sums, ActType t, const DirectConvShape& s, const FirstBnBackward& b,
                              float* dw, cudaStream_t stream) {
    const double count = static_cast<double>(s.n) * s.oh * s.ow;
    launch_kernel(first_bn_backward_kernel, s.k, 64, 0, stream, sums, patch_values(s), moment_cols(s), s.k, count,
                  t == ActType::bf16, b, dw);
}

} // namespace dstk::train::cuda
