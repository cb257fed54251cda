#include "conv_algorithms.hpp"

#include <algorithm>
#include <chrono>
#include <map>
#include <mutex>
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

namespace {

constexpr int timing_rounds = 7, launches_per_round = 3;
constexpr double warm_up_ms = 200.0;
// Bumped when dstk's own convolution kernels or the candidates beside them
// change, so that cached choices among them are made again.
constexpr const char* own_kernel_set = "14";

std::string math_name(cudnnMathType_t m) {
    switch (m) {
    case CUDNN_DEFAULT_MATH:
        return "default";
    case CUDNN_TENSOR_OP_MATH:
        return "tensor";
    case CUDNN_TENSOR_OP_MATH_ALLOW_CONVERSION:
        return "convert";
    case CUDNN_FMA_MATH:
        return "fma";
    }
    return std::to_string(static_cast<int>(m));
}
template <class Perf> std::string candidate_name(const Perf& p) {
    return "cudnn:" + std::to_string(static_cast<int>(p.algo)) + ":" + math_name(p.mathType);
}

// Choices made in this process, by identity and key: a second trainer of the
// same process runs what the first ran even where the cache file cannot be
// written.
std::mutex memo_mutex;
std::map<std::string, Choice>& memo() {
    static std::map<std::string, Choice> m;
    return m;
}

// When this process last had the GPU busy timing (for warm_up).
std::mutex busy_mutex;
std::chrono::steady_clock::time_point last_busy{};

double wall_ms(std::chrono::steady_clock::time_point since) {
    return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - since).count();
}

} // namespace

ConvChooser::ConvChooser(const ConvSearch& s, KernelMode mode, ChoiceCache* cache, std::string identity)
    : s_(s), mode_(mode), cache_(cache), device_identity_text_(std::move(identity)) {}

void ConvChooser::report(std::size_t layer, const std::string& op, const std::string& kernel) {
    reports_.push_back({layer, op, kernel, ChoiceSource::rule, 0.0});
}

// Clocks up before the first timing: an idle GPU's first milliseconds of work
// run slower, and would favour whichever candidate runs last. Skipped where
// this process kept the GPU busy timing within the last second.
void ConvChooser::warm_up(const std::function<void()>& op) {
    const std::lock_guard<std::mutex> lock(busy_mutex);
    if (warm_) return;
    warm_ = true;
    const auto start = std::chrono::steady_clock::now();
    if (last_busy != std::chrono::steady_clock::time_point{} && start - last_busy < std::chrono::seconds(1)) return;
    while (wall_ms(start) < warm_up_ms) {
        for (int k = 0; k < 50; ++k) op();
        CUDA_CHECK(cudaStreamSynchronize(s_.stream));
    }
    last_busy = std::chrono::steady_clock::now();
}

// A round's launches of one candidate captured as a graph, as a training
// step runs them: a candidate that adds a node before its kernel (cuDNN's
// memset of a workspace counter) pays the gap a graph leaves around it,
// which launches one after another on a stream hide. Null where the
// launches cannot be captured (they are then timed as launched).
cudaGraphExec_t ConvChooser::capture_round(const std::function<bool(std::size_t)>& launch, std::size_t j) {
    cudaGraph_t graph = nullptr;
    if (cudaStreamBeginCapture(s_.stream, cudaStreamCaptureModeThreadLocal) != cudaSuccess) {
        cudaGetLastError();
        return nullptr;
    }
    bool ok = true;
    try {
        for (int l = 0; l < launches_per_round && ok; ++l) ok = launch(j);
    } catch (const std::exception&) { // a launch that cannot be captured: the stream leaves capture below
        ok = false;
    }
    ok = cudaStreamEndCapture(s_.stream, &graph) == cudaSuccess && ok;
    cudaGraphExec_t exec = nullptr;
    if (ok && cudaGraphInstantiate(&exec, graph, 0) != cudaSuccess) exec = nullptr;
    if (graph) cudaGraphDestroy(graph);
    cudaGetLastError(); // a failed capture's error is this function's answer, not the next call's
    return exec;
}

// A trial run of each candidate (one that fails is left out), a warm-up,
// then rounds in which every candidate runs in turn (its round's launches as
// one graph, capture_round), so that a drift of the clocks touches all of
// them alike.
std::vector<CandidateTimes> ConvChooser::time_candidates(const std::vector<std::string>& names,
                                                         const std::function<bool(std::size_t)>& launch) {
    std::vector<CandidateTimes> times(names.size());
    std::vector<bool> alive(names.size());
    std::optional<std::size_t> first_alive;
    for (std::size_t j = 0; j < names.size(); ++j) {
        times[j].kernel = names[j];
        alive[j] = launch(j);
        if (alive[j] && !first_alive) first_alive = j;
    }
    CUDA_CHECK(cudaStreamSynchronize(s_.stream));
    if (!first_alive) return times;
    std::vector<cudaGraphExec_t> rounds(names.size(), nullptr);
    for (std::size_t j = 0; j < names.size(); ++j)
        if (alive[j]) rounds[j] = capture_round(launch, j);
    warm_up([&] { launch(*first_alive); });
    std::vector<cudaEvent_t> ev(2 * timing_rounds * names.size(), nullptr);
    for (auto& e : ev) CUDA_CHECK(cudaEventCreate(&e));
    for (int r = 0; r < timing_rounds; ++r)
        for (std::size_t j = 0; j < names.size(); ++j) {
            if (!alive[j]) continue;
            const std::size_t at = 2 * (r * names.size() + j);
            CUDA_CHECK(cudaEventRecord(ev[at], s_.stream));
            if (rounds[j])
                CUDA_CHECK(cudaGraphLaunch(rounds[j], s_.stream));
            else
                for (int l = 0; l < launches_per_round; ++l) launch(j);
            CUDA_CHECK(cudaEventRecord(ev[at + 1], s_.stream));
        }
    CUDA_CHECK(cudaStreamSynchronize(s_.stream));
    for (int r = 0; r < timing_rounds; ++r)
        for (std::size_t j = 0; j < names.size(); ++j) {
            if (!alive[j]) continue;
            const std::size_t at = 2 * (r * names.size() + j);
            float ms = 0.0f;
            CUDA_CHECK(cudaEventElapsedTime(&ms, ev[at], ev[at + 1]));
            times[j].ms.push_back(static_cast<double>(ms) / launches_per_round);
        }
    for (auto e : ev) cudaEventDestroy(e);
    for (auto r : rounds)
        if (r) cudaGraphExecDestroy(r);
    const std::lock_guard<std::mutex> lock(busy_mutex);
    last_busy = std::chrono::steady_clock::now();
    return times;
}

// The legacy algorithms first, then graph, then own (the heuristic pick is
// the first own kernel where there is one, else the legacy list's first).
template <class Perf>
Perf ConvChooser::decide(const Perf* list, int count, const std::string& op, const ConvKey& key, std::size_t layer,
                         const std::function<bool(const Perf&)>& run, const std::vector<KernelCandidate>& graph,
                         const std::vector<KernelCandidate>& own, int* use_graph, int* use_own) {
    std::vector<Perf> cands;
    for (int j = 0; j < count; ++j)
        if (usable(list[j], s_.workspace_bytes, s_.precision, s_.deterministic) &&
            std::none_of(cands.begin(), cands.end(),
                         [&](const Perf& p) { return p.algo == list[j].algo && p.mathType == list[j].mathType; }))
            cands.push_back(list[j]);
    if (cands.empty()) throw no_algorithm(s_, layer, op.c_str());
    std::vector<std::string> names;
    for (const auto& p : cands) names.push_back(candidate_name(p));
    const std::size_t first_graph = names.size();
    for (const auto& g : graph) names.push_back(g.name);
    const std::size_t first_own = names.size(); // own kernels last: index - first_own in `own`
    for (const auto& o : own) names.push_back(o.name);
    std::size_t idx = 0;
    if ((!own.empty() && own_force_) || (!graph.empty() && graph_force_)) {
        idx = !graph.empty() && graph_force_ ? first_graph : first_own;
        reports_.push_back({layer, op, names[idx], ChoiceSource::rule, 0.0});
    } else {
        idx = pick_named(key.text(), layer, op, names, own.empty() ? 0 : first_own, [&](std::size_t j) {
            if (j >= first_own) return own[j - first_own].run();
            if (j >= first_graph) return graph[j - first_graph].run();
            return run(cands[j]);
        });
    }
    *use_own = idx >= first_own ? static_cast<int>(idx - first_own) : -1;
    *use_graph = idx >= first_graph && idx < first_own ? static_cast<int>(idx - first_graph) : -1;
    return idx >= first_graph ? cands.front() : cands[idx];
}

// The KernelMode's rules for one decision among named candidates: the
// heuristic one, the cached or remembered one, or the fastest timed (stored
// in the cache and this process's memo); reported under layer and op.
std::size_t ConvChooser::pick_named(const std::string& k, std::size_t layer, const std::string& op,
                                    const std::vector<std::string>& names, std::size_t heuristic,
                                    const std::function<bool(std::size_t)>& launch) {
    const std::string memo_key = device_identity_text_ + " " + k;
    auto finish = [&](std::size_t idx, ChoiceSource src, double ms) {
        reports_.push_back({layer, op, names[idx], src, ms});
        return idx;
    };
    auto index_of = [&](const std::string& name) {
        return static_cast<std::size_t>(std::find(names.begin(), names.end(), name) - names.begin());
    };
    if (mode_ == KernelMode::heuristic) return finish(heuristic, ChoiceSource::heuristic, 0.0);
    if (mode_ == KernelMode::automatic || mode_ == KernelMode::cached) {
        std::optional<Choice> c = cache_ ? cache_->find(k) : std::nullopt;
        if (!c) {
            const std::lock_guard<std::mutex> lock(memo_mutex);
            if (auto it = memo().find(memo_key); it != memo().end()) c = it->second;
        }
        if (c && index_of(c->kernel) < names.size())
            return finish(index_of(c->kernel), ChoiceSource::cache, c->median_ms);
        if (mode_ == KernelMode::cached) return finish(heuristic, ChoiceSource::heuristic, 0.0);
    }
    const auto times = time_candidates(names, launch);
    std::string previous;
    if (cache_)
        if (const auto c = cache_->find(k)) previous = c->kernel;
    const auto pick = pick_fastest(times, previous);
    if (!pick) throw no_algorithm(s_, layer, op.c_str());
    if (cache_ && mode_ != KernelMode::cached) cache_->put(k, pick->choice);
    {
        const std::lock_guard<std::mutex> lock(memo_mutex);
        memo()[memo_key] = pick->choice;
    }
    return finish(pick->index, ChoiceSource::timed, pick->choice.median_ms);
}

std::size_t ConvChooser::choose_variant(const std::string& key, std::size_t layer, const std::string& op,
                                        const std::vector<std::string>& names,
                                        const std::function<void(std::size_t)>& launch) {
    return pick_named(key, layer, op, names, 0, [&](std::size_t j) { return launch(j), true; });
}

ConvAlgos ConvChooser::choose(const ConvCall& c, const ConvKey& key, std::size_t layer, const OwnKernels& own,
                              KernelUse* used, const GraphKernels& graph) {
    KernelUse u;
    const float one = 1.0f, zero = 0.0f;
    const Ranked r = heuristic_lists(s_, c);
    own_force_ = own.force;
    graph_force_ = graph.force;
    ConvKey k = key;
    ConvAlgos a;
    const bool saves = !own.fwd.empty() && own.fwd_pass_saved;
    k.op = saves ? "fwd_bn_stats" : "fwd";
    std::vector<KernelCandidate> graph_fwd = graph.fwd; // doing the pass own.fwd saves, as cuDNN's algorithms do
    if (saves)
        for (auto& g : graph_fwd) g.run = [run = g.run, &own] { return run() && (own.fwd_pass_saved(), true); };
    const auto f = decide<cudnnConvolutionFwdAlgoPerf_t>(
        r.fwd, r.fwd_count, "fwd", k, layer,
        [&](const cudnnConvolutionFwdAlgoPerf_t& p) {
            CUDNN_CHECK(cudnnSetConvolutionMathType(c.fwd, p.mathType));
            const bool ok =
                cudnnConvolutionForward(s_.cudnn, &one, c.x, c.x_data, c.w, c.w_data, c.fwd, p.algo, s_.workspace,
                                        s_.workspace_bytes, &zero, c.y, c.y_data) == CUDNN_STATUS_SUCCESS;
            if (ok && saves) own.fwd_pass_saved();
            return ok;
        },
        graph_fwd, own.fwd, &u.graph_fwd, &u.fwd);
    a.fwd = f.algo;
    a.fwd_math = f.mathType;
    k.op = "bwd_data";
    const auto g = decide<cudnnConvolutionBwdDataAlgoPerf_t>(
        r.data, r.data_count, k.op, k, layer,
        [&](const cudnnConvolutionBwdDataAlgoPerf_t& p) {
            CUDNN_CHECK(cudnnSetConvolutionMathType(c.bwd_data, p.mathType));
            return cudnnConvolutionBackwardData(s_.cudnn, &one, c.w, c.w_data, c.y, c.dy_data, c.bwd_data, p.algo,
                                                s_.workspace, s_.workspace_bytes, &zero, c.x,
                                                c.dx_data) == CUDNN_STATUS_SUCCESS;
        },
        graph.dgrad, own.dgrad, &u.graph_dgrad, &u.dgrad);
    a.bwd_data = g.algo;
    a.data_math = g.mathType;
    k.op = "bwd_filter";
    const auto w = decide<cudnnConvolutionBwdFilterAlgoPerf_t>(
        r.filter, r.filter_count, k.op, k, layer,
        [&](const cudnnConvolutionBwdFilterAlgoPerf_t& p) {
            CUDNN_CHECK(cudnnSetConvolutionMathType(c.bwd_filter, p.mathType));
            return cudnnConvolutionBackwardFilter(s_.cudnn, &one, c.x, c.x_data, c.y, c.dy_data, c.bwd_filter, p.algo,
                                                  s_.workspace, s_.workspace_bytes, &zero, c.w,
                                                  c.dw_data) == CUDNN_STATUS_SUCCESS;
        },
        graph.wgrad, own.wgrad, &u.graph_wgrad, &u.wgrad);
    a.bwd_filter = w.algo;
    a.filter_math = w.mathType;
    if (used) *used = u;
    return a;
}

DeviceIdentity device_identity(int device) {
    cudaDeviceProp prop{};
    CUDA_CHECK(cudaGetDeviceProperties(&prop, device));
    int driver = 0;
    CUDA_CHECK(cudaDriverGetVersion(&driver));
    DeviceIdentity id;
    id.gpu = prop.name;
    id.compute = std::to_string(prop.major) + "." + std::to_string(prop.minor);
    id.driver = std::to_string(driver / 1000) + "." + std::to_string(driver % 1000 / 10);
    id.cudnn = std::to_string(cudnnGetVersion());
    id.dstk = DSTK_VERSION;
    id.kernel_set = own_kernel_set;
    return id;
}

ConvAlgos fit_conv_algorithms(const ConvSearch& s, const ConvCall& c, ConvAlgos a, std::size_t layer,
                              std::uint32_t batch, ConvUnfit& unfit) {
    auto none = [&](const char* which) {
        return std::string("no ") + which + " convolution algorithm for layer " + std::to_string(layer) + " at batch " +
               std::to_string(batch) + " fits the precision" + (s.deterministic ? ", determinism" : "") +
               " and workspace bound (" + format_bytes(s.workspace_bytes) +
               "); use a larger workspace, another precision or a batch size that divides the data";
    };
    unfit = {};
    std::optional<Ranked> r;
    auto ranked = [&]() -> const Ranked& {
        if (!r) r = heuristic_lists(s, c);
        return *r;
    };
    std::size_t need = 0;
    CUDNN_CHECK(cudnnSetConvolutionMathType(c.fwd, a.fwd_math)); // as each is sized below
    CUDNN_CHECK(cudnnSetConvolutionMathType(c.bwd_data, a.data_math));
    CUDNN_CHECK(cudnnSetConvolutionMathType(c.bwd_filter, a.filter_math));
    // One direction: the algorithm stays if cuDNN sized its workspace within
    // the bound, else the first usable one of cuDNN's ranked list replaces it,
    // of the same math type where one is, else of any the precision allows.
    auto refit = [&](auto& algo, cudnnMathType_t& math, cudnnStatus_t sized, auto list, int Ranked::*count,
                     const char* which, std::string& why) {
        if (sized == CUDNN_STATUS_SUCCESS && need <= s.workspace_bytes) return;
        const auto* p = first_usable(ranked().*list, ranked().*count, s, &math);
        if (!p) p = first_usable(ranked().*list, ranked().*count, s);
        if (!p) {
            why = none(which);
            return;
        }
        algo = p->algo;
        math = p->mathType;
    };
    refit(a.fwd, a.fwd_math, cudnnGetConvolutionForwardWorkspaceSize(s.cudnn, c.x, c.w, c.fwd, c.y, a.fwd, &need),
          &Ranked::fwd, &Ranked::fwd_count, "forward", unfit.fwd);
    refit(a.bwd_data, a.data_math,
          cudnnGetConvolutionBackwardDataWorkspaceSize(s.cudnn, c.w, c.y, c.bwd_data, c.x, a.bwd_data, &need),
          &Ranked::data, &Ranked::data_count, "backward-data", unfit.bwd_data);
    refit(a.bwd_filter, a.filter_math,
          cudnnGetConvolutionBackwardFilterWorkspaceSize(s.cudnn, c.x, c.y, c.bwd_filter, c.w, a.bwd_filter, &need),
          &Ranked::filter, &Ranked::filter_count, "weight-gradient", unfit.bwd_filter);
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
