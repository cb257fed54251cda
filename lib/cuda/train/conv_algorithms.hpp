#pragma once
// The choice of each convolution's cuDNN algorithms (and whether dstk's own
// weight-gradient kernel replaces cuDNN's), and the fallback for other batch
// sizes. cuda_trainer.cpp owns the descriptors and buffers; this file only
// decides.
#include <cuda_runtime.h>
#include <cudnn.h>

#include <cstddef>
#include <cstdint>
#include <functional>

#include "dstk/train/trainer.hpp"

namespace dstk::train::cuda {

struct ConvAlgos {
    cudnnConvolutionFwdAlgo_t fwd = CUDNN_CONVOLUTION_FWD_ALGO_IMPLICIT_GEMM;
    cudnnConvolutionBwdDataAlgo_t bwd_data = CUDNN_CONVOLUTION_BWD_DATA_ALGO_1;
    cudnnConvolutionBwdFilterAlgo_t bwd_filter = CUDNN_CONVOLUTION_BWD_FILTER_ALGO_1;
};

// Where and under which rules the algorithms are chosen.
struct ConvSearch {
    cudnnHandle_t cudnn = nullptr;
    cudaStream_t stream = nullptr;
    void* workspace = nullptr;
    std::uint64_t workspace_bytes = 0;
    Precision precision = Precision::fp32;
    bool deterministic = false;
};

// One convolution at one batch size: descriptors, and buffers of the right
// sizes that timing may overwrite (x, y: input and output; w, dw: the
// weights' compute copy and its gradient; dy, dx: gradient buffers).
struct ConvCall {
    cudnnTensorDescriptor_t x = nullptr, y = nullptr;
    cudnnFilterDescriptor_t w = nullptr;
    cudnnConvolutionDescriptor_t fwd = nullptr, bwd_data = nullptr, bwd_filter = nullptr;
    const void* x_data = nullptr;
    void* y_data = nullptr;
    const void* w_data = nullptr;
    void* dw_data = nullptr;
    const void* dy_data = nullptr;
    void* dx_data = nullptr;
};

// The largest workspace any allowed algorithm of cuDNN's ranked lists needs,
// up to `limit`.
std::uint64_t conv_workspace_need(const ConvSearch& s, const ConvCall& c, std::uint64_t limit);

// The algorithms for the planned batch, with each descriptor's math type set
// to the chosen algorithm's. `own_wgrad`, when set, launches dstk's own
// weight-gradient kernel for this layer: *use_own says whether it replaces
// cuDNN's (with --deterministic or `force_own`: wherever it applies).
ConvAlgos find_conv_algorithms(const ConvSearch& s, const ConvCall& c, std::size_t layer,
                               const std::function<void()>& own_wgrad, bool force_own, bool* use_own);

// For another batch size: the chosen algorithms where their workspace still
// fits; otherwise the first allowed algorithm of cuDNN's ranked list with the
// same math type (the descriptors are shared between batch sizes).
ConvAlgos fit_conv_algorithms(const ConvSearch& s, const ConvCall& c, ConvAlgos chosen, std::size_t layer,
                              std::uint32_t batch);

// Mean GPU time of op on the stream in ms (one warm-up run, then reps timed).
double time_on_stream(cudaStream_t stream, const std::function<void()>& op, int reps = 5);

} // namespace dstk::train::cuda
