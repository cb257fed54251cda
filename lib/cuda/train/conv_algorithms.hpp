#pragma once
// The choice of each convolution's kernels (cuDNN's algorithms, dstk's own
// weight-gradient kernel), and the fallback for other batch sizes.
// cuda_trainer.cpp owns the descriptors and buffers; this file only decides.
#include <cuda_runtime.h>
#include <cudnn.h>

#include <cstddef>
#include <cstdint>
#include <functional>

#include <string>
#include <vector>

#include "dstk/train/choice_cache.hpp"
#include "dstk/train/trainer.hpp"

namespace dstk::train::cuda {

struct ConvAlgos {
    cudnnConvolutionFwdAlgo_t fwd = CUDNN_CONVOLUTION_FWD_ALGO_IMPLICIT_GEMM;
    cudnnConvolutionBwdDataAlgo_t bwd_data = CUDNN_CONVOLUTION_BWD_DATA_ALGO_1;
    cudnnConvolutionBwdFilterAlgo_t bwd_filter = CUDNN_CONVOLUTION_BWD_FILTER_ALGO_1;
    // Each algorithm's math type, set on its descriptor before each call: a
    // partial batch may need an algorithm of another math type than the full
    // batch's (fit_conv_algorithms), and the descriptors are shared.
    cudnnMathType_t fwd_math = CUDNN_DEFAULT_MATH, data_math = CUDNN_DEFAULT_MATH, filter_math = CUDNN_DEFAULT_MATH;
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

// What a layer may run besides the legacy API's algorithms, each a candidate
// under its name where it applies (none where not), run once at the planned
// batch on the search's stream when timed (with the call's buffers).
struct KernelCandidate {
    std::string name;          // as reports and the choice cache name it, e.g. "own:tc_conv"
    std::function<bool()> run; // false: it could not run (left out of the timing)
};
// cuDNN's graph-API configurations of each operation (cudnn_graph.hpp),
// timed beside the legacy algorithms at the planned batch size; at other
// batch sizes the legacy choice runs (fit_conv_algorithms).
struct GraphKernels {
    std::vector<KernelCandidate> fwd, dgrad, wgrad;
    bool force = false; // DSTK_CONV_KERNELS=graph: the first of each list, wherever there is one, untimed
};
// dstrain's own kernels.
struct OwnKernels {
    std::vector<KernelCandidate> fwd; // wgmma_conv.cu, tc_conv.cu in its variants
    // Where fwd also does what a pass after cuDNN's forward would (the next
    // batch norm's statistics, summed in tc_conv's epilogue): that pass, run
    // after each cuDNN candidate when timed, so that both sides do the same
    // work; such a choice is kept under its own key (op fwd_bn_stats).
    std::function<void()> fwd_pass_saved;
    std::vector<KernelCandidate> dgrad; // wgmma_conv.cu, tc_conv.cu (on turned filters)
    std::vector<KernelCandidate> wgrad; // wgmma_wgrad.cu, tc_wgrad.cu
    bool force = false;                 // DSTK_CONV_KERNELS=own: the first of each list, wherever one applies, untimed
};
// Which of them a choice took: the index in its list, or -1 (another's).
struct KernelUse {
    int fwd = -1, dgrad = -1, wgrad = -1;                   // OwnKernels
    int graph_fwd = -1, graph_dgrad = -1, graph_wgrad = -1; // GraphKernels
};

// Chooses each convolution's kernels for the planned batch by the
// KernelMode's rules (dstk/train/trainer.hpp): from the choice cache, by
// timing every allowed candidate (warm GPU; repetitions in interleaved rounds;
// median, near-ties to the previous choice or the most wins: pick_fastest), or
// cuDNN's ranked heuristic. Sets each descriptor's math type to its choice's.
class ConvChooser {
  public:
    ConvChooser(const ConvSearch& s, KernelMode mode, ChoiceCache* cache, std::string identity);
    ConvAlgos choose(const ConvCall& c, const ConvKey& key, std::size_t layer, const OwnKernels& own, KernelUse* used,
                     const GraphKernels& graph = {});
    // A choice among whole variants of the step (graphs captured each way),
    // by the same rules: `launch(j)` runs variant j once on the search's
    // stream; key is one word naming what the variants depend on. Variant 0
    // is the heuristic pick. Returns the index chosen.
    std::size_t choose_variant(const std::string& key, std::size_t layer, const std::string& op,
                               const std::vector<std::string>& names, const std::function<void(std::size_t)>& launch);
    // A decision made outside (a fixed rule), reported with the others.
    void report(std::size_t layer, const std::string& op, const std::string& kernel);
    const std::vector<KernelReport>& reports() const { return reports_; }

  private:
    template <class Perf>
    Perf decide(const Perf* list, int count, const std::string& op, const ConvKey& key, std::size_t layer,
                const std::function<bool(const Perf&)>& run, const std::vector<KernelCandidate>& graph,
                const std::vector<KernelCandidate>& own, int* use_graph, int* use_own);
    std::size_t pick_named(const std::string& key, std::size_t layer, const std::string& op,
                           const std::vector<std::string>& names, std::size_t heuristic,
                           const std::function<bool(std::size_t)>& launch);
    void warm_up(const std::function<void()>& op);
    cudaGraphExec_t capture_round(const std::function<bool(std::size_t)>& launch, std::size_t j);
    std::vector<CandidateTimes> time_candidates(const std::vector<std::string>& names,
                                                const std::function<bool(std::size_t)>& launch);
    ConvSearch s_;
    KernelMode mode_;
    ChoiceCache* cache_;
    std::string device_identity_text_;
    bool warm_ = false, own_force_ = false, graph_force_ = false;
    std::vector<KernelReport> reports_;
};

// The identity a choice cache is kept for: this GPU, driver, cuDNN, dstk
// and its kernel set.
DeviceIdentity device_identity(int device);

// Why no allowed algorithm fits each operation at a batch size (empty: one does).
struct ConvUnfit {
    std::string fwd, bwd_data, bwd_filter;
};

// For another batch size: the chosen algorithms where their workspace still
// fits; otherwise the first allowed algorithm of cuDNN's ranked list with the
// same math type (the descriptors are shared between batch sizes). Where
// none is allowed, unfit says why and the chosen one stays: the operation
// fails only if cuDNN is asked to run it at this batch (our own kernels may
// run it, or nothing may need it: an evaluation needs no gradients).
ConvAlgos fit_conv_algorithms(const ConvSearch& s, const ConvCall& c, ConvAlgos chosen, std::size_t layer,
                              std::uint32_t batch, ConvUnfit& unfit);

// Mean GPU time of op on the stream in ms (one warm-up run, then reps timed).
double time_on_stream(cudaStream_t stream, const std::function<void()>& op, int reps = 5);

} // namespace dstk::train::cuda
