// The heads' losses: softmax cross-entropy one warp per sample (an online
// softmax, then the gradient: two reads of each row whatever k), the element
// losses one thread per output and sample with their metric sums reduced per
// block.
#include "loss.hpp"

#include "dstk/train/metrics.hpp"

#include "launch_common.cuh"
#include "softmax_xent.cuh"

namespace dstk::train::cuda {
namespace {

constexpr int warps_per_block = threads / 32;

template <class T>
__global__ void softmax_xent_kernel(const T* z, const std::int32_t* labels, std::uint32_t n, std::uint32_t k,
                                    float smoothing, float weight, T* dz, DeviceHeadMetrics* m,
                                    unsigned long long* first_nonfinite, const unsigned long long* step) {
    const unsigned warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    const std::uint32_t s = blockIdx.x * warps_per_block + warp;
    double loss = 0.0;
    unsigned correct = 0, top5 = 0, bad = 0;
    if (s < n) {
        const std::uint64_t row = std::uint64_t{s} * k;
        const std::int32_t label = labels[s];
        if (label < 0 || static_cast<std::uint32_t>(label) >= k) {
            bad = 1;
            if (dz)
                for (std::uint32_t j = lane; j < k; j += 32) st(dz, row + j, 0.0f);
        } else {
            const float zl = ld(z, row + label);
            float mx = -INFINITY, sum = 0.0f;
            unsigned rank = 0; // classes ahead of the label (ties: those before it), as argmax picks the first
            for (std::uint32_t j = lane; j < k; j += 32) {
                const float v = ld(z, row + j);
                online_merge(mx, sum, v, 1.0f);
                rank += v > zl || (v == zl && j < static_cast<std::uint32_t>(label));
            }
            for (int o = 16; o > 0; o /= 2) {
                online_merge(mx, sum, __shfl_xor_sync(~0u, mx, o), __shfl_xor_sync(~0u, sum, o));
                rank += __shfl_xor_sync(~0u, rank, o);
            }
            const float lse = logf(sum) + mx;
            const float l = lse - zl;
            loss = l;
            // A sample whose loss is not finite (a NaN or infinite logit) is never
            // right: comparisons with NaN are false, and would leave its rank 0.
            correct = isfinite(l) && rank == 0;
            top5 = isfinite(l) && rank < 5;
            if (lane == 0 && (!isfinite(l) || !isfinite(mx))) atomicMin(first_nonfinite, *step);
            if (dz) {
                const float scale = weight / static_cast<float>(n), off = smoothing / static_cast<float>(k);
                for (std::uint32_t j = lane; j < k; j += 32) {
                    const float q = (j == static_cast<std::uint32_t>(label) ? 1.0f - smoothing : 0.0f) + off;
                    st(dz, row + j, (__expf(ld(z, row + j) - lse) - q) * scale);
                }
            }
        }
    }
    add_ce_metrics<warps_per_block>(loss, correct, top5, bad, m);
}

// Loss, gradient with respect to z and prediction of one output (the cpu
// backend's head_loss.cpp, in float).
struct Element {
    float loss, grad, pred;
};

template <LossKind K> __device__ __forceinline__ Element element(float z, float y) {
    if constexpr (K == LossKind::mse) {
        return {(z - y) * (z - y), 2.0f * (z - y), z};
    } else if constexpr (K == LossKind::poisson) {
        const float rate = z > 20.0f ? z : log1pf(__expf(z)), sig = 1.0f / (1.0f + __expf(-z));
        return {rate - y * logf(rate + 1e-8f), sig * (1.0f - y / (rate + 1e-8f)), rate};
    } else if constexpr (K == LossKind::poisson_exp) {
        const float rate = expf(z);
        return {rate - y * z, rate - y, rate};
    } else {
        const float sig = 1.0f / (1.0f + __expf(-z));
        return {fmaxf(z, 0.0f) - z * y + log1pf(__expf(-fabsf(z))), sig - y, sig};
    }
}

constexpr int tile_outputs = 32, tile_rows = 8, samples_per_thread = 8;
constexpr int sums_rows = HeadMetrics::rows;

// One thread per (output, sample), threads along x over outputs: coalesced
// rows. Each thread sums its samples' figures in registers; the block reduces
// them over y and adds one value per output and figure.
template <LossKind K, class T>
__global__ void element_loss_kernel(const T* z, const float* y, std::uint32_t n, std::uint32_t k, float scale, T* dz,
                                    DeviceHeadMetrics* m, double* sums, unsigned long long* first_nonfinite,
                                    const unsigned long long* step) {
    __shared__ double part[tile_rows][tile_outputs];
    __shared__ unsigned correct_part[tile_rows][tile_outputs];
    const std::uint32_t j = blockIdx.x * tile_outputs + threadIdx.x;
    double acc[sums_rows] = {};
    unsigned correct = 0, bad_targets = 0; // bce: targets neither 0 nor 1 (the host refuses the step's figures)
    bool bad = false;
    if (j < k) {
        const std::uint32_t s0 = blockIdx.y * tile_rows * samples_per_thread + threadIdx.y;
        for (int r = 0; r < samples_per_thread; ++r) {
            const std::uint32_t s = s0 + r * tile_rows;
            if (s >= n) break;
            const std::uint64_t e = std::uint64_t{s} * k + j;
            const float zv = ld(z, e), yv = y[e];
            const Element el = element<K>(zv, yv);
            bad |= !isfinite(el.loss);
            if (dz) st(dz, e, el.grad * scale);
            acc[HeadMetrics::row_y] += yv;
            acc[HeadMetrics::row_yy] += double{yv} * yv;
            acc[HeadMetrics::row_p] += el.pred;
            acc[HeadMetrics::row_pp] += double{el.pred} * el.pred;
            acc[HeadMetrics::row_py] += double{el.pred} * yv;
            acc[HeadMetrics::row_ylogy] += yv > 0.0f ? double{yv} * log(double{yv}) : 0.0;
            acc[HeadMetrics::row_loss] += el.loss;
            if constexpr (K == LossKind::bce) {
                correct += isfinite(zv) && (zv > 0.0f) == (yv > 0.5f);
                bad_targets += yv != 0.0f && yv != 1.0f;
            }
        }
    }
    if (bad) atomicMin(first_nonfinite, *step);
    if (bad_targets) atomicAdd(&m->bad_labels, static_cast<unsigned long long>(bad_targets));
    for (int q = 0; q < sums_rows; ++q) {
        part[threadIdx.y][threadIdx.x] = acc[q];
        __syncthreads();
        if (threadIdx.y == 0 && j < k) {
            double t = 0.0;
            for (int r = 0; r < tile_rows; ++r) t += part[r][threadIdx.x];
            atomicAdd(&sums[std::uint64_t{static_cast<unsigned>(q)} * k + j], t);
        }
        __syncthreads();
    }
    if constexpr (K == LossKind::bce) {
        correct_part[threadIdx.y][threadIdx.x] = correct;
        __syncthreads();
        if (threadIdx.x == 0 && threadIdx.y == 0) {
            unsigned long long c = 0;
            for (int r = 0; r < tile_rows; ++r)
                for (int t = 0; t < tile_outputs; ++t) c += correct_part[r][t];
            if (c) atomicAdd(&m->correct, c);
        }
    }
}

template <LossKind K, class T> void launch_elements(const HeadLossArgs& a, cudaStream_t s) {
    const dim3 block(tile_outputs, tile_rows);
    const dim3 grid((a.k + tile_outputs - 1) / tile_outputs,
                    (a.n + tile_rows * samples_per_thread - 1) / (tile_rows * samples_per_thread));
    const float scale = a.weight / (static_cast<float>(a.n) * static_cast<float>(a.k));
    plain_launch(element_loss_kernel<K, T>, grid, block, 0, s, static_cast<const T*>(a.z), a.y, a.n, a.k, scale,
                 static_cast<T*>(a.dz), a.m, a.sums, a.first_nonfinite, a.step);
}

} // namespace

void launch_head_loss(const HeadLossArgs& a, ActType t, cudaStream_t s) {
    dispatch(t, [&](auto tag) {
        using T = DSTK_T;
        switch (a.loss) {
        case LossKind::ce:
            plain_launch(softmax_xent_kernel<T>, (a.n + warps_per_block - 1) / warps_per_block, threads, 0, s,
                         static_cast<const T*>(a.z), a.labels, a.n, a.k, a.smoothing, a.weight, static_cast<T*>(a.dz),
                         a.m, a.first_nonfinite, a.step);
            break;
        case LossKind::mse:
            launch_elements<LossKind::mse, T>(a, s);
            break;
        case LossKind::poisson:
            launch_elements<LossKind::poisson, T>(a, s);
            break;
        case LossKind::poisson_exp:
            launch_elements<LossKind::poisson_exp, T>(a, s);
            break;
        case LossKind::bce:
            launch_elements<LossKind::bce, T>(a, s);
            break;
        }
    });
}

} // namespace dstk::train::cuda
