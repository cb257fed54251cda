#include <cuda_bf16.h>
#include <cuda_fp16.h>

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

void launch_advance_step(unsigned long long* step, cudaStream_t s) {
    advance_step_kernel<<<1, 1, 0, s>>>(step);
    check_launch();
}

} // namespace dstk::train::cuda
