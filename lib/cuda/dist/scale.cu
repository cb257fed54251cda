#include "dist/scale.hpp"

#include "cuda_check.hpp"

namespace dstk::dist::cuda {
namespace {

__global__ void scale_kernel(float* data, std::size_t count, float factor) {
    for (std::size_t i = blockIdx.x * std::size_t{blockDim.x} + threadIdx.x; i < count;
         i += std::size_t{gridDim.x} * blockDim.x)
        data[i] *= factor;
}

} // namespace

void launch_scale(float* data, std::size_t count, float factor, cudaStream_t s) {
    if (count == 0) return;
    constexpr unsigned threads = 256;
    const std::size_t blocks = (count + threads - 1) / threads;
    scale_kernel<<<static_cast<unsigned>(blocks < 65535u * 16 ? blocks : 65535u * 16), threads, 0, s>>>(data, count,
                                                                                                        factor);
    CUDA_CHECK(cudaGetLastError());
}

} // namespace dstk::dist::cuda
