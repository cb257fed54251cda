#pragma once
// The one way lib/cuda reports a failed CUDA, cuDNN or cuBLAS call: CUDA_CHECK
// (and, in code that includes cudnn_check.hpp, CUDNN_CHECK / CUBLAS_CHECK)
// throw dstk::Error naming the library, the call, the error, the file and the
// line; the library throws, the tool decides the exit code. An out-of-memory
// error carries the "does not fit" exit code.
#include <cuda_runtime.h>

#include <string>

#include "dstk/error.hpp"

namespace dstk::cuda {

[[noreturn]] inline void throw_gpu_error(const char* lib, const char* call, const std::string& what, const char* file,
                                         int line, ExitCode code = ExitCode::failure) {
    throw Error(code, std::string(lib) + " call failed: " + call + " returned " + what + " (" + file + ":" +
                          std::to_string(line) + ")");
}

[[noreturn]] inline void throw_cuda_error(cudaError_t e, const char* call, const char* file, int line) {
    cudaGetLastError(); // clear a non-sticky error so that the caller can go on
    throw_gpu_error("CUDA", call, std::string(cudaGetErrorName(e)) + ": " + cudaGetErrorString(e), file, line,
                    e == cudaErrorMemoryAllocation ? ExitCode::no_fit : ExitCode::failure);
}

} // namespace dstk::cuda

#define CUDA_CHECK(call)                                                                                               \
    do {                                                                                                               \
        const cudaError_t dstk_err_ = (call);                                                                          \
        if (dstk_err_ != cudaSuccess) ::dstk::cuda::throw_cuda_error(dstk_err_, #call, __FILE__, __LINE__);            \
    } while (0)
