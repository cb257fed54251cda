#include "conv_algorithms.hpp"

#include <algorithm>
#include <optional>
#include <string>

#include "cudnn_check.hpp"
#include "dstk/units.hpp"

namespace dstk::train::cuda {
namespace {

// The convolution algorithms a precision and the determinism setting allow.
// fp32 keeps to FMA math (Find also reports TF32 results under FMA math) and
// leaves out the FFT and non-fused Winograd algorithms, whose rounding error
// (1e-4 and more relative) is not "float math".
bool imprecise(cudnnConvolutionFwdAlgo_t a) {
    return a == CUDNN_CONVOLUTION_FWD_ALGO_FFT || a == CUDNN_CONVOLUTION_FWD_ALGO_FFT_TILING ||
           a == CUDNN_CONVOLUTION_FWD_ALGO_WINOGRAD_NONFUSED;
}
bool imprecise(cudnnConvolutionBwdDataAlgo_t a) {
    return a == CUDNN_CONVOLUTION_BWD_DATA_ALGO_FFT || a == CUDNN_CONVOLUTION_BWD_DATA_ALGO_FFT_TILING ||
           a == CUDNN_CONVOLUTION_BWD_DATA_ALGO_WINOGRAD_NONFUSED;
}
bool imprecise(cudnnConvolutionBwdFilterAlgo_t a) {
    return a == CUDNN_CONVOLUTION_BWD_FILTER_ALGO_FFT || a == CUDNN_CONVOLUTION_BWD_FILTER_ALGO_FFT_TILING ||
           a == CUDNN_CONVOLUTION_BWD_FILTER_ALGO_WINOGRAD_NONFUSED;
}
template <class Perf> bool usable(const Perf& p, std::uint64_t workspace, Precision prec, bool deterministic) {
    if (p.status != CUDNN_STATUS_SUCCESS || p.memory > workspace) return false;
    if (deterministic && p.determinism != CUDNN_DETERMINISTIC) return false;
    if (prec == Precision::fp32 && (p.mathType != CUDNN_FMA_MATH || imprecise(p.algo))) return false;
    return true;
}
// First usable entry of a ranked list (fastest first), optionally of one math type.
template <class Perf>
const Perf* first_usable(const Perf* list, int got, const ConvSearch& s, const cudnnMathType_t* math = nullptr) {
    for (int j = 0; j < got; ++j)
        if (usable(list[j], s.workspace_bytes, s.precision, s.deterministic) && (!math || list[j].mathType == *math))
            return &list[j];
    return nullptr;
}

// cuDNN's ranked lists (heuristic: not run) of the three operations.
struct Ranked {
    cudnnConvolutionFwdAlgoPerf_t fwd[CUDNN_CONVOLUTION_FWD_ALGO_COUNT];
    cudnnConvolutionBwdDataAlgoPerf_t data[CUDNN_CONVOLUTION_BWD_DATA_ALGO_COUNT];
    cudnnConvolutionBwdFilterAlgoPerf_t filter[CUDNN_CONVOLUTION_BWD_FILTER_ALGO_COUNT];
    int fwd_count = 0, data_count = 0, filter_count = 0;
};
Ranked heuristic_lists(const ConvSearch& s, const ConvCall& c) {
    Ranked r;
    CUDNN_CHECK(cudnnGetConvolutionForwardAlgorithm_v7(s.cudnn, c.x, c.w, c.fwd, c.y, CUDNN_CONVOLUTION_FWD_ALGO_COUNT,
                                                       &r.fwd_count, r.fwd));
    CUDNN_CHECK(cudnnGetConvolutionBackwardDataAlgorithm_v7(
        s.cudnn, c.w, c.y, c.bwd_data, c.x, CUDNN_CONVOLUTION_BWD_DATA_ALGO_COUNT, &r.data_count, r.data));
    CUDNN_CHECK(cudnnGetConvolutionBackwardFilterAlgorithm_v7(
        s.cudnn, c.x, c.y, c.bwd_filter, c.w, CUDNN_CONVOLUTION_BWD_FILTER_ALGO_COUNT, &r.filter_count, r.filter));
    return r;
}
// The same lists as timed by cuDNN's Find.
Ranked found_lists(const ConvSearch& s, const ConvCall& c) {
    Ranked r;
    CUDNN_CHECK(cudnnFindConvolutionForwardAlgorithmEx(s.cudnn, c.x, c.x_data, c.w, c.w_data, c.fwd, c.y, c.y_data,
                                                       CUDNN_CONVOLUTION_FWD_ALGO_COUNT, &r.fwd_count, r.fwd,
                                                       s.workspace, s.workspace_bytes));
    CUDNN_CHECK(cudnnFindConvolutionBackwardDataAlgorithmEx(s.cudnn, c.w, c.w_data, c.y, c.dy_data, c.bwd_data, c.x,
                                                            c.dx_data, CUDNN_CONVOLUTION_BWD_DATA_ALGO_COUNT,
                                                            &r.data_count, r.data, s.workspace, s.workspace_bytes));
    CUDNN_CHECK(cudnnFindConvolutionBackwardFilterAlgorithmEx(
        s.cudnn, c.x, c.x_data, c.y, c.dy_data, c.bwd_filter, c.w, c.dw_data, CUDNN_CONVOLUTION_BWD_FILTER_ALGO_COUNT,
        &r.filter_count, r.filter, s.workspace, s.workspace_bytes));
    return r;
}

Error no_algorithm(const ConvSearch& s, std::size_t layer, const char* which) {
    return runtime_error(std::string("no ") + which + " convolution algorithm for layer " + std::to_string(layer) +
                         " fits the precision" + (s.deterministic ? ", determinism" : "") + " and workspace bound (" +
                         format_bytes(s.workspace_bytes) + ") use a larger workspace or another --precision");
}

} // namespace

std::uint64_t conv_workspace_need(const ConvSearch& s, const ConvCall& c, std::uint64_t limit) {
    const Ranked r = heuristic_lists(s, c);
    std::uint64_t ws = 0;
    auto take = [&](const auto* list, int got) {
        for (int j = 0; j < got; ++j)
            if (usable(list[j], limit, s.precision, s.deterministic)) ws = std::max<std::uint64_t>(ws, list[j].memory);
    };
    take(r.fwd, r.fwd_count);
    take(r.data, r.data_count);
    take(r.filter, r.filter_count);
    return ws;
}

// Normally cuDNN's Find (timed): the fastest allowed one. With
// ConvSearch::deterministic the ranked heuristic list instead, which is the
// same on every run, so that two runs (or a run and its resume) pick the same
// algorithms; only algorithms cuDNN reports as deterministic qualify then.
ConvAlgos find_conv_algorithms(const ConvSearch& s, const ConvCall& c, std::size_t layer,
                               const std::function<void()>& own_wgrad, bool force_own, bool* use_own) {
    const Ranked r = s.deterministic ? heuristic_lists(s, c) : found_lists(s, c);
    ConvAlgos a;
    const auto* f = first_usable(r.fwd, r.fwd_count, s);
    if (!f) throw no_algorithm(s, layer, "forward");
    a.fwd = f->algo;
    CUDNN_CHECK(cudnnSetConvolutionMathType(c.fwd, f->mathType));
    const auto* g = first_usable(r.data, r.data_count, s);
    if (!g) throw no_algorithm(s, layer, "backward-data");
    a.bwd_data = g->algo;
    CUDNN_CHECK(cudnnSetConvolutionMathType(c.bwd_data, g->mathType));
    const auto* w = first_usable(r.filter, r.filter_count, s);
    if (!w) throw no_algorithm(s, layer, "weight-gradient");
    a.bwd_filter = w->algo;
    CUDNN_CHECK(cudnnSetConvolutionMathType(c.bwd_filter, w->mathType));
    // The own kernel where it beats cuDNN's pick, timed the same way (with
    // --deterministic: wherever it applies, so that runs agree).
    if (use_own) *use_own = own_wgrad != nullptr;
    if (own_wgrad && !s.deterministic && !force_own) {
        const float one = 1.0f, zero = 0.0f;
        const double ours = time_on_stream(s.stream, own_wgrad);
        const double theirs = time_on_stream(s.stream, [&] {
            CUDNN_CHECK(cudnnConvolutionBackwardFilter(s.cudnn, &one, c.x, c.x_data, c.y, c.dy_data, c.bwd_filter,
                                                       a.bwd_filter, s.workspace, s.workspace_bytes, &zero, c.w,
                                                       c.dw_data));
        });
        *use_own = ours < theirs;
    }
    return a;
}

ConvAlgos fit_conv_algorithms(const ConvSearch& s, const ConvCall& c, ConvAlgos a, std::size_t layer,
                              std::uint32_t batch) {
    auto none = [&](const char* which) {
        return runtime_error(std::string("no ") + which + " convolution algorithm for layer " + std::to_string(layer) +
                             " at batch " + std::to_string(batch) + " fits the workspace bound");
    };
    std::size_t need = 0;
    cudnnMathType_t math;
    std::optional<Ranked> r;
    auto ranked = [&]() -> const Ranked& {
        if (!r) r = heuristic_lists(s, c);
        return *r;
    };
    if (cudnnGetConvolutionForwardWorkspaceSize(s.cudnn, c.x, c.w, c.fwd, c.y, a.fwd, &need) != CUDNN_STATUS_SUCCESS ||
        need > s.workspace_bytes) {
        CUDNN_CHECK(cudnnGetConvolutionMathType(c.fwd, &math));
        const auto* f = first_usable(ranked().fwd, ranked().fwd_count, s, &math);
        if (!f) throw none("forward");
        a.fwd = f->algo;
    }
    if (cudnnGetConvolutionBackwardDataWorkspaceSize(s.cudnn, c.w, c.y, c.bwd_data, c.x, a.bwd_data, &need) !=
            CUDNN_STATUS_SUCCESS ||
        need > s.workspace_bytes) {
        CUDNN_CHECK(cudnnGetConvolutionMathType(c.bwd_data, &math));
        const auto* g = first_usable(ranked().data, ranked().data_count, s, &math);
        if (!g) throw none("backward-data");
        a.bwd_data = g->algo;
    }
    if (cudnnGetConvolutionBackwardFilterWorkspaceSize(s.cudnn, c.x, c.y, c.bwd_filter, c.w, a.bwd_filter, &need) !=
            CUDNN_STATUS_SUCCESS ||
        need > s.workspace_bytes) {
        CUDNN_CHECK(cudnnGetConvolutionMathType(c.bwd_filter, &math));
        const auto* w = first_usable(ranked().filter, ranked().filter_count, s, &math);
        if (!w) throw none("weight-gradient");
        a.bwd_filter = w->algo;
    }
    return a;
}

double time_on_stream(cudaStream_t stream, const std::function<void()>& op, int reps) {
    cudaEvent_t a = nullptr, b = nullptr;
    CUDA_CHECK(cudaEventCreate(&a));
    CUDA_CHECK(cudaEventCreate(&b));
    op();
    CUDA_CHECK(cudaEventRecord(a, stream));
    for (int k = 0; k < reps; ++k) op();
    CUDA_CHECK(cudaEventRecord(b, stream));
    CUDA_CHECK(cudaEventSynchronize(b));
    float ms = 0.0f;
    CUDA_CHECK(cudaEventElapsedTime(&ms, a, b));
    cudaEventDestroy(a);
    cudaEventDestroy(b);
    return ms / reps;
}

} // namespace dstk::train::cuda
