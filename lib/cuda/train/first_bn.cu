// The first batch norm's backward from the input's moments (first_bn.hpp).
#include "first_bn.hpp"

#include "launch_common.cuh"

namespace dstk::train::cuda {
namespace {

constexpr unsigned taps = 9;
constexpr unsigned mcols = 40; // the moments' columns: tap * 4 + channel for 10 taps (the tenth: the ones)

// Entry (a, b) of the symmetric moments, of which the weight gradient summed
// the 16-row blocks on and above the diagonal.
__device__ __forceinline__ float moment(const float* m, unsigned a, unsigned b) {
    return b >= a / 16 * 16 ? m[a * mcols + b] : m[b * mcols + a];
}

// One block per output channel k, thread j one patch value (first_bn.hpp's
// formula); sums: A (k x K, KCRS), S (k), the moments.
__global__ void first_bn_backward_kernel(const float* sums, unsigned c, unsigned kout, double count, bool bf16_weights,
                                         FirstBnBackward b, float* dw) {
    await_predecessor();
    constexpr unsigned max_k = 4 * taps;
    __shared__ double w[max_k], wa[max_k];
    const unsigned K = taps * c, k = blockIdx.x, j = threadIdx.x;
    const float* m = sums + std::uint64_t{K + 1} * kout;
    const unsigned i = (j % taps) * 4 + j / taps; // j = channel * 9 + tap in the moments' columns
    if (j < K) {
        const float wf = b.w[std::uint64_t{k} * K + j];
        w[j] = bf16_weights ? __bfloat162float(__float2bfloat16(wf)) : wf;
        wa[j] = w[j] * sums[std::uint64_t{k} * K + j];
    }
    __syncthreads();
    double w_a = 0.0; // w_k . A_k = sum_p g y, in index order
    for (unsigned e = 0; e < K; ++e) w_a += wa[e];
    const double sg = sums[std::uint64_t{kout} * K + k], mean = b.mean[k], is = b.invstd[k];
    const double sgy = w_a - mean * sg; // T
    if (j == 0) {
        b.dgamma[k] = static_cast<float>(is * sgy);
        b.dbeta[k] = static_cast<float>(sg);
    }
    if (j >= K) return;
    double gw = 0.0; // sum_p x_p[j] y_p
    for (unsigned e = 0; e < K; ++e) gw += moment(m, i, (e % taps) * 4 + e / taps) * w[e];
    const double sx = moment(m, i, 36);
    const double z = gw - mean * sx; // sum_p x_p[j] (y_p - mean)
    const double a = sums[std::uint64_t{k} * K + j];
    dw[std::uint64_t{k} * K + j] =
        static_cast<float>(b.gamma[k] * is * (a - sg / count * sx - is * is * sgy / count * z));
}

} // namespace

std::uint64_t first_bn_moments(const DirectConvShape&) {
    return mcols * mcols;
}

void launch_first_bn_backward(const float* sums, ActType t, const DirectConvShape& s, const FirstBnBackward& b,
                              float* dw, cudaStream_t stream) {
    const double count = static_cast<double>(s.n) * s.oh * s.ow;
    launch_kernel(first_bn_backward_kernel, s.k, 64, 0, stream, sums, s.c, s.k, count, t == ActType::bf16, b, dw);
}

} // namespace dstk::train::cuda
