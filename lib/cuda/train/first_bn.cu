// The first batch norm's statistics and backward from the input's moments (first_bn.hpp).
#include "first_bn.hpp"

#include "elementwise.hpp"
#include "launch_common.cuh"
#include "optimizer_update.cuh"
#include "partial_sums.cuh"

namespace dstk::train::cuda {
namespace {

constexpr unsigned taps = 9;
// ---- forward: the statistics from the input's moments ----
// M = P^T P over the step's output pixels, P the patch rows (the K values,
// j = c * 9 + tap, then a one, zeros to KP columns): M's first K x K is G, its
// column K the sums s. mean_k = w_k . s / N, var_k = w_k^T G w_k / N - mean_k^2.
constexpr unsigned fwd_warps = 8, fwd_threads = fwd_warps * 32;
constexpr unsigned fwd_tile = fwd_threads; // output pixels per tile: one patch row per thread

constexpr unsigned fwd_cols(unsigned c) {
    return taps * c + 1 <= 32 ? 32 : 48;
}

unsigned fwd_blocks(const DirectConvShape& s) {
    const std::uint64_t tiles = (std::uint64_t{s.n} * s.oh * s.ow + fwd_tile - 1) / fwd_tile;
    return static_cast<unsigned>(std::min<std::uint64_t>(tiles, std::uint64_t{sm_count()} * 2));
}

// Patch rows of KP + 8 bf16 (16 bytes apart mod 128: an ldmatrix's eight rows
// fall in distinct banks); fp32 inputs as a high and a low bf16 part (two
// matrices). At the end the same memory holds block_sum_warps' slots.
template <int KP> constexpr unsigned fwd_stride = KP + 8;
template <class T> constexpr unsigned fwd_matrices = std::is_same_v<T, bf16> ? 1 : 2;
template <int KP> constexpr int fwd_values = KP / 16 * (KP / 8) * 4;
template <class T, int KP> __host__ __device__ constexpr unsigned fwd_shared() {
    const unsigned rows = fwd_matrices<T> * fwd_tile * fwd_stride<KP> * sizeof(bf16);
    const unsigned sums = fwd_warps / 2 * fwd_values<KP> * 32 * sizeof(float);
    return rows > sums ? rows : sums;
}

// The moments' source of input pixels, read as build_patch_row's load(q, v):
// pixel q = (image * h + y) * w + x, its channels below C into v.
//
// The conversion's output: NHWC, cstride apart; bf16 channels stored in fours
// (tc_forward_applies).
template <class T, int C> struct ConvertedPixels {
    static constexpr bool staged = false;
    std::uint64_t stage_bytes() const { return 0; }
    const T* x = nullptr;
    unsigned cstride = 0;
    __device__ __forceinline__ void load(std::uint64_t q, float (&v)[4]) const {
        if constexpr (std::is_same_v<T, bf16>) {
            const uint2 w = *reinterpret_cast<const uint2*>(x + q * cstride);
            const float2 c01 = __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(&w.x));
            const float2 c23 = __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(&w.y));
            v[0] = c01.x, v[1] = c01.y, v[2] = c23.x, v[3] = c23.y;
        } else {
#pragma unroll
            for (int c = 0; c < C; ++c) v[c] = ld(x, q * cstride + c);
        }
    }
};

// The stored batch (CHW samples of In), converted as a tile is staged: its
// pixels and the rows of halo above and below them, normalised as
// launch_convert_input does (and rounded to T as it stores them), into shared
// memory, where load reads them; each tile's own pixels also go out to the
// converted input (NHWC, cstride apart), so that no conversion pass runs.
// Output pixels are input pixels here (first_bn_converts: stride 1, padding
// 1), so the tiles write every pixel once.
template <class T, class In, int C> struct StoredPixels {
    static constexpr bool staged = true;
    const In* x = nullptr;
    const std::uint64_t* rows = nullptr; // StoredBatch::rows
    const float *mean = nullptr, *inv_std = nullptr;
    T* out = nullptr;
    unsigned cstride = 0, halo = 0; // halo: w + 1 pixels before and after a tile
    Div32 dhw;
    float4* stage = nullptr; // shared: tile + 2 * halo pixels from pixel `base`
    std::int64_t base = 0;

    std::uint64_t stage_bytes() const { return (fwd_tile + 2 * std::uint64_t{halo}) * sizeof(float4); }

    __device__ void fill(unsigned first, unsigned pixels) {
        base = std::int64_t{first} - halo;
        for (unsigned i = threadIdx.x; i < fwd_tile + 2 * halo; i += blockDim.x) {
            const std::int64_t q = base + i;
            float v[4] = {};
            if (q >= 0 && q < pixels) {
                const unsigned p = static_cast<unsigned>(q), img = dhw.div(p), j = p - img * dhw.d;
                const std::uint64_t row = row_of(rows, img);
#pragma unroll
                for (int c = 0; c < C; ++c) {
                    const float f = normalised(x, (row * C + c) * dhw.d + j, c, mean, inv_std);
                    v[c] = std::is_same_v<T, bf16> ? __bfloat162float(__float2bfloat16(f)) : f;
                }
                if (p >= first && p - first < fwd_tile) store(p, v);
            }
            stage[i] = make_float4(v[0], v[1], v[2], v[3]);
        }
    }
    // Channels from min(cstride, 4) on are pads the caller keeps at zero.
    __device__ __forceinline__ void store(unsigned p, const float (&v)[4]) const {
        T* o = out + std::uint64_t{p} * cstride;
        if constexpr (std::is_same_v<T, bf16>) {
            *reinterpret_cast<uint2*>(o) = make_uint2(pack_bf16(v[0], v[1]), pack_bf16(v[2], v[3]));
        } else {
#pragma unroll
            for (int c = 0; c < 4; ++c)
                if (c < static_cast<int>(cstride)) o[c] = v[c];
        }
    }
    __device__ __forceinline__ void load(std::uint64_t q, float (&v)[4]) const {
        const float4 s = stage[static_cast<std::int64_t>(q) - base];
        v[0] = s.x, v[1] = s.y, v[2] = s.z, v[3] = s.w;
    }
};

// Thread q's patch row of output pixel `pixel` (zeros past the last one): x
// under its nine taps, channel-major as in the KCRS weights, then a one.
template <int C, int KP, class Src>
__device__ void build_patch_row(const Src& src, const DirectConvShape& s, Div32 dow, Div32 doh, unsigned pixel,
                                unsigned pixels, bf16* hi, bf16* lo) {
    float v[KP] = {};
    if (pixel < pixels) {
        const unsigned row = dow.div(pixel), ox = pixel - row * s.ow, img = doh.div(row), oy = row - img * s.oh;
        const int iy0 = static_cast<int>(oy * s.stride) - static_cast<int>(s.pad);
        const int ix0 = static_cast<int>(ox * s.stride) - static_cast<int>(s.pad);
#pragma unroll
        for (int t = 0; t < static_cast<int>(taps); ++t) {
            const int iy = iy0 + t / 3, ix = ix0 + t % 3;
            if (iy < 0 || ix < 0 || iy >= static_cast<int>(s.h) || ix >= static_cast<int>(s.w)) continue;
            float c4[4];
            src.load((std::uint64_t{img} * s.h + iy) * s.w + ix, c4);
#pragma unroll
            for (int c = 0; c < C; ++c) v[c * taps + t] = c4[c];
        }
        v[taps * C] = 1.0f;
    }
#pragma unroll
    for (int j = 0; j < KP; j += 8) {
        std::uint32_t h[4], l[4];
#pragma unroll
        for (int e = 0; e < 4; ++e) {
            const float h0 = __bfloat162float(__float2bfloat16(v[j + 2 * e]));
            const float h1 = __bfloat162float(__float2bfloat16(v[j + 2 * e + 1]));
            h[e] = pack_bf16(h0, h1);
            l[e] = pack_bf16(v[j + 2 * e] - h0, v[j + 2 * e + 1] - h1);
        }
        *reinterpret_cast<uint4*>(hi + j) = make_uint4(h[0], h[1], h[2], h[3]);
        if (lo) *reinterpret_cast<uint4*>(lo + j) = make_uint4(l[0], l[1], l[2], l[3]);
    }
}

// Per block: M over its tiles' pixels on tensor cores, in bf16: exact
// products of bf16 inputs; fp32 inputs as hi + lo (lo hi + hi lo + hi hi:
// about 16 bits of each). One ldmatrix.x4.trans of 16 columns x 16 pixels is
// at once the A fragment of those 16 rows of M and the B fragments of those
// 16 columns. partials[block][KP x KP].
template <class T, int C, int KP, class Src>
__global__ void __launch_bounds__(fwd_threads)
    first_bn_moments_kernel(Src src, DirectConvShape s, Div32 dow, Div32 doh, float* partials) {
    await_predecessor();
    constexpr int MT = KP / 16, NT = KP / 8, RS = fwd_stride<KP>, V = fwd_values<KP>;
    constexpr bool split = fwd_matrices<T> == 2;
    extern __shared__ uint4 fwd_smem[];
    auto* hi = reinterpret_cast<bf16*>(fwd_smem);
    bf16* lo = split ? hi + fwd_tile * RS : nullptr;
    if constexpr (Src::staged) src.stage = reinterpret_cast<float4*>(fwd_smem) + fwd_shared<T, KP>() / 16;
    const unsigned lane = threadIdx.x % 32, warp = threadIdx.x / 32, gid = lane / 4, t4 = lane % 4;
    const unsigned pixels = s.n * s.oh * s.ow; // tc_forward_applies: below 2^31
    float acc[MT][NT][4] = {};
    for (unsigned first = blockIdx.x * fwd_tile; first < pixels; first += gridDim.x * fwd_tile) {
        __syncthreads(); // the previous tile's reads are done
        if constexpr (Src::staged) {
            src.fill(first, pixels);
            __syncthreads();
        }
        build_patch_row<C, KP>(src, s, dow, doh, first + threadIdx.x, pixels, hi + threadIdx.x * RS,
                               split ? lo + threadIdx.x * RS : nullptr);
        __syncthreads();
        for (unsigned ks = warp; ks < fwd_tile / 16; ks += fwd_warps) {
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
                        mma_bf16_k16(acc[m][n], l[m], h[bm][b0], h[bm][b1]);
                        mma_bf16_k16(acc[m][n], h[m], l[bm][b0], l[bm][b1]);
                    }
                    mma_bf16_k16(acc[m][n], h[m], h[bm][b0], h[bm][b1]);
                }
        }
    }
    __syncthreads();
    float v[V];
#pragma unroll
    for (int i = 0; i < V; ++i) v[i] = acc[i / (NT * 4)][i / 4 % NT][i % 4];
    block_sum_warps<fwd_warps>(v, reinterpret_cast<float*>(fwd_smem));
    if (warp != 0) return;
    float* out = partials + std::uint64_t{blockIdx.x} * KP * KP;
#pragma unroll
    for (int i = 0; i < V; ++i) {
        const int m = i / (NT * 4), n = i / 4 % NT, e = i % 4;
        out[(16 * m + gid + (e >= 2 ? 8 : 0)) * KP + 8 * n + 2 * t4 + (e & 1)] = v[i];
    }
}

// Weight j of output channel k as the forward convolution takes it (bf16:
// rounded to bf16; tf32's three products: about fp32).
__device__ __forceinline__ double forward_weight(const float* weights, unsigned k, unsigned K, unsigned j,
                                                 bool bf16_weights) {
    const float wf = weights[std::uint64_t{k} * K + j];
    return bf16_weights ? __bfloat162float(__float2bfloat16(wf)) : wf;
}

// (G w)_j = sum_p x_p[j] y_p, from row j of the moments.
__device__ __forceinline__ double gram_times(const float* m, unsigned kp, unsigned j, const double* w, unsigned K) {
    const float* row = m + std::uint64_t{j} * kp;
    double gw = 0.0;
    for (unsigned i = 0; i < K; ++i) gw += row[i] * w[i];
    return gw;
}

// One block per output channel k, thread j one patch value: the batch
// statistics of y_k = w_k . x_p from M (as bn_finalize_forward_kernel
// leaves them: saved mean and 1 / std, running statistics updated with the
// unbiased variance).
__global__ void first_bn_forward_kernel(const float* m, unsigned c, unsigned kp, double count, bool bf16_weights,
                                        const float* weights, FirstBnForward f) {
    await_predecessor();
    constexpr unsigned max_k = 4 * taps;
    __shared__ double w[max_k], ws[max_k], wgw[max_k];
    __shared__ float ms[max_k * fwd_cols(4)];
    const unsigned K = taps * c, k = blockIdx.x, j = threadIdx.x;
    for (unsigned e = j; e < K * kp; e += blockDim.x) ms[e] = m[e]; // its rows j < K, each load issued at once
    if (j < K) w[j] = forward_weight(weights, k, K, j, bf16_weights);
    __syncthreads();
    if (j < K) {
        ws[j] = w[j] * ms[j * kp + K];
        wgw[j] = w[j] * gram_times(ms, kp, j, w, K);
    }
    __syncthreads();
    if (j != 0) return;
    double sum = 0.0, sq = 0.0; // in index order
    for (unsigned i = 0; i < K; ++i) sum += ws[i], sq += wgw[i];
    const double mean = sum / count, var = fmax(0.0, sq / count - mean * mean);
    const float is = static_cast<float>(1.0 / sqrt(var + f.eps));
    f.save_mean[k] = static_cast<float>(mean);
    f.save_invstd[k] = is;
    const double unbiased = count > 1 ? var * count / (count - 1) : var;
    f.run_mean[k] = (1.0f - f.momentum) * f.run_mean[k] + f.momentum * static_cast<float>(mean);
    f.run_var[k] = (1.0f - f.momentum) * f.run_var[k] + f.momentum * static_cast<float>(unbiased);
}

// Block k's sums of the weight gradient's partials rows (partial_sums.cuh's
// order, rounded to float as launch_sum_partials stores them) into a: A_k's
// K values (row k of A), then S_k. Threads: sum_parts x 32.
__device__ void first_bn_sums(const float* partials, unsigned rows, std::uint64_t count, unsigned K, unsigned kout,
                              float* a) {
    __shared__ double parts[sum_parts][32];
    const unsigned k = blockIdx.x, lane = threadIdx.x % 32, pt = threadIdx.x / 32;
    for (unsigned base = 0; base <= K; base += 32) {
        const unsigned el = base + lane;
        const std::uint64_t e = el < K ? std::uint64_t{k} * K + el : std::uint64_t{kout} * K + k;
        const double own = el <= K ? part_sum(partials, rows, count, e, pt) : 0.0;
        parts[pt][lane] = own;
        __syncthreads();
        if (pt == 0 && el <= K) a[el] = static_cast<float>(add_parts(own, parts, lane));
        __syncthreads();
    }
}

constexpr unsigned bwd_threads = sum_parts * 32;

// One block per output channel k, thread j one patch value (first_bn.hpp's
// formula), after the block's sums of the partials; m: the moments the
// forward left (KP x KP: row j the products of patch value j, then its sum),
// its rows j < K staged. With b.update, each parameter is updated as its
// gradient is stored (C: the compute copies' type).
template <class C>
__global__ void __launch_bounds__(bwd_threads)
    first_bn_backward_kernel(const float* partials, unsigned rows, std::uint64_t row_floats, const float* m, unsigned c,
                             unsigned kp, unsigned kout, double count, bool bf16_weights, FirstBnBackward b,
                             float* dw) {
    await_predecessor();
    constexpr unsigned max_k = 4 * taps;
    __shared__ double w[max_k], wa[max_k];
    __shared__ float a[max_k + 1], ms[max_k * fwd_cols(4)];
    const unsigned K = taps * c, k = blockIdx.x, j = threadIdx.x;
    first_bn_sums(partials, rows, row_floats, K, kout, a);
    for (unsigned e = j; e < K * kp; e += blockDim.x) ms[e] = m[e];
    if (j < K) {
        w[j] = forward_weight(b.w, k, K, j, bf16_weights);
        wa[j] = w[j] * a[j];
    }
    const float gamma = b.gamma[k]; // read before thread 0 updates it
    __syncthreads();
    double w_a = 0.0; // w_k . A_k = sum_p g y, in index order
    for (unsigned e = 0; e < K; ++e) w_a += wa[e];
    const double sg = a[K], mean = b.mean[k], is = b.invstd[k];
    const double sgy = w_a - mean * sg; // T
    const bool update = b.update.params != nullptr;
    if (j == 0) {
        const float dgamma = static_cast<float>(is * sgy), dbeta = static_cast<float>(sg);
        b.dgamma[k] = dgamma;
        b.dbeta[k] = dbeta;
        if (update) {
            apply_update<C>(b.update, b.gamma_at + k, dgamma);
            apply_update<C>(b.update, b.gamma_at + kout + k, dbeta);
            if (b.update.advance && k == 0) *b.update.advance += 1;
        }
    }
    if (j >= K) return;
    const double sx = ms[j * kp + K];
    const double z = gram_times(ms, kp, j, w, K) - mean * sx; // sum_p x_p[j] (y_p - mean)
    const double aj = a[j];
    const float g = static_cast<float>(gamma * is * (aj - sg / count * sx - is * is * sgy / count * z));
    dw[std::uint64_t{k} * K + j] = g;
    if (update) apply_update<C>(b.update, b.w_at + std::uint64_t{k} * K + j, g);
}

} // namespace

std::uint64_t first_bn_moments(const DirectConvShape& s) {
    return std::uint64_t{fwd_cols(s.c)} * fwd_cols(s.c);
}

void launch_first_bn_backward(const float* partials, unsigned rows, std::uint64_t row_floats, ActType t,
                              const DirectConvShape& s, const FirstBnBackward& b, float* dw, cudaStream_t stream) {
    const double count = static_cast<double>(s.n) * s.oh * s.ow;
    dispatch(b.update.params ? b.update.copy_t : ActType::f32, [&](auto tag) {
        launch_kernel(first_bn_backward_kernel<DSTK_T>, s.k, bwd_threads, 0, stream, partials, rows, row_floats,
                      b.moments, s.c, fwd_cols(s.c), s.k, count, t == ActType::bf16, b, dw);
    });
}

std::uint64_t first_bn_moments_workspace(const DirectConvShape& s) {
    return std::uint64_t{fwd_blocks(s)} * first_bn_moments(s) * sizeof(float);
}

namespace {

// The moments kernel from src (C channels, as the trainer's activations T),
// with the shared memory its source stages, its partials summed by a second
// kernel.
template <class T, int C, class Src>
void launch_moments(const Src& src, const DirectConvShape& s, float* moments, void* workspace, cudaStream_t stream) {
    constexpr int KP = fwd_cols(C);
    const unsigned blocks = fwd_blocks(s);
    const std::uint64_t shared = fwd_shared<T, KP>() + src.stage_bytes();
    auto* partials = static_cast<float*>(workspace);
    if (shared > 48 * 1024)
        CUDA_CHECK(cudaFuncSetAttribute(first_bn_moments_kernel<T, C, KP, Src>,
                                        cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(shared)));
    launch_kernel(first_bn_moments_kernel<T, C, KP, Src>, blocks, fwd_threads, shared, stream, src, s, Div32(s.ow),
                  Div32(s.oh), partials);
    launch_sum_partials(partials, blocks, std::uint64_t{KP} * KP, moments, ActType::f32, stream);
}

// The widest image whose tile and halo rows StoredPixels stages: with the
// widest patch rows (fp32, four channels) a block then asks for 92 KiB of
// shared memory, within the opt-in maximum of every architecture built for
// (99 KB on 8.6 and 8.9).
constexpr std::uint32_t max_staged_width = 1024;

} // namespace

void launch_first_bn_moments(const void* x, ActType t, const DirectConvShape& s, float* moments, void* workspace,
                             cudaStream_t stream) {
    dispatch(t, [&](auto tag) {
        using T = DSTK_T;
        with_constant<4>(s.c, [&](auto c) { // direct_conv: 1 to 4
            constexpr int C = decltype(c)::value;
            launch_moments<T, C>(ConvertedPixels<T, C>{static_cast<const T*>(x), s.cstride}, s, moments, workspace,
                                 stream);
        });
    });
}

bool first_bn_converts(ActType t, DType dtype, const DirectConvShape& s) {
    const bool layout = t == ActType::bf16 ? s.cstride % 4 == 0 : s.cstride == s.c;
    return (dtype == DType::u8 || dtype == DType::f32) && !s.nchw && layout && s.kernel == 3 && s.stride == 1 &&
           s.pad == 1 && s.oh == s.h && s.ow == s.w && s.w <= max_staged_width && s.c >= 1 && s.c <= 4;
}

void launch_first_bn_moments_converting(const StoredBatch& b, void* out, ActType t, const DirectConvShape& s,
                                        float* moments, void* workspace, cudaStream_t stream) {
    auto go = [&](auto tag, auto in, auto c) {
        using T = DSTK_T;
        using In = std::remove_pointer_t<decltype(in)>;
        constexpr int C = decltype(c)::value;
        StoredPixels<T, In, C> src;
        src.x = static_cast<const In*>(b.x);
        src.rows = b.rows;
        src.mean = b.mean;
        src.inv_std = b.inv_std;
        src.out = static_cast<T*>(out);
        src.cstride = s.cstride;
        src.halo = s.w + 1;
        src.dhw = Div32(std::uint64_t{s.h} * s.w);
        launch_moments<T, C>(src, s, moments, workspace, stream);
    };
    dispatch(t, [&](auto tag) {
        with_constant<4>(s.c, [&](auto c) {
            if (b.dtype == DType::u8)
                go(tag, static_cast<std::uint8_t*>(nullptr), c);
            else
                go(tag, static_cast<float*>(nullptr), c);
        });
    });
}

void launch_first_bn_forward(ActType t, const DirectConvShape& s, const float* w, const FirstBnForward& f,
                             cudaStream_t stream) {
    const double count = static_cast<double>(s.n) * s.oh * s.ow;
    launch_kernel(first_bn_forward_kernel, s.k, 256, 0, stream, f.moments, s.c, fwd_cols(s.c), count,
                  t == ActType::bf16, w, f);
}

} // namespace dstk::train::cuda
