#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <algorithm>

#include "cuda_check.hpp"
#include "dstk/rng.hpp"
#include "kernels.hpp"

namespace dstk::train::cuda {
namespace {

constexpr int threads = 256;

unsigned blocks_for(std::uint64_t count, std::uint64_t per_thread = 1) {
    const std::uint64_t b = (count + threads * per_thread - 1) / (threads * per_thread);
    return static_cast<unsigned>(b < 1 ? 1 : (b > 65535u * 16 ? 65535u * 16 : b));
}

template <class T> __device__ float load_as_float(const T* p, std::uint64_t i);
template <> __device__ float load_as_float(const std::uint8_t* p, std::uint64_t i) {
    return p[i];
}
template <> __device__ float load_as_float(const float* p, std::uint64_t i) {
    return p[i];
}
template <> __device__ float load_as_float(const __nv_bfloat16* p, std::uint64_t i) {
    return __bfloat162float(p[i]);
}
template <> __device__ float load_as_float(const __half* p, std::uint64_t i) {
    return __half2float(p[i]);
}

template <class T>
__global__ void convert_kernel(const T* x, const std::int32_t* labels, std::uint32_t n, std::uint32_t channels,
                               std::uint64_t hw, const float* mean, const float* inv_std, float* out,
                               std::int32_t* labels_out) {
    const std::uint64_t total = std::uint64_t{n} * channels * hw;
    for (std::uint64_t i = blockIdx.x * std::uint64_t{blockDim.x} + threadIdx.x; i < total;
         i += std::uint64_t{gridDim.x} * blockDim.x) {
        const auto c = static_cast<std::uint32_t>((i / hw) % channels);
        out[i] = (load_as_float(x, i) - mean[c]) * inv_std[c];
        if (i < n) labels_out[i] = labels[i];
    }
}

__global__ void add_bias_kernel(float* y, const float* bias, std::uint64_t total, std::uint32_t c, std::uint64_t hw) {
    for (std::uint64_t i = blockIdx.x * std::uint64_t{blockDim.x} + threadIdx.x; i < total;
         i += std::uint64_t{gridDim.x} * blockDim.x)
        y[i] += bias[(i / hw) % c];
}

__global__ void bias_grad_kernel(const float* dy, float* db, std::uint64_t n, std::uint32_t c, std::uint64_t hw) {
    __shared__ float part[threads];
    const std::uint32_t ch = blockIdx.x;
    float acc = 0.0f;
    for (std::uint64_t j = threadIdx.x; j < n * hw; j += blockDim.x) {
        const std::uint64_t s = j / hw, k = j % hw;
        acc += dy[(s * c + ch) * hw + k];
    }
    part[threadIdx.x] = acc;
    __syncthreads();
    for (int w = threads / 2; w > 0; w /= 2) {
        if (threadIdx.x < w) part[threadIdx.x] += part[threadIdx.x + w];
        __syncthreads();
    }
    if (threadIdx.x == 0) db[ch] = part[0];
}

__global__ void add_kernel(const float* a, const float* b, float* out, std::uint64_t count) {
    for (std::uint64_t i = blockIdx.x * std::uint64_t{blockDim.x} + threadIdx.x; i < count;
         i += std::uint64_t{gridDim.x} * blockDim.x)
        out[i] = a[i] + b[i];
}

__global__ void mul_kernel(const float* a, const float* b, float* out, std::uint64_t count) {
    for (std::uint64_t i = blockIdx.x * std::uint64_t{blockDim.x} + threadIdx.x; i < count;
         i += std::uint64_t{gridDim.x} * blockDim.x)
        out[i] = a[i] * b[i];
}

__global__ void dropout_kernel(const float* x, float* y, float* mask, std::uint64_t count, float p, std::uint64_t seed,
                               std::uint64_t layer, const unsigned long long* step) {
    const std::uint64_t stream = (layer << 40) ^ static_cast<std::uint64_t>(*step);
    const auto threshold = static_cast<std::uint32_t>(static_cast<double>(p) * 4294967296.0);
    const float scale = 1.0f / (1.0f - p);
    for (std::uint64_t i = blockIdx.x * std::uint64_t{blockDim.x} + threadIdx.x; i < count;
         i += std::uint64_t{gridDim.x} * blockDim.x) {
        const float m = philox(seed, stream, i)[0] >= threshold ? scale : 0.0f;
        mask[i] = m;
        y[i] = x[i] * m;
    }
}

__global__ void softmax_xent_kernel(const float* logits, const std::int32_t* labels, std::uint32_t n, std::uint32_t k,
                                    float smoothing, float* dlogits, DeviceMetrics* m, const unsigned long long* step) {
    __shared__ double loss_part[threads];
    __shared__ unsigned correct_part[threads];
    const std::uint32_t s = blockIdx.x * blockDim.x + threadIdx.x;
    double loss = 0.0;
    unsigned correct = 0;
    if (s < n) {
        const float* z = logits + std::uint64_t{s} * k;
        const std::int32_t label = labels[s];
        float zmax = z[0];
        std::uint32_t arg = 0;
        for (std::uint32_t j = 1; j < k; ++j)
            if (z[j] > zmax) zmax = z[j], arg = j;
        float denom = 0.0f;
        for (std::uint32_t j = 0; j < k; ++j) denom += __expf(z[j] - zmax);
        const float lse = logf(denom) + zmax;
        const float l = lse - z[label];
        loss = l;
        correct = arg == static_cast<std::uint32_t>(label);
        if (!isfinite(l) || !isfinite(zmax)) atomicMin(&m->first_nonfinite, *step);
        if (dlogits) {
            const float inv_n = 1.0f / static_cast<float>(n), off = smoothing / static_cast<float>(k);
            float* g = dlogits + std::uint64_t{s} * k;
            for (std::uint32_t j = 0; j < k; ++j) {
                const float q = (j == static_cast<std::uint32_t>(label) ? 1.0f - smoothing : 0.0f) + off;
                g[j] = (__expf(z[j] - lse) - q) * inv_n;
            }
        }
    }
    loss_part[threadIdx.x] = loss;
    correct_part[threadIdx.x] = correct;
    __syncthreads();
    for (int w = threads / 2; w > 0; w /= 2) {
        if (threadIdx.x < w) {
            loss_part[threadIdx.x] += loss_part[threadIdx.x + w];
            correct_part[threadIdx.x] += correct_part[threadIdx.x + w];
        }
        __syncthreads();
    }
    if (threadIdx.x == 0) {
        atomicAdd(&m->loss_sum, loss_part[0]);
        atomicAdd(&m->correct, static_cast<unsigned long long>(correct_part[0]));
    }
}

// learning_rate() of optimizer.cpp, on the device.
__device__ float device_lr(float base, ScheduleConfig s, std::uint64_t step) {
    double lr = base;
    if (s.warmup_steps > 0 && step < s.warmup_steps)
        return static_cast<float>(lr * static_cast<double>(step + 1) / static_cast<double>(s.warmup_steps));
    if (s.kind == ScheduleKind::step) {
        if (s.step_every > 0) lr *= pow(static_cast<double>(s.gamma), static_cast<double>(step / s.step_every));
    } else if (s.kind == ScheduleKind::cosine && s.total_steps > s.warmup_steps) {
        const double t =
            fmin(1.0, static_cast<double>(step - s.warmup_steps) / static_cast<double>(s.total_steps - s.warmup_steps));
        lr *= 0.5 * (1.0 + cos(3.14159265358979323846 * t));
    }
    return static_cast<float>(lr);
}

__global__ void sgd_kernel(OptimizerConfig o, ScheduleConfig sched, float* p, const float* g, float* m,
                           std::uint64_t count, const unsigned long long* step) {
    __shared__ float lr;
    if (threadIdx.x == 0) lr = device_lr(o.lr, sched, *step);
    __syncthreads();
    for (std::uint64_t i = blockIdx.x * std::uint64_t{blockDim.x} + threadIdx.x; i < count;
         i += std::uint64_t{gridDim.x} * blockDim.x) {
        const float pi = p[i];
        const float gi = g[i] + o.weight_decay * pi;
        const float mi = o.momentum * m[i] + gi;
        m[i] = mi;
        p[i] = pi - lr * (o.nesterov ? gi + o.momentum * mi : mi);
    }
}

__global__ void adamw_kernel(OptimizerConfig o, ScheduleConfig sched, float* p, const float* g, float* m, float* v,
                             std::uint64_t count, const unsigned long long* step) {
    __shared__ float lr, c1, c2;
    if (threadIdx.x == 0) {
        lr = device_lr(o.lr, sched, *step);
        const float t = static_cast<float>(*step + 1);
        c1 = 1.0f - powf(o.beta1, t);
        c2 = 1.0f - powf(o.beta2, t);
    }
    __syncthreads();
    const float decay = 1.0f - lr * o.weight_decay;
    for (std::uint64_t i = blockIdx.x * std::uint64_t{blockDim.x} + threadIdx.x; i < count;
         i += std::uint64_t{gridDim.x} * blockDim.x) {
        const float gi = g[i];
        const float mi = o.beta1 * m[i] + (1.0f - o.beta1) * gi;
        const float vi = o.beta2 * v[i] + (1.0f - o.beta2) * gi * gi;
        m[i] = mi;
        v[i] = vi;
        p[i] = p[i] * decay - lr * (mi / c1) / (sqrtf(vi / c2) + o.eps);
    }
}

constexpr unsigned bn_max_splits = 128;

// Splits per channel: enough blocks to fill the GPU, at least 2048 elements each.
unsigned bn_splits(std::uint32_t n, std::uint32_t c, std::uint64_t hw) {
    const std::uint64_t per_channel = std::uint64_t{n} * hw;
    std::uint64_t s = (528 + c - 1) / c;
    s = std::min<std::uint64_t>(s, std::max<std::uint64_t>(1, per_channel / 2048));
    return static_cast<unsigned>(std::clamp<std::uint64_t>(s, 1, bn_max_splits));
}

__device__ inline std::uint64_t bn_index(std::uint64_t e, std::uint32_t c, std::uint32_t channels, std::uint64_t hw) {
    return ((e / hw) * channels + c) * hw + e % hw;
}

__device__ void block_sum2(double& a, double& b) {
    __shared__ double sa[threads], sb[threads];
    sa[threadIdx.x] = a;
    sb[threadIdx.x] = b;
    __syncthreads();
    for (int w = threads / 2; w > 0; w /= 2) {
        if (threadIdx.x < w) {
            sa[threadIdx.x] += sa[threadIdx.x + w];
            sb[threadIdx.x] += sb[threadIdx.x + w];
        }
        __syncthreads();
    }
    a = sa[0];
    b = sb[0];
}

// Partial sums of (v, v*v) or, backward, (dy, dy*xhat) for block (channel, split).
__global__ void bn_reduce_kernel(const float* x, const float* dy, std::uint32_t n, std::uint32_t channels,
                                 std::uint64_t hw, const float* save_mean, const float* save_invstd, double* partials) {
    const std::uint32_t c = blockIdx.x, s = blockIdx.y, splits = gridDim.y;
    const std::uint64_t total = std::uint64_t{n} * hw;
    const std::uint64_t e0 = total * s / splits, e1 = total * (s + 1) / splits;
    float a = 0.0f, b = 0.0f;
    if (!dy) {
        for (std::uint64_t e = e0 + threadIdx.x; e < e1; e += blockDim.x) {
            const float v = x[bn_index(e, c, channels, hw)];
            a += v;
            b += v * v;
        }
    } else {
        const float m = save_mean[c], is = save_invstd[c];
        for (std::uint64_t e = e0 + threadIdx.x; e < e1; e += blockDim.x) {
            const std::uint64_t i = bn_index(e, c, channels, hw);
            const float g = dy[i];
            a += g;
            b += g * (x[i] - m) * is;
        }
    }
    double da = a, db = b;
    block_sum2(da, db);
    if (threadIdx.x == 0) {
        partials[(std::uint64_t{c} * splits + s) * 2] = da;
        partials[(std::uint64_t{c} * splits + s) * 2 + 1] = db;
    }
}

__device__ void channel_totals(const double* partials, std::uint32_t c, std::uint32_t splits, double& a, double& b) {
    a = 0.0;
    b = 0.0;
    for (std::uint32_t s = 0; s < splits; ++s) {
        a += partials[(std::uint64_t{c} * splits + s) * 2];
        b += partials[(std::uint64_t{c} * splits + s) * 2 + 1];
    }
}

__global__ void bn_apply_train_kernel(const float* x, float* y, std::uint32_t n, std::uint32_t channels,
                                      std::uint64_t hw, const float* gamma, const float* beta, float* run_mean,
                                      float* run_var, float* save_mean, float* save_invstd, const double* partials,
                                      float momentum, float eps) {
    __shared__ float sa, sb;
    const std::uint32_t c = blockIdx.x, s = blockIdx.y, splits = gridDim.y;
    const std::uint64_t total = std::uint64_t{n} * hw;
    if (threadIdx.x == 0) {
        double sum, sq;
        channel_totals(partials, c, splits, sum, sq);
        const double cnt = static_cast<double>(total), mean = sum / cnt;
        const double var = fmax(0.0, sq / cnt - mean * mean);
        const float is = static_cast<float>(1.0 / sqrt(var + eps));
        sa = gamma[c] * is;
        sb = beta[c] - static_cast<float>(mean) * sa;
        if (s == 0) {
            save_mean[c] = static_cast<float>(mean);
            save_invstd[c] = is;
            const double unbiased = cnt > 1 ? var * cnt / (cnt - 1) : var;
            run_mean[c] = (1.0f - momentum) * run_mean[c] + momentum * static_cast<float>(mean);
            run_var[c] = (1.0f - momentum) * run_var[c] + momentum * static_cast<float>(unbiased);
        }
    }
    __syncthreads();
    const float a = sa, b = sb;
    const std::uint64_t e0 = total * s / splits, e1 = total * (s + 1) / splits;
    for (std::uint64_t e = e0 + threadIdx.x; e < e1; e += blockDim.x) {
        const std::uint64_t i = bn_index(e, c, channels, hw);
        y[i] = x[i] * a + b;
    }
}

__global__ void bn_apply_backward_kernel(const float* x, const float* dy, float* dx, std::uint32_t n,
                                         std::uint32_t channels, std::uint64_t hw, const float* gamma,
                                         const float* save_mean, const float* save_invstd, float* dgamma, float* dbeta,
                                         const double* partials) {
    __shared__ float sk, sm1, sm2;
    const std::uint32_t c = blockIdx.x, s = blockIdx.y, splits = gridDim.y;
    const std::uint64_t total = std::uint64_t{n} * hw;
    if (threadIdx.x == 0) {
        double sg, sgx;
        channel_totals(partials, c, splits, sg, sgx);
        if (s == 0) {
            dgamma[c] = static_cast<float>(sgx);
            dbeta[c] = static_cast<float>(sg);
        }
        sk = gamma[c] * save_invstd[c];
        sm1 = static_cast<float>(sg / static_cast<double>(total));
        sm2 = static_cast<float>(sgx / static_cast<double>(total));
    }
    __syncthreads();
    const float k = sk, m1 = sm1, m2 = sm2, m = save_mean[c], is = save_invstd[c];
    const std::uint64_t e0 = total * s / splits, e1 = total * (s + 1) / splits;
    for (std::uint64_t e = e0 + threadIdx.x; e < e1; e += blockDim.x) {
        const std::uint64_t i = bn_index(e, c, channels, hw);
        dx[i] = k * (dy[i] - m1 - (x[i] - m) * is * m2);
    }
}

__global__ void bn_eval_kernel(const float* x, float* y, std::uint64_t count, std::uint32_t channels, std::uint64_t hw,
                               const float* gamma, const float* beta, const float* run_mean, const float* run_var,
                               float eps) {
    for (std::uint64_t i = blockIdx.x * std::uint64_t{blockDim.x} + threadIdx.x; i < count;
         i += std::uint64_t{gridDim.x} * blockDim.x) {
        const auto c = static_cast<std::uint32_t>((i / hw) % channels);
        const float a = gamma[c] / sqrtf(run_var[c] + eps);
        y[i] = (x[i] - run_mean[c]) * a + beta[c];
    }
}

__global__ void advance_step_kernel(unsigned long long* step) {
    *step += 1;
}

void check_launch() {
    CUDA_CHECK(cudaGetLastError());
}

} // namespace

void launch_convert_input(const void* x, DType dtype, const std::int32_t* labels, std::uint32_t n,
                          std::uint32_t channels, std::uint64_t hw, const float* mean, const float* inv_std, float* out,
                          std::int32_t* labels_out, cudaStream_t s) {
    const std::uint64_t total = std::uint64_t{n} * channels * hw;
    const unsigned b = blocks_for(total, 4);
    switch (dtype) {
    case DType::u8:
        convert_kernel<<<b, threads, 0, s>>>(static_cast<const std::uint8_t*>(x), labels, n, channels, hw, mean,
                                             inv_std, out, labels_out);
        break;
    case DType::bf16:
        convert_kernel<<<b, threads, 0, s>>>(static_cast<const __nv_bfloat16*>(x), labels, n, channels, hw, mean,
                                             inv_std, out, labels_out);
        break;
    case DType::f16:
        convert_kernel<<<b, threads, 0, s>>>(static_cast<const __half*>(x), labels, n, channels, hw, mean, inv_std, out,
                                             labels_out);
        break;
    default:
        convert_kernel<<<b, threads, 0, s>>>(static_cast<const float*>(x), labels, n, channels, hw, mean, inv_std, out,
                                             labels_out);
        break;
    }
    check_launch();
}

void launch_add_bias(float* y, const float* bias, std::uint64_t n, std::uint32_t c, std::uint64_t hw, cudaStream_t s) {
    const std::uint64_t total = n * c * hw;
    add_bias_kernel<<<blocks_for(total, 4), threads, 0, s>>>(y, bias, total, c, hw);
    check_launch();
}

void launch_bias_grad(const float* dy, float* db, std::uint64_t n, std::uint32_t c, std::uint64_t hw, cudaStream_t s) {
    bias_grad_kernel<<<c, threads, 0, s>>>(dy, db, n, c, hw);
    check_launch();
}

void launch_add(const float* a, const float* b, float* out, std::uint64_t count, cudaStream_t s) {
    add_kernel<<<blocks_for(count, 4), threads, 0, s>>>(a, b, out, count);
    check_launch();
}

void launch_copy(const float* a, float* out, std::uint64_t count, cudaStream_t s) {
    CUDA_CHECK(cudaMemcpyAsync(out, a, count * sizeof(float), cudaMemcpyDeviceToDevice, s));
}

void launch_mul(const float* a, const float* b, float* out, std::uint64_t count, cudaStream_t s) {
    mul_kernel<<<blocks_for(count, 4), threads, 0, s>>>(a, b, out, count);
    check_launch();
}

void launch_dropout_forward(const float* x, float* y, float* mask, std::uint64_t count, float p, std::uint64_t seed,
                            std::uint64_t layer, const unsigned long long* step, cudaStream_t s) {
    dropout_kernel<<<blocks_for(count, 4), threads, 0, s>>>(x, y, mask, count, p, seed, layer, step);
    check_launch();
}

void launch_softmax_xent(const float* logits, const std::int32_t* labels, std::uint32_t n, std::uint32_t k,
                         float smoothing, float* dlogits, DeviceMetrics* m, const unsigned long long* step,
                         cudaStream_t s) {
    softmax_xent_kernel<<<(n + threads - 1) / threads, threads, 0, s>>>(logits, labels, n, k, smoothing, dlogits, m,
                                                                        step);
    check_launch();
}

void launch_optimizer(const OptimizerConfig& o, const ScheduleConfig& sched, float* params, const float* grads,
                      float* slots, std::uint64_t count, const unsigned long long* step, cudaStream_t s) {
    const unsigned b = blocks_for(count, 4);
    if (o.kind == OptimizerKind::sgd)
        sgd_kernel<<<b, threads, 0, s>>>(o, sched, params, grads, slots, count, step);
    else
        adamw_kernel<<<b, threads, 0, s>>>(o, sched, params, grads, slots, slots + count, count, step);
    check_launch();
}

std::uint64_t bn_partials(std::uint32_t channels) {
    return std::uint64_t{channels} * bn_max_splits * 2;
}

void launch_bn_forward_train(const float* x, float* y, std::uint32_t n, std::uint32_t c, std::uint64_t hw,
                             const float* gamma, const float* beta, float* run_mean, float* run_var, float* save_mean,
                             float* save_invstd, double* partials, float momentum, float eps, cudaStream_t s) {
    const dim3 grid(c, bn_splits(n, c, hw));
    bn_reduce_kernel<<<grid, threads, 0, s>>>(x, nullptr, n, c, hw, nullptr, nullptr, partials);
    check_launch();
    bn_apply_train_kernel<<<grid, threads, 0, s>>>(x, y, n, c, hw, gamma, beta, run_mean, run_var, save_mean,
                                                   save_invstd, partials, momentum, eps);
    check_launch();
}

void launch_bn_forward_eval(const float* x, float* y, std::uint32_t n, std::uint32_t c, std::uint64_t hw,
                            const float* gamma, const float* beta, const float* run_mean, const float* run_var,
                            float eps, cudaStream_t s) {
    const std::uint64_t count = std::uint64_t{n} * c * hw;
    bn_eval_kernel<<<blocks_for(count, 4), threads, 0, s>>>(x, y, count, c, hw, gamma, beta, run_mean, run_var, eps);
    check_launch();
}

void launch_bn_backward(const float* x, const float* dy, float* dx, std::uint32_t n, std::uint32_t c, std::uint64_t hw,
                        const float* gamma, const float* save_mean, const float* save_invstd, float* dgamma,
                        float* dbeta, double* partials, cudaStream_t s) {
    const dim3 grid(c, bn_splits(n, c, hw));
    bn_reduce_kernel<<<grid, threads, 0, s>>>(x, dy, n, c, hw, save_mean, save_invstd, partials);
    check_launch();
    bn_apply_backward_kernel<<<grid, threads, 0, s>>>(x, dy, dx, n, c, hw, gamma, save_mean, save_invstd, dgamma, dbeta,
                                                      partials);
    check_launch();
}

void launch_advance_step(unsigned long long* step, cudaStream_t s) {
    advance_step_kernel<<<1, 1, 0, s>>>(step);
    check_launch();
}

} // namespace dstk::train::cuda
