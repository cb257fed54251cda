#pragma once
// CUDA_CHECK / CUDNN_CHECK / CUBLAS_CHECK: a failed call becomes dstk::Error
// naming the call, the error, the file and the line (the library throws, the
// tool decides the exit code).
#include <cublas_v2.h>
#include <cuda_runtime.h>
#include <cudnn.h>

#include <string>

#include "dstk/error.hpp"

namespace dstk::train::cuda {

[[noreturn]] inline void throw_gpu_error(const char* lib, const char* call, const std::string& what, const char* file,
                                         int line) {
    throw runtime_error(std::string(lib) + " call failed: " + call + " returned " + what + " (" + file + ":" +
                        std::to_string(line) + ")");
}

} // namespace dstk::train::cuda

#define CUDA_CHECK(call)                                                                                               \
    do {                                                                                                               \
        const cudaError_t dstk_err_ = (call);                                                                          \
        if (dstk_err_ != cudaSuccess)                                                                                  \
            ::dstk::train::cuda::throw_gpu_error(                                                                      \
                "CUDA", #call, std::string(cudaGetErrorName(dstk_err_)) + ": " + cudaGetErrorString(dstk_err_),        \
                __FILE__, __LINE__);                                                                                   \
    } while (0)

#define CUDNN_CHECK(call)                                                                                              \
    do {                                                                                                               \
        const cudnnStatus_t dstk_st_ = (call);                                                                         \
        if (dstk_st_ != CUDNN_STATUS_SUCCESS)                                                                          \
            ::dstk::train::cuda::throw_gpu_error("cuDNN", #call, cudnnGetErrorString(dstk_st_), __FILE__, __LINE__);   \
    } while (0)

#define CUBLAS_CHECK(call)                                                                                             \
    do {                                                                                                               \
        const cublasStatus_t dstk_st_ = (call);                                                                        \
        if (dstk_st_ != CUBLAS_STATUS_SUCCESS)                                                                         \
            ::dstk::train::cuda::throw_gpu_error("cuBLAS", #call, cublasGetStatusString(dstk_st_), __FILE__,           \
                                                 __LINE__);                                                            \
    } while (0)
