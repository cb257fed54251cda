#pragma once
// What the softmax cross-entropy kernels (loss.cu's, linear_xent.cu's) share:
// the online softmax's merge and the block's counters.
#include "loss.hpp"

namespace dstk::train::cuda {

// (m, s): a running maximum and the sum of exp(v - m) over the values seen;
// merged with another such pair.
__device__ __forceinline__ void online_merge(float& m, float& s, float m2, float s2) {
    const float mx = fmaxf(m, m2);
    s = (m == -INFINITY ? 0.0f : s * __expf(m - mx)) + (m2 == -INFINITY ? 0.0f : s2 * __expf(m2 - mx));
    m = mx;
}

// Each warp's lane 0 gives its sample's figures; thread 0 sums them in warp
// order and adds them to the head's counters. Every thread of the block calls it.
template <int Warps>
__device__ __forceinline__ void add_ce_metrics(double loss, unsigned correct, unsigned top5, unsigned bad,
                                               DeviceHeadMetrics* m) {
    __shared__ double loss_part[Warps];
    __shared__ unsigned counts[Warps][3];
    const unsigned warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    if (lane == 0) {
        loss_part[warp] = loss;
        counts[warp][0] = correct;
        counts[warp][1] = top5;
        counts[warp][2] = bad;
    }
    __syncthreads();
    if (threadIdx.x == 0) {
        double l = 0.0;
        unsigned c = 0, t5 = 0, b = 0;
        for (int w = 0; w < Warps; ++w) {
            l += loss_part[w];
            c += counts[w][0];
            t5 += counts[w][1];
            b += counts[w][2];
        }
        atomicAdd(&m->loss_sum, l);
        if (c) atomicAdd(&m->correct, static_cast<unsigned long long>(c));
        if (t5) atomicAdd(&m->top5, static_cast<unsigned long long>(t5));
        if (b) atomicAdd(&m->bad_labels, static_cast<unsigned long long>(b));
    }
}

} // namespace dstk::train::cuda
