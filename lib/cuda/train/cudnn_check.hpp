#pragma once
// CUDNN_CHECK / CUBLAS_CHECK: CUDA_CHECK's message format for cuDNN and cuBLAS.
#include <cublas_v2.h>
#include <cudnn.h>

#include "cuda_check.hpp"

#define CUDNN_CHECK(call)                                                                                              \
    do {                                                                                                               \
        const cudnnStatus_t dstk_st_ = (call);                                                                         \
        if (dstk_st_ != CUDNN_STATUS_SUCCESS)                                                                          \
            ::dstk::cuda::throw_gpu_error("cuDNN", #call, cudnnGetErrorString(dstk_st_), __FILE__, __LINE__);          \
    } while (0)

#define CUBLAS_CHECK(call)                                                                                             \
    do {                                                                                                               \
        const cublasStatus_t dstk_st_ = (call);                                                                        \
        if (dstk_st_ != CUBLAS_STATUS_SUCCESS)                                                                         \
            ::dstk::cuda::throw_gpu_error("cuBLAS", #call, cublasGetStatusString(dstk_st_), __FILE__, __LINE__);       \
    } while (0)
