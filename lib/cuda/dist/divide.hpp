#pragma once
// The division that turns an all-reduced sum into a mean (divide.cu).
#include <cuda_runtime.h>

#include <cstddef>

namespace dstk::dist::cuda {

// data[i] = data[i] / divisor, correctly rounded (as the MPI reducer divides),
// on `s`; capturable in a CUDA graph.
void launch_divide(float* data, std::size_t count, float divisor, cudaStream_t s);

} // namespace dstk::dist::cuda
