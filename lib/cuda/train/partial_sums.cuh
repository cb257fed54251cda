#pragma once
// The fixed order in which the weight gradients' per-block partials are
// added (sum_partials, elementwise.cu; the first batch norm's backward,
// first_bn.cu): each element's blocks in sum_parts interleaved parts, each
// part in block order in double, then the parts in order. Every kernel that
// adds partials this way gives the same bits.
#include <cstdint>

namespace dstk::train::cuda {

constexpr unsigned sum_parts = 32;

// Part pt of the sum over blocks of partials[b * count + e]: blocks pt,
// pt + sum_parts, ... in order.
__device__ __forceinline__ double part_sum(const float* partials, unsigned blocks, std::uint64_t count, std::uint64_t e,
                                           unsigned pt) {
    double sum = 0.0;
#pragma unroll 4
    for (unsigned b = pt; b < blocks; b += sum_parts) sum += partials[std::uint64_t{b} * count + e];
    return sum;
}

// The whole sum on the thread of part 0, from its own part and the others'
// (parts[pt][lane], written before a barrier).
__device__ __forceinline__ double add_parts(double own, const double (*parts)[32], unsigned lane) {
    for (unsigned i = 1; i < sum_parts; ++i) own += parts[i][lane];
    return own;
}

} // namespace dstk::train::cuda
