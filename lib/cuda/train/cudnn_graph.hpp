#pragma once
// One convolution through cuDNN's graph (backend) API: its engine
// configurations, as candidates beside the legacy API's algorithms. The
// legacy API reaches one configuration per algorithm, chosen by cuDNN's
// heuristic; the graph API lists many more (tile shapes, split-K), and on
// Hopper some of them run resnet-sized convolutions far faster than any
// legacy algorithm. conv_algorithms.cpp times them with the rest.
#include <cudnn.h>

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace dstk::train::cuda {

enum class ConvOp { fwd, bwd_data, bwd_filter };

// A 2-d convolution of square kernel, padding and stride (dilation 1).
struct GraphConvShape {
    std::int64_t n = 0, c = 0, h = 0, w = 0; // input
    std::int64_t k = 0, oh = 0, ow = 0;      // output channels and size
    std::int64_t kernel = 3, pad = 1, stride = 1;
    bool nchw = false;
    cudnnDataType_t type = CUDNN_DATA_FLOAT; // of the tensors; accumulation in float
};

// Which configurations may run: tf32 tensor-core math for float tensors
// only where allow_tensor_core; none with nondeterministic sums where
// deterministic; never FFT or Winograd (their rounding is not the
// convolution's), reduced-precision sums, or kernels compiled at run time
// (seconds of start-up each).
struct GraphConvRules {
    bool allow_tensor_core = true;
    bool deterministic = false;
    std::uint64_t workspace_limit = 0;
    int per_heuristic = 12; // configurations taken from each of cuDNN's heuristic modes
};

class GraphConv {
  public:
    struct Impl;
    explicit GraphConv(std::shared_ptr<Impl> impl);
    ~GraphConv();
    // "cudnn-graph:ENGINE:MODE RANK", stable for a cuDNN version and device.
    const std::string& name() const;
    std::uint64_t workspace() const;
    // x, w, y as the operation reads or writes them (fwd writes y, bwd_data
    // x, bwd_filter w). accumulate adds into the output (beta 1): a second
    // plan of the same engine and knobs, made at the first such call. False
    // where cuDNN refuses that plan; nothing ran then.
    bool run(cudnnHandle_t h, void* x, void* w, void* y, void* workspace, bool accumulate = false) const;

  private:
    std::shared_ptr<Impl> impl_;
};

// The allowed configurations for op on shape, fastest first by cuDNN's
// heuristics, without repeats; empty where the graph API refuses the
// convolution. Nothing runs on the GPU.
std::vector<std::shared_ptr<GraphConv>> graph_conv_candidates(cudnnHandle_t h, const GraphConvShape& shape, ConvOp op,
                                                              const GraphConvRules& rules);

} // namespace dstk::train::cuda
