// The classifier's last linear layer with its softmax cross-entropy
// (linear_xent.hpp): one warp per sample. For each class in turn the lanes sum
// their stride of the inputs against its weights and the warp adds the lanes
// up (lane j keeps class j's logit); the softmax and the gradient are a lane
// per class (as loss.cu's kernel computes them for k up to 32: the same
// merge, the same bits from the same logits); then each lane writes its
// stride of the input gradient, summed over the classes. The loops stay
// rolled: the kernel runs once per step for a few microseconds, and the code
// of fully unrolled classes, fetched cold by each SM, made it several times
// slower.
#include "linear_xent.hpp"

#include <stdexcept>

#include "launch_common.cuh"
#include "softmax_xent.cuh"

namespace dstk::train::cuda {
namespace {

constexpr int warps_per_block = threads / 32;

struct XentParams {
    const void *x, *w;
    const float* bias;
    const std::int32_t* labels;
    void *z, *dz, *dx;
    std::uint32_t n, k, in;
    float smoothing, weight;
    bool relu_mask;
    DeviceHeadMetrics* m;
    unsigned long long* first_nonfinite;
    const unsigned long long* step;
    bool w_vec = false; // the weights loadable 16 bytes at a time
};

__device__ __forceinline__ float warp_sum(float v) {
    for (int o = 16; o > 0; o /= 2) v += __shfl_xor_sync(~0u, v, o);
    return v;
}

// Inputs per lane held in registers at a time: a chunk of 32 * chunk inputs
// of the sample, loaded at once. A sample of up to 512 inputs is one chunk,
// loaded once: a larger sample is loaded again for each class.
constexpr int chunk = 16;

template <class T>
__device__ __forceinline__ void load_chunk(const T* xr, std::uint32_t c0, std::uint32_t in, unsigned lane,
                                           float (&xv)[chunk]) {
#pragma unroll
    for (int v = 0; v < chunk; ++v) {
        const std::uint32_t i = c0 + lane + 32u * v;
        xv[v] = i < in ? ld(xr, i) : 0.0f;
    }
}

// The logit of this lane's class (lane < k; 0 on the other lanes), from the
// weights in shared memory (ws, [k][in] as float); xv holds the first chunk
// of inputs (the only one where in <= 32 * chunk).
template <class T>
__device__ __forceinline__ float logit(const XentParams& a, const T* xr, const float* ws, unsigned lane,
                                       float (&xv)[chunk]) {
    float mine = 0.0f;
#pragma unroll 2
    for (std::uint32_t j = 0; j < a.k; ++j) {
        float p = 0.0f;
        for (std::uint32_t c0 = 0; c0 < a.in; c0 += 32 * chunk) {
            if (a.in > 32 * chunk) load_chunk(xr, c0, a.in, lane, xv);
#pragma unroll
            for (int v = 0; v < chunk; ++v) {
                const std::uint32_t i = c0 + lane + 32u * v;
                if (i < a.in) p += xv[v] * ws[j * a.in + i];
            }
        }
        p = warp_sum(p);
        if (lane == j) mine = p;
    }
    return mine + (a.bias && lane < a.k ? a.bias[lane] : 0.0f);
}

// dx of one sample: each lane's inputs, summed over the classes in order (g:
// the classes' gradients), masked by the ReLU; xv as logit() left it.
template <class T>
__device__ __forceinline__ void input_gradient(const XentParams& a, std::uint32_t s, const T* xr, const float* ws,
                                               const float* g, unsigned lane, float (&xv)[chunk]) {
    T* dx = static_cast<T*>(a.dx) + std::uint64_t{s} * a.in;
    for (std::uint32_t c0 = 0; c0 < a.in; c0 += 32 * chunk) {
        if (a.in > 32 * chunk) load_chunk(xr, c0, a.in, lane, xv);
        float d[chunk] = {};
        for (std::uint32_t j = 0; j < a.k; ++j) {
            const float gj = g[j];
#pragma unroll
            for (int v = 0; v < chunk; ++v) {
                const std::uint32_t i = c0 + lane + 32u * v;
                if (i < a.in) d[v] += gj * ws[j * a.in + i];
            }
        }
#pragma unroll
        for (int v = 0; v < chunk; ++v) {
            const std::uint32_t i = c0 + lane + 32u * v;
            if (i < a.in) st(dx, i, a.relu_mask && !(xv[v] > 0.0f) ? 0.0f : d[v]);
        }
    }
}

// The softmax cross-entropy of the sample whose logit v this lane holds
// (lane < k), as loss.cu's kernel: its figures, and its gradient (as stored).
struct XentSample {
    double loss = 0.0;
    unsigned correct = 0, top5 = 0, bad = 0;
    float grad = 0.0f;
};
template <class T>
__device__ __forceinline__ XentSample softmax_xent(const XentParams& a, float v, std::int32_t label, unsigned lane) {
    XentSample r;
    const bool live = lane < a.k;
    if (label < 0 || static_cast<std::uint32_t>(label) >= a.k) {
        r.bad = 1;
        return r;
    }
    const float zl = __shfl_sync(~0u, v, static_cast<unsigned>(label));
    float mx = live ? v : -INFINITY, sum = live ? 1.0f : 0.0f;
    // classes ahead of the label (ties: those before it), as argmax picks the first
    const unsigned rank = __popc(__ballot_sync(~0u, live && (v > zl || (v == zl && lane < unsigned(label)))));
    for (int o = 16; o > 0; o /= 2) online_merge(mx, sum, __shfl_xor_sync(~0u, mx, o), __shfl_xor_sync(~0u, sum, o));
    const float lse = logf(sum) + mx, l = lse - zl;
    r.loss = l;
    r.correct = isfinite(l) && rank == 0; // (loss.cu: a NaN logit's comparisons are false)
    r.top5 = isfinite(l) && rank < 5;
    if (lane == 0 && (!isfinite(l) || !isfinite(mx))) atomicMin(a.first_nonfinite, *a.step);
    const float scale = a.weight / static_cast<float>(a.n), off = a.smoothing / static_cast<float>(a.k);
    const float q = (lane == static_cast<unsigned>(label) ? 1.0f - a.smoothing : 0.0f) + off;
    r.grad = live ? stored<T>((__expf(v - lse) - q) * scale) : 0.0f;
    return r;
}

// The weights as float into shared memory, 16 bytes a load where w_vec says
// they allow it: the one load every block makes before its first product.
template <class W> __device__ __forceinline__ void stage_weights(const W* w, std::uint32_t count, bool vec, float* ws) {
    constexpr int v = vec_of<W>;
    if (!vec) {
        for (std::uint32_t e = threadIdx.x; e < count; e += blockDim.x) ws[e] = ld(w, e);
        return;
    }
    for (std::uint32_t g = threadIdx.x; g < count / v; g += blockDim.x) {
        float f[v];
        ldv<v>(w, std::uint64_t{g} * v, f);
#pragma unroll
        for (int k = 0; k < v; ++k) ws[g * v + k] = f[k];
    }
}

template <class T, class W> __global__ void linear_xent_kernel(XentParams a) {
    await_predecessor();
    extern __shared__ float ws[]; // [k][in]: the weights as float
    __shared__ float grads[warps_per_block][32];
    const unsigned warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    const std::uint32_t s = blockIdx.x * warps_per_block + warp;
    const bool here = s < a.n; // the whole warp
    const T* xr = static_cast<const T*>(a.x) + std::uint64_t{here ? s : 0} * a.in;
    // The sample's first inputs and label load while the block stages the weights.
    float xv[chunk];
    load_chunk(xr, 0, here ? a.in : 0, lane, xv);
    const std::int32_t label = here ? a.labels[s] : 0;
    stage_weights(static_cast<const W*>(a.w), a.k * a.in, a.w_vec, ws);
    __syncthreads();
    XentSample r;
    if (here) {
        const std::uint64_t row = std::uint64_t{s} * a.k;
        const float v = stored<T>(logit<T>(a, xr, ws, lane, xv));
        if (lane < a.k) st(static_cast<T*>(a.z), row + lane, v);
        r = softmax_xent<T>(a, v, label, lane);
        if (a.dz) {
            if (lane < a.k) st(static_cast<T*>(a.dz), row + lane, r.grad);
            grads[warp][lane] = r.grad;
            __syncwarp();
            if (a.dx) input_gradient<T>(a, s, xr, ws, grads[warp], lane, xv);
        }
    }
    add_ce_metrics<warps_per_block>(r.loss, r.correct, r.top5, r.bad, a.m);
}

} // namespace

bool linear_xent_takes(std::uint32_t classes, std::uint32_t inputs) {
    return classes >= 1 && classes <= 32 && inputs >= 1 &&
           std::uint64_t{classes} * inputs * sizeof(float) <= linear_xent_max_weight_bytes;
}

void launch_linear_xent(const HeadLossArgs& a, const LinearXentArgs& l, ActType t, cudaStream_t s) {
    if (a.loss != LossKind::ce || !linear_xent_takes(a.k, l.in))
        throw std::logic_error("launch_linear_xent: a softmax cross-entropy of a shape linear_xent_takes refuses");
    XentParams p{l.x, l.w,  l.bias,      a.labels, l.z,         a.dz, a.dz ? l.dx : nullptr, a.n,
                 a.k, l.in, a.smoothing, a.weight, l.relu_mask, a.m,  a.first_nonfinite,     a.step};
    const unsigned grid = (p.n + warps_per_block - 1) / warps_per_block;
    const std::size_t shared = std::size_t{p.k} * p.in * sizeof(float);
    dispatch(t, [&](auto tag) {
        using T = DSTK_T;
        p.w_vec = aligned16(l.w) && std::uint64_t{p.k} * p.in % (l.w_act ? vec_of<T> : vec_of<float>) == 0;
        if (l.w_act)
            launch_kernel(linear_xent_kernel<T, T>, grid, threads, shared, s, p);
        else
            launch_kernel(linear_xent_kernel<T, float>, grid, threads, shared, s, p);
    });
}

} // namespace dstk::train::cuda
