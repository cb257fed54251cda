#pragma once
// The scaling that turns an all-reduced sum into a mean (scale.cu).
#include <cuda_runtime.h>

#include <cstddef>

namespace dstk::dist::cuda {

// data[i] *= factor on `s`; capturable in a CUDA graph. The mean is the sum
// times 1/size, as the MPI reducer computes it.
void launch_scale(float* data, std::size_t count, float factor, cudaStream_t s);

} // namespace dstk::dist::cuda
