// The first batch norm's backward from the input's moments (first_bn.hpp).
#include "first_bn.hpp"

#include "launch_common.cuh"

namespace dstk::train::cuda {
namespace {

constexpr unsigned taps = 9;
constexpr unsigned mom_threads = taps * 32; // warp t: the pair's first tap t; lanes: pixels

unsigned patch_values(const DirectConvShape& s) {
    return taps * s.c;
}

unsigned moments_blocks(const DirectConvShape& s) {
    const std::uint64_t pixels = std::uint64_t{s.n} * s.oh * s.ow;
    return static_cast<unsigned>(std::clamp<std::uint64_t>((pixels + 31) / 32, 1, sm_count()));
}

// The C channels of input pixel (iy, ix) of image img, zero outside the image.
template <class T, int C>
__device__ __forceinline__ void load_pixel(const T* x, const DirectConvShape& s, unsigned img, int iy, int ix,
                                           float (&v)[C]) {
#pragma unroll
    for (int c = 0; c < C; ++c) v[c] = 0.0f;
    if (iy < 0 || ix < 0 || iy >= static_cast<int>(s.h) || ix >= static_cast<int>(s.w)) return;
    const std::uint64_t at = ((std::uint64_t{img} * s.h + iy) * s.w + ix) * s.cstride;
#pragma unroll
    for (int c = 0; c < C; ++c) v[c] = ld(x, at + c);
}

// Per block: the sums of the patch values (K), then their products (K x K),
// j = c * 9 + tap. Warp t1 takes the products of tap t1 with every tap.
template <class T, int C>
__global__ void __launch_bounds__(mom_threads, 1)
    first_bn_moments_kernel(const T* x, DirectConvShape s, Div32 dow, Div32 doh, float* partials) {
    await_predecessor();
    constexpr unsigned K = taps * C;
    const unsigned lane = threadIdx.x % 32, t1 = threadIdx.x / 32;
    const int r1 = static_cast<int>(t1 / 3), q1 = static_cast<int>(t1 % 3);
    float prod[taps][C][C] = {};
    float sum[C] = {};
    const unsigned pixels = s.n * s.oh * s.ow; // first_bn_applies: below 2^31
    for (unsigned p = blockIdx.x * 32 + lane; p < pixels; p += gridDim.x * 32) {
        const unsigned row = dow.div(p), ox = p - row * s.ow, img = doh.div(row), oy = row - img * s.oh;
        const int iy = static_cast<int>(oy * s.stride) - static_cast<int>(s.pad);
        const int ix = static_cast<int>(ox * s.stride) - static_cast<int>(s.pad);
        float v1[C];
        load_pixel<T, C>(x, s, img, iy + r1, ix + q1, v1);
#pragma unroll
        for (int c = 0; c < C; ++c) sum[c] += v1[c];
#pragma unroll
        for (int t2 = 0; t2 < static_cast<int>(taps); ++t2) {
            float v2[C];
            load_pixel<T, C>(x, s, img, iy + t2 / 3, ix + t2 % 3, v2);
#pragma unroll
            for (int a = 0; a < C; ++a)
#pragma unroll
                for (int b = 0; b < C; ++b) prod[t2][a][b] = fmaf(v1[a], v2[b], prod[t2][a][b]);
        }
    }
    // The warp's sums over its lanes (a fixed shuffle tree), lane 0 writes them.
    auto warp_sum = [](float v) {
#pragma unroll
        for (int o = 16; o > 0; o /= 2) v += __shfl_xor_sync(0xffffffffu, v, o);
        return v;
    };
    float* out = partials + std::uint64_t{blockIdx.x} * (K + K * K);
#pragma unroll
    for (int a = 0; a < C; ++a) {
        const float total = warp_sum(sum[a]);
        if (lane == 0) out[a * taps + t1] = total;
    }
#pragma unroll
    for (int t2 = 0; t2 < static_cast<int>(taps); ++t2)
#pragma unroll
        for (int a = 0; a < C; ++a)
#pragma unroll
            for (int b = 0; b < C; ++b) {
                const float total = warp_sum(prod[t2][a][b]);
                if (lane == 0) out[K + (a * taps + t1) * K + b * taps + t2] = total;
            }
}

// moments[e] = the blocks' partials[b][e] added in block order, in double.
__global__ void first_bn_moments_sum_kernel(const float* partials, unsigned blocks, unsigned count, double* moments) {
    await_predecessor();
    const unsigned e = blockIdx.x * blockDim.x + threadIdx.x;
    if (e >= count) return;
    double total = 0.0;
    for (unsigned b = 0; b < blocks; ++b) total += partials[std::uint64_t{b} * count + e];
    moments[e] = total;
}

// One block per output channel k, thread j one patch value (first_bn.hpp's formula).
__global__ void first_bn_backward_kernel(const float* sums, unsigned K, unsigned kout, double count, bool bf16_weights,
                                         FirstBnBackward b, float* dw) {
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
    const double* sx = b.moments;
    const double* gram = b.moments + K;
    double gw = 0.0;
    for (unsigned i = 0; i < K; ++i) gw += gram[std::uint64_t{j} * K + i] * w[i];
    const double z = gw - mean * sx[j]; // sum_p x_p[j] (y - mean)
    const double a = sums[std::uint64_t{k} * K + j];
    dw[std::uint64_t{k} * K + j] =
        static_cast<float>(b.gamma[k] * is * (a - sg / count * sx[j] - is * is * sgy / count * z));
}

} // namespace

std::uint64_t first_bn_moments(const DirectConvShape& s) {
    const std::uint64_t k = patch_values(s);
    return k + k * k;
}

std::uint64_t first_bn_moments_workspace(const DirectConvShape& s) {
    return std::uint64_t{moments_blocks(s)} * first_bn_moments(s) * sizeof(float);
}

void launch_first_bn_moments(const void* x, ActType t, const DirectConvShape& s, void* workspace, double* moments,
                             cudaStream_t stream) {
    const unsigned blocks = moments_blocks(s);
    auto* partials = static_cast<float*>(workspace);
    const Div32 dow(s.ow), doh(s.oh);
    auto go = [&](auto tag, auto c) {
        using T = std::remove_pointer_t<decltype(tag)>;
        launch_kernel(first_bn_moments_kernel<T, decltype(c)::value>, blocks, mom_threads, 0, stream,
                      static_cast<const T*>(x), s, dow, doh, partials);
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
    const auto count = static_cast<unsigned>(first_bn_moments(s));
    launch_kernel(first_bn_moments_sum_kernel, (count + 127) / 128, 128, 0, stream, partials, blocks, count, moments);
}

void launch_first_bn_backward(const float* sums, ActType t, const DirectConvShape& s, const FirstBnBackward& b,
                              float* dw, cudaStream_t stream) {
    const double count = static_cast<double>(s.n) * s.oh * s.ow;
    launch_kernel(first_bn_backward_kernel, s.k, 64, 0, stream, sums, patch_values(s), s.k, count, t == ActType::bf16,
                  b, dw);
}

} // namespace dstk::train::cuda
