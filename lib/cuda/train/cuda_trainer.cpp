// The cuda backend: cuDNN for convolutions (algorithms found once per shape,
// workspace bounded and counted), pooling and ReLU; cuBLAS for linear layers;
// our kernels (kernels.cu) for batch norm, input conversion, bias, residual,
// dropout, the loss and the optimiser. Batch norm is ours because cuDNN's NCHW
// kernels run one block per channel: 395 us for the backward pass of a
// 256x32x32x32 tensor on an H100, where two passes over it take about 60 us. NCHW float activations. Every buffer
// lives in one arena allocated in the constructor; the full-batch training
// step (forward, loss, backward, update) and evaluation are captured once as
// CUDA graphs.
#include <algorithm>
#include <cstring>
#include <functional>
#include <map>
#include <utility>

#include "train/backends.hpp"
#include "cuda_check.hpp"
#include "dstk/units.hpp"
#include "train/kernels.hpp"

namespace dstk::train {
namespace {

using namespace dstk::train::cuda;

constexpr double bn_eps = 1e-5, bn_momentum = 0.1;
constexpr std::uint64_t cublas_workspace = std::uint64_t{32} << 20;

// Bump allocation inside one cudaMalloc; measuring pass first (base 0).
class Arena {
  public:
    template <class T> T* take(std::uint64_t count) {
        offset_ = (offset_ + 255) & ~std::uint64_t{255};
        T* p = reinterpret_cast<T*>(base_ + offset_);
        offset_ += std::max<std::uint64_t>(1, count) * sizeof(T);
        return p;
    }
    std::uint64_t used() const { return offset_; }
    void reset(std::uintptr_t base) {
        base_ = base;
        offset_ = 0;
    }

  private:
    std::uintptr_t base_ = 0;
    std::uint64_t offset_ = 0;
};

struct ConvAlgos {
    cudnnConvolutionFwdAlgo_t fwd = CUDNN_CONVOLUTION_FWD_ALGO_IMPLICIT_GEMM;
    cudnnConvolutionBwdDataAlgo_t bwd_data = CUDNN_CONVOLUTION_BWD_DATA_ALGO_0;
    cudnnConvolutionBwdFilterAlgo_t bwd_filter = CUDNN_CONVOLUTION_BWD_FILTER_ALGO_0;
};

struct LayerDev {
    float* out = nullptr;   // activation (aliases the input for flatten and residual_begin)
    float* aux = nullptr;   // bn: saved mean and inverse std; dropout: mask
    float* stash = nullptr; // residual_end: gradient for the skip path
    cudnnFilterDescriptor_t filter = nullptr;
    cudnnConvolutionDescriptor_t conv_fwd = nullptr, conv_bwd_data = nullptr, conv_bwd_filter = nullptr;
    cudnnPoolingDescriptor_t pool = nullptr;
    ConvAlgos algos; // for max_batch
};

// Tensor descriptors and algorithms for one batch size.
struct BatchDescs {
    cudnnTensorDescriptor_t input = nullptr;
    std::vector<cudnnTensorDescriptor_t> out;
    std::vector<ConvAlgos> algos;
};

cudnnTensorDescriptor_t make_tensor(std::uint32_t n, TensorShape s) {
    cudnnTensorDescriptor_t d;
    CUDNN_CHECK(cudnnCreateTensorDescriptor(&d));
    CUDNN_CHECK(cudnnSetTensor4dDescriptor(d, CUDNN_TENSOR_NCHW, CUDNN_DATA_FLOAT, static_cast<int>(n),
                                           static_cast<int>(s.c), static_cast<int>(s.h), static_cast<int>(s.w)));
    return d;
}

class CudaBuffer final : public BackendBuffer {
  public:
    CudaBuffer(int device, std::uint64_t bytes) : bytes_(bytes) {
        CUDA_CHECK(cudaSetDevice(device));
        const cudaError_t e = cudaMalloc(&ptr_, bytes);
        if (e != cudaSuccess) {
            cudaGetLastError();
            std::size_t free_b = 0, total_b = 0;
            cudaMemGetInfo(&free_b, &total_b);
            throw no_fit_error("cannot allocate " + format_bytes(bytes) + " on the GPU (" + format_bytes(free_b) +
                               " free of " + format_bytes(total_b) + ") use a smaller dataset or --batch");
        }
    }
    ~CudaBuffer() override { cudaFree(ptr_); }
    void* data() override { return ptr_; }
    std::uint64_t bytes() const override { return bytes_; }
    void upload(std::uint64_t offset, const void* src, std::uint64_t bytes) override {
        if (offset + bytes > bytes_) throw runtime_error("BackendBuffer::upload past the end");
        CUDA_CHECK(cudaMemcpy(static_cast<char*>(ptr_) + offset, src, bytes, cudaMemcpyHostToDevice));
    }

  private:
    void* ptr_ = nullptr;
    std::uint64_t bytes_;
};

class CudaTrainer final : public Trainer {
  public:
    explicit CudaTrainer(const TrainerConfig& c);
    ~CudaTrainer() override;

    const TrainerConfig& config() const override { return cfg_; }
    MemoryPlan memory_plan() const override { return plan_; }
    std::uint64_t measured_device_bytes() const override { return measured_; }

    void train_step(const Batch& b) override;
    void evaluate(const Batch& b) override;
    Metrics take_train_metrics() override { return take(train_m_, train_samples_); }
    Metrics take_eval_metrics() override { return take(eval_m_, eval_samples_); }
    std::optional<std::uint64_t> first_nonfinite_step() override;
    std::uint64_t steps() const override { return step_; }
    void synchronize() override { CUDA_CHECK(cudaStreamSynchronize(stream_)); }
    void* compute_stream() const override { return stream_; }

    std::vector<std::uint8_t> save_state() override;
    void load_state(std::span<const std::uint8_t> blob) override;

    void compute_gradients(const Batch& b) override;
    std::vector<float> read_activation(std::size_t layer) override {
        if (layer >= layers().size()) throw runtime_error("read_activation: no layer " + std::to_string(layer));
        return download(dev_[layer].out, std::uint64_t{last_n_} * layers()[layer].out.numel());
    }
    std::vector<float> read_input_gradient() override {
        return download(input_grad_, std::uint64_t{last_n_} * cfg_.plan.input.numel());
    }
    std::vector<float> read_gradients() override { return download(grads_, cfg_.plan.params); }
    std::vector<float> read_parameters() override { return download(params_, cfg_.plan.params); }
    std::vector<float> read_states() override { return download(states_, cfg_.plan.states); }
    void write_parameters(std::span<const float> p) override {
        if (p.size() != cfg_.plan.params) throw runtime_error("write_parameters: wrong size");
        CUDA_CHECK(cudaMemcpy(params_, p.data(), p.size_bytes(), cudaMemcpyHostToDevice));
    }

  private:
    const std::vector<LayerPlan>& layers() const { return cfg_.plan.layers; }
    void layout(Arena& a);
    void create_layer_descriptors();
    void find_algorithms();
    BatchDescs& descs(std::uint32_t n);
    const float* input_of(std::size_t i) const { return i == 0 ? act0_ : dev_[i - 1].out; }
    void convert(const Batch& b);
    void forward(std::uint32_t n, bool training);
    void backward(std::uint32_t n, bool want_input_grad);
    void step_body(std::uint32_t n);
    void check_batch(const Batch& b) const;
    Metrics take(DeviceMetrics* m, std::uint64_t& samples);
    std::vector<float> download(const float* p, std::uint64_t count) {
        std::vector<float> out(count);
        CUDA_CHECK(cudaStreamSynchronize(stream_));
        CUDA_CHECK(cudaMemcpy(out.data(), p, count * sizeof(float), cudaMemcpyDeviceToHost));
        return out;
    }
    void capture(cudaGraphExec_t& exec, const std::function<void()>& body);

    TrainerConfig cfg_;
    MemoryPlan plan_;
    std::uint64_t measured_ = 0;
    cudaStream_t stream_ = nullptr;
    cudnnHandle_t cudnn_ = nullptr;
    cublasHandle_t cublas_ = nullptr;
    cudnnActivationDescriptor_t relu_ = nullptr;
    void* arena_ = nullptr;
    float *params_ = nullptr, *grads_ = nullptr, *slots_ = nullptr, *states_ = nullptr;
    float *act0_ = nullptr, *gbuf_[2] = {nullptr, nullptr}, *input_grad_ = nullptr, *dlogits_ = nullptr;
    float *mean_ = nullptr, *inv_std_ = nullptr;
    std::int32_t* labels_ = nullptr;
    double* bn_partials_ = nullptr;
    void* workspace_ = nullptr;
    std::uint64_t workspace_bytes_ = 0;
    void* cublas_ws_ = nullptr;
    DeviceMetrics *train_m_ = nullptr, *eval_m_ = nullptr, *scratch_m_ = nullptr;
    unsigned long long* step_dev_ = nullptr;
    std::vector<LayerDev> dev_;
    std::map<std::uint32_t, BatchDescs> descs_;
    cudaGraphExec_t train_graph_ = nullptr, eval_graph_ = nullptr;
    std::uint64_t step_ = 0, train_samples_ = 0, eval_samples_ = 0;
    std::uint32_t last_n_ = 0;
};

CudaTrainer::CudaTrainer(const TrainerConfig& c) : cfg_(c) {
    if (cfg_.precision == Precision::bf16)
        throw usage_error("--precision bf16 is not available in this build of the cuda backend (use tf32 or fp32)");
    int count = 0;
    if (cudaGetDeviceCount(&count) != cudaSuccess || count == 0) {
        cudaGetLastError();
        throw no_fit_error("--device " + device_name(cfg_.device) + " (no CUDA GPU is visible) use --device cpu");
    }
    if (cfg_.device.index >= count)
        throw no_fit_error("--device " + device_name(cfg_.device) + " (only " + std::to_string(count) +
                           " GPU(s) visible)");
    CUDA_CHECK(cudaSetDevice(cfg_.device.index));
    CUDA_CHECK(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking));
    CUDNN_CHECK(cudnnCreate(&cudnn_));
    CUDNN_CHECK(cudnnSetStream(cudnn_, stream_));
    CUBLAS_CHECK(cublasCreate(&cublas_));
    CUBLAS_CHECK(cublasSetStream(cublas_, stream_));
    CUBLAS_CHECK(cublasSetMathMode(cublas_, cfg_.precision == Precision::tf32 ? CUBLAS_TF32_TENSOR_OP_MATH
                                                                              : CUBLAS_DEFAULT_MATH));
    CUDNN_CHECK(cudnnCreateActivationDescriptor(&relu_));
    CUDNN_CHECK(cudnnSetActivationDescriptor(relu_, CUDNN_ACTIVATION_RELU, CUDNN_NOT_PROPAGATE_NAN, 0.0));
    dev_.resize(layers().size());
    create_layer_descriptors();

    std::size_t free_before = 0, total = 0;
    CUDA_CHECK(cudaDeviceSynchronize());
    CUDA_CHECK(cudaMemGetInfo(&free_before, &total));

    Arena a;
    layout(a);
    const std::uint64_t bytes = a.used();
    if (cudaMalloc(&arena_, bytes) != cudaSuccess) {
        cudaGetLastError();
        throw no_fit_error("the model needs " + format_bytes(bytes) + " of GPU memory at batch " +
                           std::to_string(cfg_.max_batch) + " but " + format_bytes(free_before) +
                           " is free (use a smaller --batch or model)");
    }
    a.reset(reinterpret_cast<std::uintptr_t>(arena_));
    layout(a);
    CUBLAS_CHECK(cublasSetWorkspace(cublas_, cublas_ws_, cublas_workspace));

    std::vector<float> p(cfg_.plan.params), st(cfg_.plan.states), inv(cfg_.std.size());
    init_parameters(cfg_.plan, cfg_.seed, p, st);
    for (std::size_t i = 0; i < inv.size(); ++i) inv[i] = 1.0f / cfg_.std[i];
    CUDA_CHECK(cudaMemcpy(params_, p.data(), p.size() * 4, cudaMemcpyHostToDevice));
    CUDA_CHECK(cudaMemcpy(states_, st.data(), st.size() * 4, cudaMemcpyHostToDevice));
    CUDA_CHECK(cudaMemcpy(mean_, cfg_.mean.data(), cfg_.mean.size() * 4, cudaMemcpyHostToDevice));
    CUDA_CHECK(cudaMemcpy(inv_std_, inv.data(), inv.size() * 4, cudaMemcpyHostToDevice));
    CUDA_CHECK(cudaMemset(slots_, 0, cfg_.plan.params * cfg_.optimizer.slots() * 4));
    CUDA_CHECK(cudaMemset(train_m_, 0, sizeof(DeviceMetrics) * 3));
    CUDA_CHECK(cudaMemset(&train_m_->first_nonfinite, 0xff, 8));
    CUDA_CHECK(cudaMemset(step_dev_, 0, 8));
    CUDA_CHECK(cudaMemset(labels_, 0, 4 * std::uint64_t{cfg_.max_batch}));
    CUDA_CHECK(cudaMemset(act0_, 0, 4 * std::uint64_t{cfg_.max_batch} * cfg_.plan.input.numel()));
    find_algorithms();
    descs(cfg_.max_batch);

    const std::uint32_t n = cfg_.max_batch;
    capture(train_graph_, [&] { step_body(n); });
    capture(eval_graph_, [&] {
        forward(n, false);
        launch_softmax_xent(dev_.back().out, labels_, n, cfg_.plan.classes, 0.0f, nullptr, eval_m_, step_dev_, stream_);
    });
    CUDA_CHECK(cudaDeviceSynchronize());
    std::size_t free_after = 0;
    CUDA_CHECK(cudaMemGetInfo(&free_after, &total));
    measured_ = free_before > free_after ? free_before - free_after : 0;
}

void CudaTrainer::capture(cudaGraphExec_t& exec, const std::function<void()>& body) {
    cudaGraph_t graph;
    CUDA_CHECK(cudaStreamBeginCapture(stream_, cudaStreamCaptureModeThreadLocal));
    try {
        body();
    } catch (...) {
        cudaStreamEndCapture(stream_, &graph);
        throw;
    }
    CUDA_CHECK(cudaStreamEndCapture(stream_, &graph));
    CUDA_CHECK(cudaGraphInstantiate(&exec, graph, 0));
    CUDA_CHECK(cudaGraphDestroy(graph));
}

CudaTrainer::~CudaTrainer() {
    if (stream_) cudaStreamSynchronize(stream_);
    if (train_graph_) cudaGraphExecDestroy(train_graph_);
    if (eval_graph_) cudaGraphExecDestroy(eval_graph_);
    for (auto& [n, d] : descs_) {
        cudnnDestroyTensorDescriptor(d.input);
        for (auto t : d.out) cudnnDestroyTensorDescriptor(t);
    }
    for (auto& d : dev_) {
        if (d.filter) cudnnDestroyFilterDescriptor(d.filter);
        for (auto cd : {d.conv_fwd, d.conv_bwd_data, d.conv_bwd_filter})
            if (cd) cudnnDestroyConvolutionDescriptor(cd);
        if (d.pool) cudnnDestroyPoolingDescriptor(d.pool);
    }
    if (relu_) cudnnDestroyActivationDescriptor(relu_);
    if (cublas_) cublasDestroy(cublas_);
    if (cudnn_) cudnnDestroy(cudnn_);
    if (arena_) cudaFree(arena_);
    if (stream_) cudaStreamDestroy(stream_);
}

void CudaTrainer::layout(Arena& a) {
    const std::uint64_t b = cfg_.max_batch, np = cfg_.plan.params;
    params_ = a.take<float>(np);
    grads_ = a.take<float>(np);
    slots_ = a.take<float>(np * cfg_.optimizer.slots());
    states_ = a.take<float>(cfg_.plan.states);
    mean_ = a.take<float>(cfg_.plan.input.c);
    inv_std_ = a.take<float>(cfg_.plan.input.c);
    train_m_ = a.take<DeviceMetrics>(3);
    eval_m_ = train_m_ + 1;
    scratch_m_ = train_m_ + 2;
    step_dev_ = a.take<unsigned long long>(1);
    plan_.parameters = a.used();
    const std::uint64_t start = a.used();
    act0_ = a.take<float>(b * cfg_.plan.input.numel());
    labels_ = a.take<std::int32_t>(b);
    for (std::size_t i = 0; i < layers().size(); ++i) {
        const LayerPlan& l = layers()[i];
        LayerDev& d = dev_[i];
        const std::uint64_t count = b * l.out.numel();
        if (l.spec.kind == LayerKind::flatten || l.spec.kind == LayerKind::residual_begin)
            d.out = const_cast<float*>(input_of(i));
        else
            d.out = a.take<float>(count);
        if (l.spec.kind == LayerKind::batchnorm) d.aux = a.take<float>(2 * std::uint64_t{l.in.c});
        if (l.spec.kind == LayerKind::dropout) d.aux = a.take<float>(count);
        if (l.spec.kind == LayerKind::residual_end) d.stash = a.take<float>(count);
    }
    std::uint32_t bn_channels = 0;
    for (const auto& l : layers())
        if (l.spec.kind == LayerKind::batchnorm) bn_channels = std::max(bn_channels, l.in.c);
    bn_partials_ = a.take<double>(bn_partials(bn_channels));
    gbuf_[0] = a.take<float>(b * cfg_.plan.max_activation());
    gbuf_[1] = a.take<float>(b * cfg_.plan.max_activation());
    input_grad_ = a.take<float>(b * cfg_.plan.input.numel());
    dlogits_ = a.take<float>(b * cfg_.plan.classes);
    plan_.activations = a.used() - start;
    const std::uint64_t ws_start = a.used();
    workspace_ = a.take<std::uint8_t>(workspace_bytes_);
    cublas_ws_ = a.take<std::uint8_t>(cublas_workspace);
    plan_.workspace = a.used() - ws_start;
}

void CudaTrainer::create_layer_descriptors() {
    const cudnnMathType_t math = cfg_.precision == Precision::fp32 ? CUDNN_FMA_MATH : CUDNN_TENSOR_OP_MATH;
    for (std::size_t i = 0; i < layers().size(); ++i) {
        const LayerPlan& l = layers()[i];
        LayerDev& d = dev_[i];
        switch (l.spec.kind) {
        case LayerKind::conv: {
            const int k = static_cast<int>(l.spec.kernel), s = static_cast<int>(l.spec.stride),
                      p = static_cast<int>(l.spec.padding);
            CUDNN_CHECK(cudnnCreateFilterDescriptor(&d.filter));
            CUDNN_CHECK(cudnnSetFilter4dDescriptor(d.filter, CUDNN_DATA_FLOAT, CUDNN_TENSOR_NCHW,
                                                   static_cast<int>(l.out.c), static_cast<int>(l.in.c), k, k));
            for (auto* cd : {&d.conv_fwd, &d.conv_bwd_data, &d.conv_bwd_filter}) {
                CUDNN_CHECK(cudnnCreateConvolutionDescriptor(cd));
                CUDNN_CHECK(
                    cudnnSetConvolution2dDescriptor(*cd, p, p, s, s, 1, 1, CUDNN_CROSS_CORRELATION, CUDNN_DATA_FLOAT));
                CUDNN_CHECK(cudnnSetConvolutionMathType(*cd, math));
            }
            break;
        }
        case LayerKind::maxpool:
        case LayerKind::avgpool:
        case LayerKind::global_avgpool: {
            const bool gap = l.spec.kind == LayerKind::global_avgpool;
            const int kh = gap ? static_cast<int>(l.in.h) : static_cast<int>(l.spec.kernel);
            const int kw = gap ? static_cast<int>(l.in.w) : static_cast<int>(l.spec.kernel);
            const int sh = gap ? kh : static_cast<int>(l.spec.stride), sw = gap ? kw : static_cast<int>(l.spec.stride);
            CUDNN_CHECK(cudnnCreatePoolingDescriptor(&d.pool));
            CUDNN_CHECK(cudnnSetPooling2dDescriptor(d.pool,
                                                    l.spec.kind == LayerKind::maxpool
                                                        ? CUDNN_POOLING_MAX_DETERMINISTIC
                                                        : CUDNN_POOLING_AVERAGE_COUNT_INCLUDE_PADDING,
                                                    CUDNN_NOT_PROPAGATE_NAN, kh, kw, 0, 0, sh, sw));
            break;
        }
        default:
            break;
        }
    }
    // Workspace: the largest any heuristically ranked algorithm under the bound needs.
    BatchDescs probe;
    probe.input = make_tensor(cfg_.max_batch, cfg_.plan.input);
    for (const auto& l : layers()) probe.out.push_back(make_tensor(cfg_.max_batch, l.out));
    std::uint64_t ws = 0;
    for (std::size_t i = 0; i < layers().size(); ++i) {
        if (layers()[i].spec.kind != LayerKind::conv) continue;
        const auto x = i == 0 ? probe.input : probe.out[i - 1], y = probe.out[i];
        const LayerDev& d = dev_[i];
        int got = 0;
        cudnnConvolutionFwdAlgoPerf_t fp[CUDNN_CONVOLUTION_FWD_ALGO_COUNT];
        CUDNN_CHECK(cudnnGetConvolutionForwardAlgorithm_v7(cudnn_, x, d.filter, d.conv_fwd, y,
                                                           CUDNN_CONVOLUTION_FWD_ALGO_COUNT, &got, fp));
        for (int j = 0; j < got; ++j)
            if (fp[j].status == CUDNN_STATUS_SUCCESS && fp[j].memory <= cfg_.workspace_limit)
                ws = std::max<std::uint64_t>(ws, fp[j].memory);
        cudnnConvolutionBwdDataAlgoPerf_t dp[CUDNN_CONVOLUTION_BWD_DATA_ALGO_COUNT];
        CUDNN_CHECK(cudnnGetConvolutionBackwardDataAlgorithm_v7(cudnn_, d.filter, y, d.conv_bwd_data, x,
                                                                CUDNN_CONVOLUTION_BWD_DATA_ALGO_COUNT, &got, dp));
        for (int j = 0; j < got; ++j)
            if (dp[j].status == CUDNN_STATUS_SUCCESS && dp[j].memory <= cfg_.workspace_limit)
                ws = std::max<std::uint64_t>(ws, dp[j].memory);
        cudnnConvolutionBwdFilterAlgoPerf_t wp[CUDNN_CONVOLUTION_BWD_FILTER_ALGO_COUNT];
        CUDNN_CHECK(cudnnGetConvolutionBackwardFilterAlgorithm_v7(cudnn_, x, y, d.conv_bwd_filter, d.filter,
                                                                  CUDNN_CONVOLUTION_BWD_FILTER_ALGO_COUNT, &got, wp));
        for (int j = 0; j < got; ++j)
            if (wp[j].status == CUDNN_STATUS_SUCCESS && wp[j].memory <= cfg_.workspace_limit)
                ws = std::max<std::uint64_t>(ws, wp[j].memory);
    }
    cudnnDestroyTensorDescriptor(probe.input);
    for (auto t : probe.out) cudnnDestroyTensorDescriptor(t);
    workspace_bytes_ = ws;
}

// Benchmarks the algorithms once per convolution shape with the planned
// buffers and workspace, keeps the fastest that fits, and sets its math type.
// Find also reports tensor-core (TF32) results under FMA math: fp32 keeps to
// FMA ones.
void CudaTrainer::find_algorithms() {
    const bool fp32 = cfg_.precision == Precision::fp32;
    auto math_ok = [&](cudnnMathType_t m) { return !fp32 || m == CUDNN_FMA_MATH; };
    BatchDescs& bd = descs(cfg_.max_batch);
    for (std::size_t i = 0; i < layers().size(); ++i) {
        if (layers()[i].spec.kind != LayerKind::conv) continue;
        LayerDev& d = dev_[i];
        const auto x = i == 0 ? bd.input : bd.out[i - 1], y = bd.out[i];
        float* w = params_ + layers()[i].param_offset;
        int got = 0;
        cudnnConvolutionFwdAlgoPerf_t fp[CUDNN_CONVOLUTION_FWD_ALGO_COUNT];
        CUDNN_CHECK(cudnnFindConvolutionForwardAlgorithmEx(cudnn_, x, input_of(i), d.filter, w, d.conv_fwd, y, d.out,
                                                           CUDNN_CONVOLUTION_FWD_ALGO_COUNT, &got, fp, workspace_,
                                                           workspace_bytes_));
        for (int j = 0; j < got; ++j)
            if (fp[j].status == CUDNN_STATUS_SUCCESS && fp[j].memory <= workspace_bytes_ && math_ok(fp[j].mathType)) {
                d.algos.fwd = fp[j].algo;
                CUDNN_CHECK(cudnnSetConvolutionMathType(d.conv_fwd, fp[j].mathType));
                break;
            }
        cudnnConvolutionBwdDataAlgoPerf_t dp[CUDNN_CONVOLUTION_BWD_DATA_ALGO_COUNT];
        CUDNN_CHECK(cudnnFindConvolutionBackwardDataAlgorithmEx(cudnn_, d.filter, w, y, gbuf_[0], d.conv_bwd_data, x,
                                                                gbuf_[1], CUDNN_CONVOLUTION_BWD_DATA_ALGO_COUNT, &got,
                                                                dp, workspace_, workspace_bytes_));
        for (int j = 0; j < got; ++j)
            if (dp[j].status == CUDNN_STATUS_SUCCESS && dp[j].memory <= workspace_bytes_ && math_ok(dp[j].mathType)) {
                d.algos.bwd_data = dp[j].algo;
                CUDNN_CHECK(cudnnSetConvolutionMathType(d.conv_bwd_data, dp[j].mathType));
                break;
            }
        cudnnConvolutionBwdFilterAlgoPerf_t wp[CUDNN_CONVOLUTION_BWD_FILTER_ALGO_COUNT];
        CUDNN_CHECK(cudnnFindConvolutionBackwardFilterAlgorithmEx(
            cudnn_, x, input_of(i), y, gbuf_[0], d.conv_bwd_filter, d.filter, grads_ + layers()[i].param_offset,
            CUDNN_CONVOLUTION_BWD_FILTER_ALGO_COUNT, &got, wp, workspace_, workspace_bytes_));
        for (int j = 0; j < got; ++j)
            if (wp[j].status == CUDNN_STATUS_SUCCESS && wp[j].memory <= workspace_bytes_ && math_ok(wp[j].mathType)) {
                d.algos.bwd_filter = wp[j].algo;
                CUDNN_CHECK(cudnnSetConvolutionMathType(d.conv_bwd_filter, wp[j].mathType));
                break;
            }
        bd.algos[i] = d.algos;
    }
}

// Descriptors for batch size n; algorithms chosen for max_batch are kept where
// their workspace still fits, else the zero-workspace algorithms.
BatchDescs& CudaTrainer::descs(std::uint32_t n) {
    auto it = descs_.find(n);
    if (it != descs_.end()) return it->second;
    BatchDescs d;
    d.input = make_tensor(n, cfg_.plan.input);
    for (const auto& l : layers()) d.out.push_back(make_tensor(n, l.out));
    d.algos.resize(layers().size());
    for (std::size_t i = 0; i < layers().size(); ++i) {
        if (layers()[i].spec.kind != LayerKind::conv) continue;
        const LayerDev& ld = dev_[i];
        const auto x = i == 0 ? d.input : d.out[i - 1], y = d.out[i];
        ConvAlgos a = ld.algos;
        std::size_t need = 0;
        if (cudnnGetConvolutionForwardWorkspaceSize(cudnn_, x, ld.filter, ld.conv_fwd, y, a.fwd, &need) !=
                CUDNN_STATUS_SUCCESS ||
            need > workspace_bytes_)
            a.fwd = CUDNN_CONVOLUTION_FWD_ALGO_IMPLICIT_GEMM;
        if (cudnnGetConvolutionBackwardDataWorkspaceSize(cudnn_, ld.filter, y, ld.conv_bwd_data, x, a.bwd_data,
                                                         &need) != CUDNN_STATUS_SUCCESS ||
            need > workspace_bytes_)
            a.bwd_data = CUDNN_CONVOLUTION_BWD_DATA_ALGO_0;
        if (cudnnGetConvolutionBackwardFilterWorkspaceSize(cudnn_, x, y, ld.conv_bwd_filter, ld.filter, a.bwd_filter,
                                                           &need) != CUDNN_STATUS_SUCCESS ||
            need > workspace_bytes_)
            a.bwd_filter = CUDNN_CONVOLUTION_BWD_FILTER_ALGO_0;
        d.algos[i] = a;
    }
    return descs_.emplace(n, std::move(d)).first->second;
}

void CudaTrainer::check_batch(const Batch& b) const {
    if (b.size == 0 || b.size > cfg_.max_batch)
        throw usage_error("batch of " + std::to_string(b.size) + " samples (the trainer was planned for 1 to " +
                          std::to_string(cfg_.max_batch) + ")");
    if (!b.x || !b.y) throw runtime_error("batch without data");
}

void CudaTrainer::convert(const Batch& b) {
    const TensorShape in = cfg_.plan.input;
    launch_convert_input(b.x, cfg_.input_dtype, b.y, b.size, in.c, std::uint64_t{in.h} * in.w, mean_, inv_std_, act0_,
                         labels_, stream_);
}

void CudaTrainer::forward(std::uint32_t n, bool training) {
    const float one = 1.0f, zero = 0.0f;
    BatchDescs& bd = descs(n);
    for (std::size_t i = 0; i < layers().size(); ++i) {
        const LayerPlan& l = layers()[i];
        LayerDev& d = dev_[i];
        const float* x = input_of(i);
        const auto xd = i == 0 ? bd.input : bd.out[i - 1], yd = bd.out[i];
        const std::uint64_t count = std::uint64_t{n} * l.out.numel();
        const float* p = params_ + l.param_offset;
        switch (l.spec.kind) {
        case LayerKind::conv:
            CUDNN_CHECK(cudnnConvolutionForward(cudnn_, &one, xd, x, d.filter, p, d.conv_fwd, bd.algos[i].fwd,
                                                workspace_, workspace_bytes_, &zero, yd, d.out));
            if (l.spec.bias)
                launch_add_bias(d.out, p + std::uint64_t{l.out.c} * l.in.c * l.spec.kernel * l.spec.kernel, n, l.out.c,
                                std::uint64_t{l.out.h} * l.out.w, stream_);
            break;
        case LayerKind::batchnorm: {
            float* rm = states_ + l.state_offset;
            const std::uint64_t hw = std::uint64_t{l.in.h} * l.in.w;
            if (training)
                launch_bn_forward_train(x, d.out, n, l.in.c, hw, p, p + l.in.c, rm, rm + l.in.c, d.aux, d.aux + l.in.c,
                                        bn_partials_, static_cast<float>(bn_momentum), static_cast<float>(bn_eps),
                                        stream_);
            else
                launch_bn_forward_eval(x, d.out, n, l.in.c, hw, p, p + l.in.c, rm, rm + l.in.c,
                                       static_cast<float>(bn_eps), stream_);
            break;
        }
        case LayerKind::relu:
            CUDNN_CHECK(cudnnActivationForward(cudnn_, relu_, &one, xd, x, &zero, yd, d.out));
            break;
        case LayerKind::maxpool:
        case LayerKind::avgpool:
        case LayerKind::global_avgpool:
            CUDNN_CHECK(cudnnPoolingForward(cudnn_, d.pool, &one, xd, x, &zero, yd, d.out));
            break;
        case LayerKind::linear: {
            const int in = static_cast<int>(l.in.c), out = static_cast<int>(l.out.c);
            CUBLAS_CHECK(cublasSgemm(cublas_, CUBLAS_OP_T, CUBLAS_OP_N, out, static_cast<int>(n), in, &one, p, in, x,
                                     in, &zero, d.out, out));
            if (l.spec.bias) launch_add_bias(d.out, p + std::uint64_t{l.out.c} * l.in.c, n, l.out.c, 1, stream_);
            break;
        }
        case LayerKind::dropout:
            if (training && l.spec.drop > 0.0f)
                launch_dropout_forward(x, d.out, d.aux, count, l.spec.drop, cfg_.seed, i, step_dev_, stream_);
            else
                launch_copy(x, d.out, count, stream_);
            break;
        case LayerKind::flatten:
        case LayerKind::residual_begin:
            break; // aliases its input
        case LayerKind::residual_end:
            launch_add(x, input_of(static_cast<std::size_t>(l.partner)), d.out, count, stream_);
            break;
        }
    }
}

void CudaTrainer::backward(std::uint32_t n, bool want_input_grad) {
    const float one = 1.0f, zero = 0.0f;
    BatchDescs& bd = descs(n);
    const float* dy = dlogits_;
    for (std::size_t i = layers().size(); i-- > 0;) {
        const LayerPlan& l = layers()[i];
        LayerDev& d = dev_[i];
        const float* x = input_of(i);
        const auto xd = i == 0 ? bd.input : bd.out[i - 1], yd = bd.out[i];
        const float* p = params_ + l.param_offset;
        float* g = grads_ + l.param_offset;
        float* dx = i == 0 ? input_grad_ : (dy == gbuf_[0] ? gbuf_[1] : gbuf_[0]);
        const bool need_dx = i > 0 || want_input_grad;
        const std::uint64_t count_in = std::uint64_t{n} * l.in.numel();
        switch (l.spec.kind) {
        case LayerKind::conv:
            CUDNN_CHECK(cudnnConvolutionBackwardFilter(cudnn_, &one, xd, x, yd, dy, d.conv_bwd_filter,
                                                       bd.algos[i].bwd_filter, workspace_, workspace_bytes_, &zero,
                                                       d.filter, g));
            if (l.spec.bias)
                launch_bias_grad(dy, g + std::uint64_t{l.out.c} * l.in.c * l.spec.kernel * l.spec.kernel, n, l.out.c,
                                 std::uint64_t{l.out.h} * l.out.w, stream_);
            if (need_dx)
                CUDNN_CHECK(cudnnConvolutionBackwardData(cudnn_, &one, d.filter, p, yd, dy, d.conv_bwd_data,
                                                         bd.algos[i].bwd_data, workspace_, workspace_bytes_, &zero, xd,
                                                         dx));
            break;
        case LayerKind::batchnorm:
            launch_bn_backward(x, dy, dx, n, l.in.c, std::uint64_t{l.in.h} * l.in.w, p, d.aux, d.aux + l.in.c, g,
                               g + l.in.c, bn_partials_, stream_);
            break;
        case LayerKind::relu:
            CUDNN_CHECK(cudnnActivationBackward(cudnn_, relu_, &one, yd, d.out, yd, dy, xd, x, &zero, xd, dx));
            break;
        case LayerKind::maxpool:
        case LayerKind::avgpool:
        case LayerKind::global_avgpool:
            CUDNN_CHECK(cudnnPoolingBackward(cudnn_, d.pool, &one, yd, d.out, yd, dy, xd, x, &zero, xd, dx));
            break;
        case LayerKind::linear: {
            const int in = static_cast<int>(l.in.c), out = static_cast<int>(l.out.c), nn = static_cast<int>(n);
            CUBLAS_CHECK(
                cublasSgemm(cublas_, CUBLAS_OP_N, CUBLAS_OP_T, in, out, nn, &one, x, in, dy, out, &zero, g, in));
            if (l.spec.bias) launch_bias_grad(dy, g + std::uint64_t{l.out.c} * l.in.c, n, l.out.c, 1, stream_);
            if (need_dx)
                CUBLAS_CHECK(
                    cublasSgemm(cublas_, CUBLAS_OP_N, CUBLAS_OP_N, in, nn, out, &one, p, in, dy, out, &zero, dx, in));
            break;
        }
        case LayerKind::dropout:
            if (l.spec.drop > 0.0f)
                launch_mul(dy, d.aux, dx, count_in, stream_);
            else
                launch_copy(dy, dx, count_in, stream_);
            break;
        case LayerKind::flatten:
            if (i == 0)
                launch_copy(dy, dx, count_in, stream_);
            else
                dx = const_cast<float*>(dy);
            break;
        case LayerKind::residual_end:
            launch_copy(dy, d.stash, count_in, stream_);
            if (i == 0)
                launch_copy(dy, dx, count_in, stream_);
            else
                dx = const_cast<float*>(dy);
            break;
        case LayerKind::residual_begin:
            launch_add(dy, dev_[static_cast<std::size_t>(l.partner)].stash, dx, count_in, stream_);
            break;
        }
        dy = dx;
    }
}

void CudaTrainer::step_body(std::uint32_t n) {
    forward(n, true);
    launch_softmax_xent(dev_.back().out, labels_, n, cfg_.plan.classes, cfg_.label_smoothing, dlogits_, train_m_,
                        step_dev_, stream_);
    backward(n, false);
    launch_optimizer(cfg_.optimizer, cfg_.schedule, params_, grads_, slots_, cfg_.plan.params, step_dev_, stream_);
    launch_advance_step(step_dev_, stream_);
}

void CudaTrainer::train_step(const Batch& b) {
    check_batch(b);
    last_n_ = b.size;
    convert(b);
    if (b.size == cfg_.max_batch)
        CUDA_CHECK(cudaGraphLaunch(train_graph_, stream_));
    else
        step_body(b.size);
    ++step_;
    train_samples_ += b.size;
}

void CudaTrainer::evaluate(const Batch& b) {
    check_batch(b);
    last_n_ = b.size;
    convert(b);
    if (b.size == cfg_.max_batch) {
        CUDA_CHECK(cudaGraphLaunch(eval_graph_, stream_));
    } else {
        forward(b.size, false);
        launch_softmax_xent(dev_.back().out, labels_, b.size, cfg_.plan.classes, 0.0f, nullptr, eval_m_, step_dev_,
                            stream_);
    }
    eval_samples_ += b.size;
}

void CudaTrainer::compute_gradients(const Batch& b) {
    check_batch(b);
    last_n_ = b.size;
    convert(b);
    forward(b.size, true);
    launch_softmax_xent(dev_.back().out, labels_, b.size, cfg_.plan.classes, cfg_.label_smoothing, dlogits_, scratch_m_,
                        step_dev_, stream_);
    backward(b.size, true);
    CUDA_CHECK(cudaStreamSynchronize(stream_));
}

Metrics CudaTrainer::take(DeviceMetrics* m, std::uint64_t& samples) {
    DeviceMetrics h;
    CUDA_CHECK(cudaStreamSynchronize(stream_));
    CUDA_CHECK(cudaMemcpy(&h, m, sizeof h, cudaMemcpyDeviceToHost));
    CUDA_CHECK(cudaMemsetAsync(m, 0, offsetof(DeviceMetrics, first_nonfinite), stream_));
    Metrics out;
    out.samples = std::exchange(samples, 0);
    out.correct = h.correct;
    out.loss_sum = h.loss_sum;
    return out;
}

std::optional<std::uint64_t> CudaTrainer::first_nonfinite_step() {
    unsigned long long v = 0;
    CUDA_CHECK(cudaStreamSynchronize(stream_));
    CUDA_CHECK(cudaMemcpy(&v, &train_m_->first_nonfinite, 8, cudaMemcpyDeviceToHost));
    if (v == ~0ull) return std::nullopt;
    return v;
}

std::vector<std::uint8_t> CudaTrainer::save_state() {
    const auto p = read_parameters(), s = read_states();
    const auto slots = download(slots_, cfg_.plan.params * cfg_.optimizer.slots());
    return pack_state({p, s, slots, step_});
}

void CudaTrainer::load_state(std::span<const std::uint8_t> blob) {
    std::vector<float> p(cfg_.plan.params), s(cfg_.plan.states), slots(cfg_.plan.params * cfg_.optimizer.slots());
    step_ = unpack_state(blob, p, s, slots);
    CUDA_CHECK(cudaStreamSynchronize(stream_));
    CUDA_CHECK(cudaMemcpy(params_, p.data(), p.size() * 4, cudaMemcpyHostToDevice));
    CUDA_CHECK(cudaMemcpy(states_, s.data(), s.size() * 4, cudaMemcpyHostToDevice));
    CUDA_CHECK(cudaMemcpy(slots_, slots.data(), slots.size() * 4, cudaMemcpyHostToDevice));
    const unsigned long long st = step_;
    CUDA_CHECK(cudaMemcpy(step_dev_, &st, 8, cudaMemcpyHostToDevice));
    CUDA_CHECK(cudaMemset(&train_m_->first_nonfinite, 0xff, 8));
}

} // namespace

std::unique_ptr<Trainer> make_cuda_trainer(const TrainerConfig& config) {
    return std::make_unique<CudaTrainer>(config);
}

std::unique_ptr<BackendBuffer> make_cuda_buffer(int device, std::uint64_t bytes) {
    return std::make_unique<CudaBuffer>(device, bytes);
}

} // namespace dstk::train
