// Batch normalisation: split reductions, finalisation and element-wise
// passes, with the fused ReLU and 2x2 max-pool.
#include "batchnorm.hpp"

#include "launch_common.cuh"

namespace dstk::train::cuda {
namespace {

// ---- batch norm ----

constexpr unsigned bn_max_splits = 1024;

// Splits of the rows: enough blocks to fill the GPU, at least 16 rows each.
unsigned bn_splits(std::uint64_t rows) {
    return static_cast<unsigned>(std::clamp<std::uint64_t>(rows / 16, 1, bn_max_splits));
}

// Per-channel coefficients after the split partials: 6 floats per channel
// (scale or k, shift or c1, c2, mean, beta).
float* bn_coef(double* partials, std::uint32_t c) {
    return reinterpret_cast<float*>(partials + std::uint64_t{c} * bn_max_splits * 2);
}

// What the backward reduction needs per channel. With relu, the gradient
// arrives with respect to relu(bn(x)) and is masked where the forward output
// was not positive: recomputed from x with the forward pass's own
// coefficients (gamma * invstd, beta, mean) and expression, so the mask is
// the forward's exactly and the ReLU output is not read back.
struct BnRefs {
    const float *gamma, *beta, *mean, *invstd;
    bool relu;
};
__device__ __forceinline__ float bn_value(float x, float mean, float scale, float shift) {
    return __fmaf_rn(x - mean, scale, shift);
}

// Batch norm's backward element (batchnorm.hpp): dx from the forward input x
// and the gradient g of its output (of relu(bn(x)) where relu, masked where
// the forward's output was not positive), with the channel's coefficients
// k = gamma * invstd, c1, c2, the mean and beta. Explicit FMAs, so that every
// pass applying it (plain, 16-byte groups, pooled) gets the same bits.
__device__ __forceinline__ float bn_backward_value(float x, float g, float k, float c1, float c2, float m, float b,
                                                   bool relu) {
    const float v = x - m;
    const float g1 = relu && !(__fmaf_rn(v, k, b) > 0.0f) ? 0.0f : g;
    return __fmaf_rn(k, g1, __fmaf_rn(c1, v, c2));
}

// Partial sums over the rows of split blockIdx.x of the NHWC matrix [rows][C]:
// forward (dy null) (v - pivot, (v - pivot)^2) with the channel's first value as
// the pivot (no cancellation when |mean| >> std); backward (g, g * xhat) with g
// = dy, masked when r.relu. partials[(c*splits + s)*2 + k].
template <class T>
__global__ void bn_reduce_kernel(const T* x, const T* dy, BnRefs r, std::uint64_t rows, std::uint32_t channels,
                                 double* partials) {
    await_predecessor();
    extern __shared__ double sh[];
    const std::uint32_t s = blockIdx.x, splits = gridDim.x, t = threadIdx.x, nt = blockDim.x;
    const std::uint64_t r0 = rows * s / splits, r1 = rows * (s + 1) / splits;
    struct Ref {
        float m, is, a, b;
    };
    auto term = [&](std::uint64_t i, const Ref& f, float& a, float& b) {
        const float xv = ld(x, i) - f.m;
        if (!dy) {
            a += xv;
            b += xv * xv;
        } else {
            const float g = r.relu && !(__fmaf_rn(xv, f.a, f.b) > 0.0f) ? 0.0f : ld(dy, i);
            a += g;
            b += g * xv * f.is;
        }
    };
    auto centre = [&](std::uint32_t c) {
        if (!dy) return Ref{ld(x, c), 0.0f, 0.0f, 0.0f};
        const float is = r.invstd[c];
        return Ref{r.mean[c], is, r.gamma[c] * is, r.beta[c]};
    };
    if (nt % channels == 0) {
        const std::uint32_t c = t % channels;
        float a = 0.0f, b = 0.0f;
        const Ref f = centre(c);
        for (std::uint64_t i = r0 * channels + t; i < r1 * channels; i += nt) term(i, f, a, b);
        sh[t] = a;
        sh[nt + t] = b;
        __syncthreads();
        if (t < channels) {
            double sa = 0.0, sb = 0.0;
            for (std::uint32_t k = t; k < nt; k += channels) {
                sa += sh[k];
                sb += sh[nt + k];
            }
            partials[(std::uint64_t{t} * splits + s) * 2] = sa;
            partials[(std::uint64_t{t} * splits + s) * 2 + 1] = sb;
        }
        return;
    }
    // Any other channel count: the block walks its rows once per channel.
    for (std::uint32_t c = 0; c < channels; ++c) {
        float a = 0.0f, b = 0.0f;
        const Ref f = centre(c);
        for (std::uint64_t row = r0 + t; row < r1; row += nt) term(row * channels + c, f, a, b);
        sh[t] = a;
        sh[nt + t] = b;
        __syncthreads();
        for (unsigned w = nt / 2; w > 0; w /= 2) {
            if (t < w) {
                sh[t] += sh[t + w];
                sh[nt + t] += sh[nt + t + w];
            }
            __syncthreads();
        }
        if (t == 0) {
            partials[(std::uint64_t{c} * splits + s) * 2] = sh[0];
            partials[(std::uint64_t{c} * splits + s) * 2 + 1] = sh[nt];
        }
        __syncthreads();
    }
}

// The block's partial sums of per-thread float pairs (sa[k], sb[k] for
// channel (t % groups) * V + k) into partials[(c * gridDim.x + blockIdx.x) *
// 2 + j]: lanes of a warp that share a group first (shuffles, where the group
// count divides 32), then the warps' or threads' sums per channel in a fixed
// order, in double. shf: blockDim.x * V * 2 floats of shared memory.
template <int V>
__device__ void block_partials(float (&sa)[V], float (&sb)[V], std::uint32_t groups, std::uint32_t channels, float* shf,
                               double* partials) {
    const std::uint32_t t = threadIdx.x, nt = blockDim.x, s = blockIdx.x, splits = gridDim.x;
    const bool shuffled = groups < 32 && 32 % groups == 0;
    if (shuffled) {
        for (std::uint32_t off = 16; off >= groups; off >>= 1)
#pragma unroll
            for (int k = 0; k < V; ++k) {
                sa[k] += __shfl_xor_sync(0xffffffffu, sa[k], off);
                sb[k] += __shfl_xor_sync(0xffffffffu, sb[k], off);
            }
    }
    const std::uint32_t lane = t % 32;
    if (!shuffled || lane < groups) {
        const std::uint32_t rep = shuffled ? t / 32 : t / groups, gi = t % groups;
#pragma unroll
        for (int k = 0; k < V; ++k) {
            shf[((rep * groups + gi) * V + k) * 2] = sa[k];
            shf[((rep * groups + gi) * V + k) * 2 + 1] = sb[k];
        }
    }
    __syncthreads();
    const std::uint32_t reps = shuffled ? nt / 32 : nt / groups;
    for (std::uint32_t c = t; c < channels; c += nt) {
        const std::uint32_t gi = c / V, k = c % V;
        double A = 0.0, B = 0.0;
        for (std::uint32_t rep = 0; rep < reps; ++rep) {
            A += shf[((rep * groups + gi) * V + k) * 2];
            B += shf[((rep * groups + gi) * V + k) * 2 + 1];
        }
        partials[(std::uint64_t{c} * splits + s) * 2] = A;
        partials[(std::uint64_t{c} * splits + s) * 2 + 1] = B;
    }
}

// The same partials with 16-byte loads: each thread keeps to one group of V
// channels (blockDim.x a multiple of channels / V), V pairs of float sums,
// four loads in flight per operand. The block's sums: lanes of a warp that
// share a group first (shuffles, where the group count divides 32), then the
// warps' or threads' sums per channel in a fixed order, in double.
template <class T, int V, bool Bwd>
__global__ void bn_reduce_vec_kernel(const T* x, const T* dy, BnRefs r, std::uint64_t rows, std::uint32_t channels,
                                     double* partials) {
    await_predecessor();
    extern __shared__ float shf[]; // [rep][group][V][2]
    constexpr int unroll = 4;
    const std::uint32_t s = blockIdx.x, splits = gridDim.x, t = threadIdx.x, nt = blockDim.x, groups = channels / V;
    const std::uint64_t r0 = rows * s / splits, r1 = rows * (s + 1) / splits;
    const std::uint32_t c0 = (t % groups) * V;
    float m[V], is[V], a[V], b[V], sa[V], sb[V];
#pragma unroll
    for (int k = 0; k < V; ++k) {
        const std::uint32_t c = c0 + k;
        m[k] = Bwd ? r.mean[c] : ld(x, c);
        is[k] = Bwd ? r.invstd[c] : 0.0f;
        a[k] = Bwd ? r.gamma[c] * is[k] : 0.0f;
        b[k] = Bwd ? r.beta[c] : 0.0f;
        sa[k] = sb[k] = 0.0f;
    }
    auto add = [&](const float(&xv)[V], const float(&gv)[V]) {
#pragma unroll
        for (int k = 0; k < V; ++k) {
            const float v = xv[k] - m[k];
            if constexpr (!Bwd) {
                sa[k] += v;
                sb[k] += v * v;
            } else {
                const float gg = r.relu && !(__fmaf_rn(v, a[k], b[k]) > 0.0f) ? 0.0f : gv[k];
                sa[k] += gg;
                sb[k] += gg * v * is[k];
            }
        }
    };
    const std::uint64_t end = r1 * groups;
    std::uint64_t g = r0 * groups + t;
    for (; g + (unroll - 1) * std::uint64_t{nt} < end; g += unroll * std::uint64_t{nt}) {
        float xv[unroll][V], gv[unroll][V];
#pragma unroll
        for (int u = 0; u < unroll; ++u) {
            ldv<V>(x, (g + u * nt) * V, xv[u]);
            if constexpr (Bwd) ldv<V>(dy, (g + u * nt) * V, gv[u]);
        }
#pragma unroll
        for (int u = 0; u < unroll; ++u) add(xv[u], gv[u]);
    }
    for (; g < end; g += nt) {
        float xv[V], gv[V];
        ldv<V>(x, g * V, xv);
        if constexpr (Bwd) ldv<V>(dy, g * V, gv);
        add(xv, gv);
    }
    block_partials<V>(sa, sb, groups, channels, shf, partials);
}

// The same partials for NCHW tensors: block (channel blockIdx.x, split
// blockIdx.y) walks its part of the channel's n * hw elements.
template <class T>
__global__ void bn_reduce_nchw_kernel(const T* x, const T* dy, BnRefs r, std::uint32_t n, std::uint32_t channels,
                                      std::uint64_t hw, Div32 dhw, bool narrow, double* partials) {
    await_predecessor();
    __shared__ double sa[threads], sb[threads];
    const std::uint32_t c = blockIdx.x, s = blockIdx.y, splits = gridDim.y, t = threadIdx.x;
    const std::uint64_t total = std::uint64_t{n} * hw, e0 = total * s / splits, e1 = total * (s + 1) / splits;
    const float m = dy ? r.mean[c] : ld(x, std::uint64_t{c} * hw), is = dy ? r.invstd[c] : 0.0f;
    const float fa = dy ? r.gamma[c] * is : 0.0f, fb = dy ? r.beta[c] : 0.0f;
    float a = 0.0f, b = 0.0f;
    for (std::uint64_t e = e0 + t; e < e1; e += blockDim.x) {
        const std::uint64_t q = narrow ? dhw.div(static_cast<std::uint32_t>(e)) : e / hw;
        const std::uint64_t i = (q * channels + c) * hw + (e - q * hw);
        const float v = ld(x, i) - m;
        if (!dy) {
            a += v;
            b += v * v;
        } else {
            const float g = r.relu && !(__fmaf_rn(v, fa, fb) > 0.0f) ? 0.0f : ld(dy, i);
            a += g;
            b += g * v * is;
        }
    }
    sa[t] = a;
    sb[t] = b;
    __syncthreads();
    for (unsigned w = threads / 2; w > 0; w /= 2) {
        if (t < w) {
            sa[t] += sa[t + w];
            sb[t] += sb[t + w];
        }
        __syncthreads();
    }
    if (t == 0) {
        partials[(std::uint64_t{c} * splits + s) * 2] = sa[0];
        partials[(std::uint64_t{c} * splits + s) * 2 + 1] = sb[0];
    }
}

// Block-wide (blockDim.x == 128) sums of a channel's split partials, in a
// fixed order (strided per thread, then warp shuffles, then the four warps);
// every thread gets them.
__device__ void channel_totals(const double* partials, std::uint32_t c, std::uint32_t splits, double& a, double& b) {
    __shared__ double sa[4], sb[4];
    double pa = 0.0, pb = 0.0;
#pragma unroll 4
    for (std::uint32_t s = threadIdx.x; s < splits; s += blockDim.x) {
        pa += partials[(std::uint64_t{c} * splits + s) * 2];
        pb += partials[(std::uint64_t{c} * splits + s) * 2 + 1];
    }
    for (unsigned off = 16; off > 0; off >>= 1) {
        pa += __shfl_xor_sync(0xffffffffu, pa, off);
        pb += __shfl_xor_sync(0xffffffffu, pb, off);
    }
    if (threadIdx.x % 32 == 0) sa[threadIdx.x / 32] = pa, sb[threadIdx.x / 32] = pb;
    __syncthreads();
    a = (sa[0] + sa[1]) + (sa[2] + sa[3]);
    b = (sb[0] + sb[1]) + (sb[2] + sb[3]);
}

// coef per channel: forward (scale, shift, -, mean): y = bn_value(x, mean, scale, shift).
// The pivot is the channel's first value, or where pivot is given (sums
// taken by a convolution's epilogue), pivot[c], read before run_mean (which
// it may be) is updated.
template <class T>
__global__ void bn_finalize_forward_kernel(const T* x, std::uint64_t pivot_stride, const float* pivot,
                                           std::uint32_t channels, std::uint32_t splits, double count,
                                           const float* gamma, const float* beta, float* run_mean, float* run_var,
                                           float* save_mean, float* save_invstd, const double* partials, float* coef,
                                           float momentum, float eps) {
    await_predecessor();
    const std::uint32_t c = blockIdx.x;
    double sum, sq;
    channel_totals(partials, c, splits, sum, sq);
    if (threadIdx.x != 0) return;
    const double p = pivot ? pivot[c] : ld(x, c * pivot_stride);
    const double d = sum / count, mean = p + d;
    const double var = fmax(0.0, sq / count - d * d);
    const float is = static_cast<float>(1.0 / sqrt(var + eps));
    coef[c] = gamma[c] * is;
    coef[channels + c] = beta[c];
    coef[3 * channels + c] = static_cast<float>(mean);
    save_mean[c] = static_cast<float>(mean);
    save_invstd[c] = is;
    const double unbiased = count > 1 ? var * count / (count - 1) : var;
    run_mean[c] = (1.0f - momentum) * run_mean[c] + momentum * static_cast<float>(mean);
    run_var[c] = (1.0f - momentum) * run_var[c] + momentum * static_cast<float>(unbiased);
}

// coef per channel, backward: dx = k * g + c1 * (x - mean) + c2, with
// k = gamma * is, c1 = -k * is * mean(g * xhat), c2 = -k * mean(g); beta for
// the ReLU mask (whose scale is k).
__global__ void bn_finalize_backward_kernel(std::uint32_t channels, std::uint32_t splits, double count,
                                            const float* gamma, const float* beta, const float* save_mean,
                                            const float* save_invstd, float* dgamma, float* dbeta,
                                            const double* partials, float* coef) {
    await_predecessor();
    const std::uint32_t c = blockIdx.x;
    double sg, sgx;
    channel_totals(partials, c, splits, sg, sgx);
    if (threadIdx.x != 0) return;
    dgamma[c] = static_cast<float>(sgx);
    dbeta[c] = static_cast<float>(sg);
    const float is = save_invstd[c], k = gamma[c] * is;
    const float m1 = static_cast<float>(sg / count), m2 = static_cast<float>(sgx / count);
    coef[c] = k;
    coef[channels + c] = -k * is * m2;
    coef[2 * channels + c] = -k * m1;
    coef[3 * channels + c] = save_mean[c];
    coef[4 * channels + c] = beta[c];
}

// Eval-mode coefficients from the running statistics.
__global__ void bn_eval_coef_kernel(std::uint32_t channels, const float* gamma, const float* beta,
                                    const float* run_mean, const float* run_var, float eps, float* coef) {
    await_predecessor();
    const std::uint32_t c = blockIdx.x * blockDim.x + threadIdx.x;
    if (c >= channels) return;
    coef[c] = gamma[c] / sqrtf(run_var[c] + eps);
    coef[channels + c] = beta[c];
    coef[3 * channels + c] = run_mean[c];
}

// With skip (a residual block's end right above the ReLU): y = skip + the
// output as stored, summed as the block's own add would sum them.
template <class T>
__global__ void bn_apply_kernel(const T* x, T* y, std::uint64_t count, Channels ch, const float* coef, bool relu,
                                const T* skip) {
    await_predecessor();
    const std::uint32_t channels = ch.c, c0 = first_channel(channels);
    float a = coef[c0], b = coef[channels + c0], m = coef[3 * channels + c0];
    GRID_LOOP(i, count) {
        if (!ch.fixed) {
            const std::uint32_t c = ch(i, c0);
            a = coef[c], b = coef[channels + c], m = coef[3 * channels + c];
        }
        float v = bn_value(ld(x, i), m, a, b);
        if (relu) v = fmaxf(v, 0.0f);
        st(y, i, skip ? stored<T>(v) + ld(skip, i) : v);
    }
}

template <class T>
__global__ void bn_apply_backward_kernel(const T* x, const T* dy, T* dx, std::uint64_t count, Channels ch,
                                         const float* coef, bool relu) {
    await_predecessor();
    const std::uint32_t channels = ch.c, c0 = first_channel(channels);
    float k = coef[c0], c1 = coef[channels + c0], c2 = coef[2 * channels + c0], m = coef[3 * channels + c0],
          b = coef[4 * channels + c0];
    GRID_LOOP(i, count) {
        if (!ch.fixed) {
            const std::uint32_t c = ch(i, c0);
            k = coef[c], c1 = coef[channels + c], c2 = coef[2 * channels + c], m = coef[3 * channels + c],
            b = coef[4 * channels + c];
        }
        st(dx, i, bn_backward_value(ld(x, i), ld(dy, i), k, c1, c2, m, b, relu));
    }
}

// The element-wise passes over NHWC tensors with 16-byte accesses: each
// thread keeps to one group of V channels (blockDim.x a multiple of c / V),
// its coefficients in registers.
// V channels' coefficients from c0 (coef holds five rows of `channels`
// floats, written by the finalize kernels): forward scale, shift and mean.
template <int V>
__device__ __forceinline__ void load_forward_coefs(const float* coef, std::uint32_t channels, std::uint32_t c0,
                                                   float (&a)[V], float (&b)[V], float (&m)[V]) {
#pragma unroll
    for (int k = 0; k < V; ++k) a[k] = coef[c0 + k], b[k] = coef[channels + c0 + k], m[k] = coef[3 * channels + c0 + k];
}

// Backward: k, c1, c2, mean and beta.
template <int V>
__device__ __forceinline__ void load_backward_coefs(const float* coef, std::uint32_t channels, std::uint32_t c0,
                                                    float (&kk)[V], float (&c1)[V], float (&c2)[V], float (&m)[V],
                                                    float (&b)[V]) {
#pragma unroll
    for (int k = 0; k < V; ++k) {
        const std::uint32_t c = c0 + k;
        kk[k] = coef[c], c1[k] = coef[channels + c], c2[k] = coef[2 * channels + c], m[k] = coef[3 * channels + c],
        b[k] = coef[4 * channels + c];
    }
}

template <class T, int V>
__global__ void bn_apply_vec_kernel(const T* x, T* y, std::uint64_t groups, std::uint32_t channels, const float* coef,
                                    bool relu, const T* skip) {
    await_predecessor();
    const std::uint64_t g0 = blockIdx.x * std::uint64_t{blockDim.x} + threadIdx.x;
    const std::uint32_t c0 = static_cast<std::uint32_t>(g0 % (channels / V)) * V;
    float a[V], b[V], m[V];
    load_forward_coefs<V>(coef, channels, c0, a, b, m);
    for (std::uint64_t g = g0; g < groups; g += std::uint64_t{gridDim.x} * blockDim.x) {
        float v[V], s[V];
        ldv<V>(x, g * V, v);
        if (skip) ldv<V>(skip, g * V, s);
#pragma unroll
        for (int k = 0; k < V; ++k) {
            const float o = bn_value(v[k], m[k], a[k], b[k]);
            v[k] = relu ? fmaxf(o, 0.0f) : o;
            if (skip) v[k] = stored<T>(v[k]) + s[k];
        }
        stv<V>(y, g * V, v);
    }
}

template <class T, int V>
__global__ void bn_apply_backward_vec_kernel(const T* x, const T* dy, T* dx, std::uint64_t groups,
                                             std::uint32_t channels, const float* coef, bool relu) {
    await_predecessor();
    const std::uint64_t g0 = blockIdx.x * std::uint64_t{blockDim.x} + threadIdx.x;
    const std::uint32_t c0 = static_cast<std::uint32_t>(g0 % (channels / V)) * V;
    float kk[V], c1[V], c2[V], m[V], b[V];
    load_backward_coefs<V>(coef, channels, c0, kk, c1, c2, m, b);
    for (std::uint64_t g = g0; g < groups; g += std::uint64_t{gridDim.x} * blockDim.x) {
        float xv[V], gv[V];
        ldv<V>(x, g * V, xv);
        ldv<V>(dy, g * V, gv);
#pragma unroll
        for (int k = 0; k < V; ++k) gv[k] = bn_backward_value(xv[k], gv[k], kk[k], c1[k], c2[k], m[k], b[k], relu);
        stv<V>(dx, g * V, gv);
    }
}

// ---- batch norm + ReLU + 2x2 max-pool (stride 2), fused ----

// Output group o (one pixel, V channels) of the pooled [n][h/2][w/2][c]
// tensor and its window in the [n][h][w][c] input: the first pixel at base(o),
// the others at offset(1..3), row-major (the pooling layer's order).
struct PoolWindows {
    std::uint32_t count, groups, c, w, ow, oh; // count: output groups
    Div32 dgroups, dow, doh;
    __device__ __forceinline__ std::uint64_t base(std::uint32_t o, int v) const {
        const std::uint32_t pix = dgroups.div(o), gi = o - pix * groups;
        const std::uint32_t t = dow.div(pix), ox = pix - t * ow, nn = doh.div(t), oy = t - nn * oh;
        return ((std::uint64_t{nn} * (2 * oh) + 2 * oy) * w + 2 * ox) * c + std::uint64_t{gi} * v;
    }
    __device__ __forceinline__ std::uint64_t offset(int j) const {
        return (j >> 1) * std::uint64_t{w} * c + (j & 1) * std::uint64_t{c};
    }
};
PoolWindows pool_windows(std::uint32_t n, std::uint64_t h, std::uint32_t w, std::uint32_t c, int v) {
    PoolWindows p{};
    p.groups = c / static_cast<std::uint32_t>(v);
    p.c = c;
    p.w = w;
    p.ow = w / 2;
    p.oh = static_cast<std::uint32_t>(h / 2);
    p.count = n * p.oh * p.ow * p.groups;
    p.dgroups = Div32(p.groups);
    p.dow = Div32(p.ow);
    p.doh = Div32(p.oh);
    return p;
}

// The window's inputs, the maximum of relu(bn(x)) as stored, and the index of
// its first maximum per channel (the pooling layer's rule).
template <class T, int V>
__device__ __forceinline__ void window_max(const T* x, std::uint64_t base, const PoolWindows& p, const float (&m)[V],
                                           const float (&a)[V], const float (&b)[V], float (&xv)[4][V],
                                           float (&best)[V], int (&arg)[V]) {
#pragma unroll
    for (int j = 0; j < 4; ++j) ldv<V>(x, base + p.offset(j), xv[j]);
#pragma unroll
    for (int k = 0; k < V; ++k) {
        best[k] = stored<T>(fmaxf(bn_value(xv[0][k], m[k], a[k], b[k]), 0.0f));
        arg[k] = 0;
    }
#pragma unroll
    for (int j = 1; j < 4; ++j)
#pragma unroll
        for (int k = 0; k < V; ++k) {
            const float v = stored<T>(fmaxf(bn_value(xv[j][k], m[k], a[k], b[k]), 0.0f));
            if (v > best[k]) best[k] = v, arg[k] = j;
        }
}

// Forward: y (pooled) = max over each window of relu(bn(x)); the full-size
// output is never written.
template <class T, int V> __global__ void bn_apply_pool_kernel(const T* x, T* y, PoolWindows p, const float* coef) {
    await_predecessor();
    const std::uint64_t g0 = blockIdx.x * std::uint64_t{blockDim.x} + threadIdx.x;
    const std::uint32_t c0 = static_cast<std::uint32_t>(g0 % p.groups) * V;
    float a[V], b[V], m[V];
    load_forward_coefs<V>(coef, p.c, c0, a, b, m);
    for (std::uint64_t o = g0; o < p.count; o += std::uint64_t{gridDim.x} * blockDim.x) {
        float xv[4][V], best[V];
        int arg[V];
        window_max<T, V>(x, p.base(static_cast<std::uint32_t>(o), V), p, m, a, b, xv, best, arg);
        stv<V>(y, o * V, best);
    }
}

// The gradient reaching pixel j of a window: the pooled gradient at the
// first maximum, masked where the ReLU was off.
template <int V>
__device__ __forceinline__ float pooled_grad(int j, int k, const int (&arg)[V], const float (&gp)[V],
                                             const float (&xv)[4][V], const float (&m)[V], const float (&a)[V],
                                             const float (&b)[V]) {
    return arg[k] == j && bn_value(xv[j][k], m[k], a[k], b[k]) > 0.0f ? gp[k] : 0.0f;
}

// Backward reduction from the pooled gradient dp: split s covers a range of
// pooled pixels; the sums are bn_reduce_vec_kernel's.
template <class T, int V>
__global__ void bn_reduce_pool_kernel(const T* x, const T* dp, BnRefs r, PoolWindows p, double* partials) {
    await_predecessor();
    extern __shared__ float shf[];
    const std::uint32_t s = blockIdx.x, splits = gridDim.x, t = threadIdx.x, nt = blockDim.x;
    const std::uint64_t pixels = p.count / p.groups;
    const std::uint64_t o0 = pixels * s / splits * p.groups, o1 = pixels * (s + 1) / splits * p.groups;
    const std::uint32_t c0 = (t % p.groups) * V;
    float m[V], is[V], a[V], b[V], sa[V], sb[V];
#pragma unroll
    for (int k = 0; k < V; ++k) {
        const std::uint32_t c = c0 + k;
        m[k] = r.mean[c];
        is[k] = r.invstd[c];
        a[k] = r.gamma[c] * is[k];
        b[k] = r.beta[c];
        sa[k] = sb[k] = 0.0f;
    }
    for (std::uint64_t o = o0 + t; o < o1; o += nt) {
        float xv[4][V], best[V], gp[V];
        int arg[V];
        window_max<T, V>(x, p.base(static_cast<std::uint32_t>(o), V), p, m, a, b, xv, best, arg);
        ldv<V>(dp, o * V, gp);
#pragma unroll
        for (int j = 0; j < 4; ++j)
#pragma unroll
            for (int k = 0; k < V; ++k) {
                const float g = pooled_grad<V>(j, k, arg, gp, xv, m, a, b);
                sa[k] += g;
                sb[k] += g * (xv[j][k] - m[k]) * is[k];
            }
    }
    block_partials<V>(sa, sb, p.groups, p.c, shf, partials);
}

// Backward element-wise pass from the pooled gradient: every pixel of every
// window gets its dx.
template <class T, int V>
__global__ void bn_apply_backward_pool_kernel(const T* x, const T* dp, T* dx, PoolWindows p, const float* coef) {
    await_predecessor();
    const std::uint64_t g0 = blockIdx.x * std::uint64_t{blockDim.x} + threadIdx.x;
    const std::uint32_t c0 = static_cast<std::uint32_t>(g0 % p.groups) * V;
    float kk[V], c1[V], c2[V], m[V], b[V];
    load_backward_coefs<V>(coef, p.c, c0, kk, c1, c2, m, b);
    for (std::uint64_t o = g0; o < p.count; o += std::uint64_t{gridDim.x} * blockDim.x) {
        const std::uint64_t base = p.base(static_cast<std::uint32_t>(o), V);
        float xv[4][V], best[V], gp[V];
        int arg[V];
        window_max<T, V>(x, base, p, m, kk, b, xv, best, arg);
        ldv<V>(dp, o * V, gp);
#pragma unroll
        for (int j = 0; j < 4; ++j) {
            float out[V];
#pragma unroll
            for (int k = 0; k < V; ++k)
                out[k] = bn_backward_value(xv[j][k], pooled_grad<V>(j, k, arg, gp, xv, m, kk, b), kk[k], c1[k], c2[k],
                                           m[k], b[k], false);
            stv<V>(dx, base + p.offset(j), out);
        }
    }
}

} // namespace

bool bn_pool_fusable(ActType t, std::uint32_t c, std::uint64_t h, std::uint64_t w, std::uint32_t n) {
    const std::uint32_t v = t == ActType::bf16 ? 8 : 4, groups = c / v;
    if (c % v != 0 || h % 2 != 0 || w % 2 != 0 || h == 0 || w == 0) return false;
    if (!(threads % groups == 0 || (groups % 32 == 0 && groups <= 1024))) return false;
    return std::uint64_t{n} * (h / 2) * (w / 2) * groups < narrow_limit &&
           std::uint64_t{n} * h * w * c < (std::uint64_t{1} << 40);
}

std::uint64_t bn_partials(std::uint32_t channels) {
    return std::uint64_t{channels} * (bn_max_splits * 2 + 3);
}

namespace {

// NCHW splits per channel: enough blocks to fill the GPU, at least 2048 elements each.
unsigned bn_nchw_splits(std::uint32_t n, std::uint32_t c, std::uint64_t hw) {
    std::uint64_t sp = (528 + c - 1) / c;
    sp = std::min<std::uint64_t>(sp, std::max<std::uint64_t>(1, std::uint64_t{n} * hw / 2048));
    return static_cast<unsigned>(std::clamp<std::uint64_t>(sp, 1, 128));
}

// Block size for the 16-byte NHWC passes (a multiple of c / V), or 0 where
// they do not apply (c not a multiple of V, or pointers not 16-byte aligned).
template <class T> unsigned bn_vec_threads(std::uint32_t c, std::initializer_list<const void*> ptrs) {
    constexpr unsigned v = vec_of<T>;
    if (c % v != 0) return 0;
    for (const void* p : ptrs)
        if (p && !aligned16(p)) return 0;
    const unsigned g = c / v;
    if (threads % g == 0) return threads;
    if (g % 32 == 0 && g <= 1024) return g;
    return 0;
}

// The reduction pass of either layout; returns the split count.
template <class T>
unsigned bn_reduce(const T* x, const T* dy, const BnRefs& r, std::uint32_t n, std::uint64_t hw, std::uint32_t c,
                   bool nchw, double* partials, cudaStream_t s) {
    if (nchw) {
        const unsigned splits = bn_nchw_splits(n, c, hw);
        const bool narrow = std::uint64_t{n} * hw * c <= narrow_limit;
        launch_kernel(bn_reduce_nchw_kernel<T>, dim3(c, splits), threads, 0, s, x, dy, r, n, c, hw,
                      narrow ? Div32(hw) : Div32(), narrow, partials);
        return splits;
    }
    const std::uint64_t rows = std::uint64_t{n} * hw;
    const unsigned splits = bn_splits(rows);
    if (const unsigned nt = bn_vec_threads<T>(c, {x, dy})) {
        // About 8 vectors per thread, at most one wave of resident blocks (a
        // second wave would wait for the first one's tail).
        const std::uint64_t units = rows * (c / vec_of<T>);
        const std::uint64_t shared = std::uint64_t{nt} * vec_of<T> * 2 * sizeof(float);
        auto run = [&](auto kernel) {
            int per_sm = 1;
            CUDA_CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, kernel, static_cast<int>(nt), shared));
            const std::uint64_t wave = std::uint64_t{sm_count()} * static_cast<unsigned>(std::max(1, per_sm));
            const auto splits_v = static_cast<unsigned>(std::clamp<std::uint64_t>(
                (units + nt * 8 - 1) / (nt * 8), 1, std::min<std::uint64_t>(bn_max_splits, wave)));
            launch_kernel(kernel, splits_v, nt, shared, s, x, dy, r, rows, c, partials);
            return splits_v;
        };
        return dy ? run(bn_reduce_vec_kernel<T, vec_of<T>, true>) : run(bn_reduce_vec_kernel<T, vec_of<T>, false>);
    }
    const unsigned nt = channel_threads(c);
    launch_kernel(bn_reduce_kernel<T>, splits, nt, 2 * nt * sizeof(double), s, x, dy, r, rows, c, partials);
    return splits;
}

// Blocks of nt threads for an element-wise pass over `units` (elements or groups).
unsigned bn_blocks(std::uint64_t units, unsigned nt) {
    return std::max(1u, blocks_for(units, 4) * threads / nt);
}

// The fused BN + ReLU + 2x2 max-pool passes (bn_pool_fusable shapes).
template <class T>
void apply_pool(const T* x, T* y, std::uint32_t n, std::uint64_t hw, std::uint32_t c, std::uint32_t w,
                const float* coef, cudaStream_t s) {
    const unsigned nt = bn_vec_threads<T>(c, {x, y});
    if (!nt) throw std::logic_error("fused batch norm + max-pool on an unaligned tensor");
    const PoolWindows p = pool_windows(n, hw / w, w, c, vec_of<T>);
    launch_kernel(bn_apply_pool_kernel<T, vec_of<T>>, bn_blocks(p.count, nt), nt, 0, s, x, y, p, coef);
}

// The forward's element-wise pass (train and eval): pooled, 16-byte groups,
// or plain elements.
template <class T>
void bn_apply(const T* x, T* y, std::uint32_t n, std::uint64_t hw, std::uint32_t c, bool nchw, bool relu,
              const float* coef, std::uint32_t pool_w, const T* skip, cudaStream_t s) {
    const std::uint64_t count = std::uint64_t{n} * hw * c;
    if (pool_w && skip) throw std::logic_error("a residual's sum after a pooled batch norm");
    if (pool_w) {
        apply_pool(x, y, n, hw, c, pool_w, coef, s);
        return;
    }
    if (const unsigned nt = nchw ? 0 : bn_vec_threads<T>(c, {x, y, skip})) {
        const std::uint64_t groups = count / vec_of<T>;
        launch_kernel(bn_apply_vec_kernel<T, vec_of<T>>, bn_blocks(groups, nt), nt, 0, s, x, y, groups, c, coef, relu,
                      skip);
        return;
    }
    const unsigned nt = channel_threads(c);
    launch_kernel(bn_apply_kernel<T>, bn_blocks(count, nt), nt, 0, s, x, y, count, channels_of(c, hw, nchw, nt, count),
                  coef, relu, skip);
}

template <class T>
unsigned reduce_pool(const T* x, const T* dp, const BnRefs& r, std::uint32_t n, std::uint64_t hw, std::uint32_t c,
                     std::uint32_t w, double* partials, cudaStream_t s) {
    const unsigned nt = bn_vec_threads<T>(c, {x, dp});
    if (!nt) throw std::logic_error("fused batch norm + max-pool on an unaligned tensor");
    const PoolWindows p = pool_windows(n, hw / w, w, c, vec_of<T>);
    const std::uint64_t shared = std::uint64_t{nt} * vec_of<T> * 2 * sizeof(float);
    int per_sm = 1;
    CUDA_CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, bn_reduce_pool_kernel<T, vec_of<T>>,
                                                             static_cast<int>(nt), shared));
    const std::uint64_t wave = std::uint64_t{sm_count()} * static_cast<unsigned>(std::max(1, per_sm));
    const auto splits = static_cast<unsigned>(
        std::clamp<std::uint64_t>((p.count + nt * 2 - 1) / (nt * 2), 1, std::min<std::uint64_t>(bn_max_splits, wave)));
    launch_kernel(bn_reduce_pool_kernel<T, vec_of<T>>, splits, nt, shared, s, x, dp, r, p, partials);
    return splits;
}

} // namespace

unsigned bn_max_splits_of_partials() {
    return bn_max_splits;
}

void launch_bn_forward_train(const void* x, void* y, ActType t, std::uint32_t n, std::uint64_t hw, std::uint32_t c,
                             bool nchw, bool relu, const float* gamma, const float* beta, float* run_mean,
                             float* run_var, float* save_mean, float* save_invstd, double* partials, float momentum,
                             float eps, cudaStream_t s, std::uint32_t pool_w, unsigned given_splits, const void* skip) {
    const std::uint64_t rows = std::uint64_t{n} * hw;
    float* coef = bn_coef(partials, c);
    dispatch(t, [&](auto tag) {
        using T = DSTK_T;
        const T* xt = static_cast<const T*>(x);
        T* yt = static_cast<T*>(y);
        const unsigned splits =
            given_splits ? given_splits
                         : bn_reduce(xt, static_cast<const T*>(nullptr), BnRefs{}, n, hw, c, nchw, partials, s);
        launch_kernel(bn_finalize_forward_kernel<T>, c, 128, 0, s, xt, nchw ? hw : 1,
                      given_splits ? static_cast<const float*>(run_mean) : nullptr, c, splits,
                      static_cast<double>(rows), gamma, beta, run_mean, run_var, save_mean, save_invstd, partials, coef,
                      momentum, eps);
        bn_apply(xt, yt, n, hw, c, nchw, relu, coef, pool_w, static_cast<const T*>(skip), s);
    });
}

unsigned launch_bn_statistics(const void* x, ActType t, std::uint32_t n, std::uint64_t hw, std::uint32_t c, bool nchw,
                              double* partials, cudaStream_t s) {
    unsigned splits = 0;
    dispatch(t, [&](auto tag) {
        using T = DSTK_T;
        splits =
            bn_reduce(static_cast<const T*>(x), static_cast<const T*>(nullptr), BnRefs{}, n, hw, c, nchw, partials, s);
    });
    return splits;
}

void launch_bn_forward_eval(const void* x, void* y, ActType t, std::uint32_t n, std::uint64_t hw, std::uint32_t c,
                            bool nchw, bool relu, const float* gamma, const float* beta, const float* run_mean,
                            const float* run_var, float eps, double* partials, cudaStream_t s, std::uint32_t pool_w,
                            const void* skip) {
    float* coef = bn_coef(partials, c);
    launch_kernel(bn_eval_coef_kernel, (c + 127) / 128, 128, 0, s, c, gamma, beta, run_mean, run_var, eps, coef);
    dispatch(t, [&](auto tag) {
        using T = DSTK_T;
        const T* xt = static_cast<const T*>(x);
        T* yt = static_cast<T*>(y);
        bn_apply(xt, yt, n, hw, c, nchw, relu, coef, pool_w, static_cast<const T*>(skip), s);
    });
}

void launch_bn_backward(const void* x, const void* dy, bool relu, void* dx, ActType t, std::uint32_t n,
                        std::uint64_t hw, std::uint32_t c, bool nchw, const float* gamma, const float* beta,
                        const float* save_mean, const float* save_invstd, float* dgamma, float* dbeta, double* partials,
                        cudaStream_t s, std::uint32_t pool_w) {
    const std::uint64_t rows = std::uint64_t{n} * hw, count = rows * c;
    float* coef = bn_coef(partials, c);
    dispatch(t, [&](auto tag) {
        using T = DSTK_T;
        const T *xt = static_cast<const T*>(x), *dyt = static_cast<const T*>(dy);
        T* dxt = static_cast<T*>(dx);
        const BnRefs refs{gamma, beta, save_mean, save_invstd, relu};
        const unsigned splits = pool_w ? reduce_pool(xt, dyt, refs, n, hw, c, pool_w, partials, s)
                                       : bn_reduce(xt, dyt, refs, n, hw, c, nchw, partials, s);
        launch_kernel(bn_finalize_backward_kernel, c, 128, 0, s, c, splits, static_cast<double>(rows), gamma, beta,
                      save_mean, save_invstd, dgamma, dbeta, partials, coef);
        if (pool_w) {
            const unsigned nt = bn_vec_threads<T>(c, {x, dy, dx});
            const PoolWindows pw = pool_windows(n, hw / pool_w, pool_w, c, vec_of<T>);
            launch_kernel(bn_apply_backward_pool_kernel<T, vec_of<T>>, bn_blocks(pw.count, nt), nt, 0, s, xt, dyt, dxt,
                          pw, coef);
            return;
        }
        if (const unsigned nt = nchw ? 0 : bn_vec_threads<T>(c, {x, dy, dx})) {
            const std::uint64_t groups = count / vec_of<T>;
            launch_kernel(bn_apply_backward_vec_kernel<T, vec_of<T>>, bn_blocks(groups, nt), nt, 0, s, xt, dyt, dxt,
                          groups, c, coef, relu);
            return;
        }
        const unsigned nt = channel_threads(c);
        launch_kernel(bn_apply_backward_kernel<T>, bn_blocks(count, nt), nt, 0, s, xt, dyt, dxt, count,
                      channels_of(c, hw, nchw, nt, count), coef, relu);
    });
}

} // namespace dstk::train::cuda
