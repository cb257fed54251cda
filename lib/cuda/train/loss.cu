// Softmax cross-entropy with the metrics counters.
#include "loss.hpp"

#include "launch_common.cuh"

namespace dstk::train::cuda {
namespace {

template <class T>
__global__ void softmax_xent_kernel(const T* logits, const std::int32_t* labels, std::uint32_t n, std::uint32_t k,
                                    float smoothing, T* dlogits, DeviceMetrics* m, const unsigned long long* step) {
    __shared__ double loss_part[threads];
    __shared__ unsigned correct_part[threads];
    const std::uint32_t s = blockIdx.x * blockDim.x + threadIdx.x;
    double loss = 0.0;
    unsigned correct = 0;
    if (s < n) {
        const std::uint64_t row = std::uint64_t{s} * k;
        const std::int32_t label = labels[s];
        float zmax = ld(logits, row);
        std::uint32_t arg = 0;
        for (std::uint32_t j = 1; j < k; ++j)
            if (ld(logits, row + j) > zmax) zmax = ld(logits, row + j), arg = j;
        float denom = 0.0f;
        for (std::uint32_t j = 0; j < k; ++j) denom += __expf(ld(logits, row + j) - zmax);
        const float lse = logf(denom) + zmax;
        const float l = lse - ld(logits, row + label);
        loss = l;
        correct = arg == static_cast<std::uint32_t>(label);
        if (!isfinite(l) || !isfinite(zmax)) atomicMin(&m->first_nonfinite, *step);
        if (dlogits) {
            const float inv_n = 1.0f / static_cast<float>(n), off = smoothing / static_cast<float>(k);
            for (std::uint32_t j = 0; j < k; ++j) {
                const float q = (j == static_cast<std::uint32_t>(label) ? 1.0f - smoothing : 0.0f) + off;
                st(dlogits, row + j, (__expf(ld(logits, row + j) - lse) - q) * inv_n);
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

} // namespace

void launch_softmax_xent(const void* logits, ActType t, const std::int32_t* labels, std::uint32_t n, std::uint32_t k,
                         float smoothing, void* dlogits, DeviceMetrics* m, const unsigned long long* step,
                         cudaStream_t s) {
    dispatch(t, [&](auto tag) {
        using T = DSTK_T;
        softmax_xent_kernel<<<(n + threads - 1) / threads, threads, 0, s>>>(
            static_cast<const T*>(logits), labels, n, k, smoothing, static_cast<T*>(dlogits), m, step);
    });
    check_launch();
}

} // namespace dstk::train::cuda
