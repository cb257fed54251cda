// The cuda backend: cuDNN for convolutions, cuBLAS and cuBLASLt for linear
// layers (epilogue_gemm.hpp: bias, ReLU and bias gradient fused), dstk's own
// kernels for everything else and for two kinds of convolution where cuDNN is
// weak (direct_conv.cu, tc_wgrad.cu); conv_algorithms.cpp chooses.
// Activations are NHWC for tf32 and bf16 (cuDNN's tensor-core convolutions
// read it without transposes) and NCHW for fp32 (cuDNN's NHWC float kernels
// round like TF32); parameters, gradients and optimiser state are fp32 in the
// cpu backend's layout, so checkpoints are the same on both backends, and
// every weight gradient lies in one vector (grads_), which data-parallel
// training averages over the ranks with one collective per step; the
// convolutions (and linear layers in bf16, or reading flattened NHWC features)
// read compute copies of their weights that the optimiser step refreshes.
// One arena holds every buffer; the training step and evaluation are captured
// as CUDA graphs (the step again when a reducer is set or removed).
// DSTK_PROFILE_LAYERS=N times each operation over N steps outside the graph
// at start-up (man dstrain).
#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <stdexcept>
#include <utility>

#include <cuda_profiler_api.h>

#include "dstk/env.hpp"
#include "dstk/data/convert.hpp"
#include "dstk/dist/reducer.hpp"
#include "dstk/train/choice_cache.hpp"
#include "dstk/units.hpp"
#include "train/backends.hpp"
#include "train/batchnorm.hpp"
#include "train/conv_algorithms.hpp"
#include "train/cudnn_check.hpp"
#include "train/cudnn_graph.hpp"
#include "train/direct_conv.hpp"
#include "train/elementwise.hpp"
#include "train/epilogue_gemm.hpp"
#include "train/first_bn.hpp"
#include "train/input_layout.hpp"
#include "train/input_sets.hpp"
#include "train/linear_xent.hpp"
#include "train/loss.hpp"
#include "train/optimizer_step.hpp"
#include "train/pooling.hpp"
#include "train/side_branch.hpp"
#include "train/tc_conv.hpp"
#include "train/tc_wgrad.hpp"
#include "train/wgmma_wgrad.hpp"
#include "train/wgmma_conv.hpp"

namespace dstk::train {
namespace {

namespace fs = std::filesystem;

using namespace dstk::train::cuda;

constexpr double bn_eps = 1e-5, bn_momentum = 0.1;
constexpr std::uint64_t cublas_workspace = std::uint64_t{32} << 20;
constexpr std::uint32_t no_copy = ~0u;
// tc_conv's variant in one group of warps per block: the second of its candidates (own_candidates).
constexpr int one_group = 1;

// Bump allocation inside one cudaMalloc; measuring pass first (base 0).
class Arena {
  public:
    void* take_bytes(std::uint64_t bytes) {
        offset_ = (offset_ + 255) & ~std::uint64_t{255};
        void* p = reinterpret_cast<void*>(base_ + offset_);
        offset_ += std::max<std::uint64_t>(1, bytes);
        return p;
    }
    template <class T> T* take(std::uint64_t count) { return static_cast<T*>(take_bytes(count * sizeof(T))); }
    std::uint64_t used() const { return offset_; }
    void reset(std::uintptr_t base) {
        base_ = base;
        offset_ = 0;
    }

  private:
    std::uintptr_t base_ = 0;
    std::uint64_t offset_ = 0;
};

struct LayerDev {
    void* out = nullptr;  // activation (aliases the input for residual_begin, and flatten where no transpose is needed)
    float* aux = nullptr; // bn: saved mean and inverse std; dropout: mask
    void* stash = nullptr;    // residual_end: gradient for the skip path
    void* wk = nullptr;       // conv: KRSC weights; linear in bf16 mode or NHWC order: copies of the weights
    void* gk = nullptr;       // conv: gradient of wk; linear reading NHWC order: fp32 gradient of wk
    void* wturned = nullptr;  // conv with an own data gradient: wk turned for it (turn_filters_ahead)
    bool relu_next = false;   // batchnorm followed by relu: fused where allowed
    bool tc_wgrad = false;    // conv: weight gradient by tc_wgrad.cu (tf32, bf16)
    bool wgmma_wgrad = false; // conv: weight gradient by wgmma_wgrad.cu (tf32, compute 9.0)
    bool tc_fwd = false;      // conv: forward by tc_conv.cu (bf16, tf32)
    bool wgmma_fwd = false;   // conv: forward by wgmma_conv.cu (bf16, tf32, compute 9.0)
    bool tc_dgrad = false;    // conv: data gradient by tc_conv.cu (bf16, tf32)
    bool wgmma_dgrad = false; // conv: data gradient by wgmma_conv.cu (bf16, tf32, compute 9.0)
    bool fwd_one_group = false, dgrad_one_group = false; // tc_conv in one group of warps per block (TcConvShape)
    bool bn_stats = false;     // conv: its forward (tc_conv, wgmma_conv) also sums the next batch norm's statistics
    bool pool_next = false;    // batchnorm, relu, 2x2 max-pool: the pool fused in as well
    bool add_next = false;     // batchnorm, relu, a residual block's end: its sum written by the batchnorm
    bool relu_in_gemm = false; // linear followed by relu: the relu's output written by the GEMM where fused
    // Flatten (and heads reading it): the features stay in this NHWC map's
    // order, not the cpu backend's NCHW one; the linear layers that read them
    // take their weight copies' columns in that order (c == 0: not so).
    TensorShape nhwc_flat;
    cudnnFilterDescriptor_t filter = nullptr;
    cudnnConvolutionDescriptor_t conv_fwd = nullptr, conv_bwd_data = nullptr, conv_bwd_filter = nullptr;
    ConvAlgos algos; // for max_batch
    // An own data gradient (tc_conv, wgmma_conv), on the filters turned for it.
    bool own_dgrad() const { return tc_dgrad || wgmma_dgrad; }
    // An own weight gradient (tc_wgrad, wgmma_wgrad): summed straight into the gradient vector.
    bool own_wgrad() const { return tc_wgrad || wgmma_wgrad; }
    // conv: cuDNN graph-API configurations, each operation's candidates
    // until find_algorithms, then the chosen one (null: another kernel).
    // They run at max_batch only; other batch sizes run algos' fitting.
    std::vector<std::shared_ptr<GraphConv>> graph_cands[3];
    std::shared_ptr<GraphConv> graph_fwd, graph_dgrad, graph_wgrad;
};

// Tensor descriptors and algorithms for one batch size.
struct BatchDescs {
    cudnnTensorDescriptor_t input = nullptr;
    std::vector<cudnnTensorDescriptor_t> out;
    std::vector<ConvAlgos> algos;
    std::vector<ConvUnfit> unfit; // per layer: the operations cuDNN has no fitting algorithm for at this batch
};

// Throws where cuDNN has no algorithm for an operation it is about to run
// (fit_conv_algorithms: empty where it has).
void require_fit(const std::string& why) {
    if (!why.empty()) throw runtime_error(why);
}

std::uint64_t conv_weights(const LayerPlan& l) {
    return std::uint64_t{l.out.c} * l.in.c * l.spec.kernel * l.spec.kernel;
}

PoolShape pool_shape(const LayerPlan& l, std::uint32_t n, bool nchw) {
    return {n, l.in.c, l.in.h, l.in.w, l.out.h, l.out.w, l.spec.kernel, l.spec.stride, nchw};
}

// Host-side NHWC -> NCHW of a downloaded batch (inspection only).
// Keeps the first `keep` channels.
std::vector<float> to_nchw(const std::vector<float>& v, TensorShape s, std::uint32_t keep) {
    const std::uint64_t hw = std::uint64_t{s.h} * s.w, per = s.numel();
    if (keep == s.c && (hw == 1 || s.c == 1)) return v;
    const std::uint64_t n = v.size() / per, out_per = std::uint64_t{keep} * hw;
    std::vector<float> out(n * out_per);
    for (std::uint64_t k = 0; k < n; ++k)
        for (std::uint64_t j = 0; j < hw; ++j)
            for (std::uint64_t c = 0; c < keep; ++c) out[k * out_per + c * hw + j] = v[k * per + j * s.c + c];
    return out;
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
    Metrics take_train_metrics() override { return take(train_phase, train_samples_); }
    Metrics take_eval_metrics() override { return take(eval_phase, eval_samples_); }
    std::optional<std::uint64_t> first_nonfinite_step() override;
    std::uint64_t steps() const override { return step_; }
    void synchronize() override { sync_main(); }
    void* compute_stream() const override { return stream_; }
    void* input_stream() const override { return in_->stream(); }
    bool reads_rows() const override { return true; } // convert() reads every field through its rows
    std::vector<KernelReport> kernel_choices() const override { return reports_; }
    void set_reducer(dist::Reducer* reducer) override;
    void average_states() override;

    std::vector<std::uint8_t> save_state() override;
    void load_state(std::span<const std::uint8_t> blob) override;

    // Inspection reads what compute_gradients left: it runs unfused, so the
    // output of a batchnorm followed by relu is there too.
    void compute_gradients(const Batch& b) override;
    std::vector<float> read_activation(std::size_t layer) override {
        if (layer >= layers().size()) throw runtime_error("read_activation: no layer " + std::to_string(layer));
        const TensorShape s = layers()[layer].out, flat = dev_[layer].nhwc_flat;
        auto v = download_act(dev_[layer].out, std::uint64_t{last_n_} * s.numel());
        if (flat.c) return to_nchw(v, flat, flat.c);
        return nchw_ ? v : to_nchw(v, s, s.c);
    }
    std::vector<float> read_input_gradient() override {
        auto v = download_act(input_grad_, std::uint64_t{last_n_} * input_.numel());
        return nchw_ ? v : to_nchw(v, input_, cfg_.plan.input.c);
    }
    std::vector<float> read_gradients() override { return download(grads_, cfg_.plan.params); }
    std::vector<float> read_parameters() override { return download(params_, cfg_.plan.params); }
    std::vector<float> read_states() override { return download(states_, cfg_.plan.states); }
    void write_parameters(std::span<const float> p) override {
        if (p.size() != cfg_.plan.params) throw runtime_error("write_parameters: wrong size");
        sync_main();
        CUDA_CHECK(cudaMemcpy(params_, p.data(), p.size_bytes(), cudaMemcpyHostToDevice));
        refresh_copies();
    }

  private:
    const std::vector<LayerPlan>& layers() const { return cfg_.plan.layers; }
    std::vector<std::size_t> readers(std::size_t x) const;
    bool only_linear_reads(std::size_t x) const;
    void plan_linear_fusion();
    void plan_linear_xent();
    TensorShape nhwc_order(std::size_t i) const {
        const std::int32_t src = layers()[i].source;
        return src < 0 ? TensorShape{} : dev_[static_cast<std::size_t>(src)].nhwc_flat;
    }
    bool linear_copied(std::size_t i) const { return at_ == ActType::bf16 || nhwc_order(i).c != 0; }
    void plan_copies();
    void layout(Arena& a);
    void layout_metrics(Arena& a);
    void create_layer_descriptors();
    void find_algorithms();
    // Where tc_conv's and tc_wgrad's candidates start in OwnKernels' lists
    // (wgmma_conv's and wgmma_wgrad's come first).
    struct OwnStarts {
        int tc_fwd = 0, tc_dgrad = 0, tc_wgrad = 0;
    };
    OwnKernels own_candidates(std::size_t i, OwnStarts& at);
    std::uint64_t plan_graph_convs(std::size_t i);
    GraphKernels graph_kernels(std::size_t i);
    ConvSearch search() const;
    ConvKey conv_key(std::size_t i) const;
    ConvCall conv_call(const BatchDescs& bd, std::size_t i) const;
    BatchDescs& descs(std::uint32_t n);
    const void* input_of(std::size_t i) const {
        const std::int32_t src = layers()[i].source;
        return src < 0 ? act0_[in_->current()] : dev_[static_cast<std::size_t>(src)].out;
    }
    cudnnTensorDescriptor_t input_desc(const BatchDescs& bd, std::size_t i) const {
        const std::int32_t src = layers()[i].source;
        return src < 0 ? bd.input : bd.out[static_cast<std::size_t>(src)];
    }
    DirectConvShape direct_shape(std::uint32_t n) const;
    TcWgradShape wgrad_shape(std::size_t i, std::uint32_t n) const;
    TcConvShape conv_shape(std::size_t i, std::uint32_t n, bool data_gradient) const;
    void convert(const StepFields& b, bool training, bool on_lane = false);
    void forward(std::uint32_t n, bool training, bool fuse);
    void forward_first_conv_bn(std::uint32_t n);
    static constexpr std::size_t npos = ~std::size_t{0};
    // early: a layer after whose backward pass the parameters of it and the
    // layers above are updated beside the rest of the pass (npos: none).
    void backward(std::uint32_t n, bool want_input_grad, bool fuse, std::size_t early = npos,
                  const std::function<void()>& before_join = {});
    bool low_update_before_join(std::size_t early) const;
    std::size_t early_update_layer() const;
    std::size_t upper_update_layer(std::size_t early) const;
    bool early_update_in_wgrad(std::size_t early, std::size_t upper) const;
    bool low_update_in_first_bn(std::size_t early) const;
    ParamUpdate param_update(bool advance) const;
    std::size_t weighted_layer(std::size_t n) const;
    const void* first_relu_out(bool fuse) const;
    bool first_bn_into_wgrad() const;
    void read_switches();
    void plan_input_work();
    void plan_conv_bn_stats();
    bool stats_in_conv_fit(std::size_t i) const;
    TcConvStats conv_stats(std::size_t i) const;
    void forward_wgmma_conv(std::size_t i, const void* x, std::uint32_t n, bool training, unsigned& splits);
    void plan_first_wgrad_in_dgrad();
    void update(ParamRange r, cudaStream_t s, bool advance = false);
    const void* backward_layer(std::size_t i, std::uint32_t n, const void* dy, void* dx, bool need_dx, bool fuse);
    void backward_conv(std::size_t i, std::uint32_t n, const void* dy, void* dx, bool need_dx, bool turned,
                       bool accumulate = false);
    bool only_reader(std::size_t layer, std::size_t reader) const;
    bool dgrad_sums_skip(std::size_t begin) const;
    bool skip_sum_site(std::size_t begin) const;
    void* stash_above(std::size_t i) const;
    void turn_filters_ahead(cudaStream_t s);
    void backward_linear(std::size_t i, std::uint32_t n, const void* dy, void* dx, bool need_dx,
                         bool dx_written = false);
    void forward_linear(std::size_t i, std::uint32_t n, bool fuse);
    // A linear layer's cuBLASLt plans at one batch size (null: the plain GEMM and kernels).
    struct FcGemms {
        std::unique_ptr<EpilogueGemm> forward, forward_relu, weight_grad;
    };
    FcGemms plan_fc_gemms(std::size_t i, std::uint32_t n);
    std::vector<FcGemms>& fc_gemms(std::uint32_t n);
    void report_rule_choices();
    void report_updates();
    void step_body(std::uint32_t n);
    void refresh_copies();
    void upload_initial_state();
    void create_streams();
    void gemm(cublasHandle_t h, cublasOperation_t ta, cublasOperation_t tb, int m, int n, int k, const void* a,
              cudaDataType_t at, int lda, const void* b, int ldb, void* c, cudaDataType_t ct, int ldc);
    // The stream, handles and workspaces (cuDNN's, cuBLAS's) an operation runs with.
    struct Lane {
        cudaStream_t stream;
        cudnnHandle_t cudnn;
        cublasHandle_t cublas;
        void* workspace;
        void* blas_workspace;
    };
    Lane weight_lane(bool data_gradient_follows);
    enum Phase : int { train_phase, eval_phase, scratch_phase };
    HeadLossArgs head_loss_args(std::size_t h, std::uint32_t n, Phase phase, bool want_grad) const;
    void losses(std::uint32_t n, Phase phase, bool want_grad, bool fuse);
    void linear_xent(std::uint32_t n, Phase phase, bool want_grad);
    Metrics take(Phase phase, std::uint64_t& samples);
    // The host waits for the main stream (and so for any lane step it waits
    // for); what it enqueues after comes before the next lane step (after_lane_).
    void sync_main() {
        after_lane_ = false;
        CUDA_CHECK(cudaStreamSynchronize(stream_));
    }
    std::vector<float> download(const float* p, std::uint64_t count) {
        std::vector<float> out(count);
        sync_main();
        CUDA_CHECK(cudaMemcpy(out.data(), p, count * sizeof(float), cudaMemcpyDeviceToHost));
        return out;
    }
    std::vector<float> download_act(const void* p, std::uint64_t count);
    void capture(cudaGraphExec_t& exec, const std::function<void()>& body);
    void capture_train_graph(cudaGraphExec_t current);
    void capture_step(cudaGraphExec_t& exec);
    std::size_t overlap_layer() const;
    bool steps_overlap() const;
    void launch_on_lane();
    void for_each_set(const std::function<void(unsigned)>& body);
    void alias_input_set();
    void choose_weight_branch();
    std::string step_key() const;
    ChoiceCache choice_cache(const DeviceIdentity& id) const;
    void with_state_restored(const std::function<void()>& body);
    void mark(std::size_t layer, const char* what);
    void profile_layers(int steps);

    TrainerConfig cfg_;
    ActType at_ = ActType::f32;
    bool nchw_ = false;
    bool direct_first_ = false; // layer 0 is a convolution run by direct_conv.cu
    bool force_own_ = false;    // DSTK_CONV_KERNELS=own: our kernels wherever they apply, untimed
    bool force_graph_ = false;  // DSTK_CONV_KERNELS=graph: cuDNN's graph-API kernels wherever allowed, untimed
    // DSTK_FC_FUSED=0: linear layers as plain GEMMs and kernels, flattened
    // features transposed to NCHW (to time one against the other).
    bool fc_fused_ = true;
    // DSTK_RESIDUAL_FUSED=0: each residual block's sum a pass of its own,
    // forward and backward (add_next, dgrad_sums_skip).
    bool residual_fused_ = true;
    // Whether a batch norm right after a direct first convolution leaves its
    // backward to that convolution's weight gradient and the input's moments
    // (first_bn_into_wgrad, settled once at setup; DSTK_FIRST_CONV_BN=0: never).
    bool first_conv_bn_ = true;
    // Whether a batch norm after a tc_conv forward takes its statistics from
    // that convolution's epilogue (plan_conv_bn_stats; DSTK_CONV_BN_STATS=0:
    // never).
    bool conv_bn_stats_ = true;
    // For which operations (fwd, bwd_data, bwd_filter) cuDNN's graph-API
    // configurations are timed beside its legacy algorithms, and whether on
    // every convolution, not only by the default rule (plan_graph_convs;
    // DSTK_CUDNN_GRAPH).
    bool graph_ops_[3] = {true, true, true};
    bool graph_everywhere_ = false;
    // The layer whose tc_conv data gradient also sums the first convolution's
    // weight gradient (TcConvFirstWgrad; plan_first_wgrad_in_dgrad;
    // DSTK_FIRST_WGRAD_FUSED=0: none), or 0: none; and the partials rows it
    // wrote in this backward pass (0: the first convolution's own kernel runs).
    std::size_t first_wgrad_at_ = 0;
    unsigned first_wgrad_rows_ = 0;
    bool leave_first_bn_ = false;         // this backward pass: first_conv_bn_ and no input gradient wanted
    std::optional<FirstBnIn> pending_bn_; // set by a batch norm's backward left to the layer below
    // first_bn_moments of each input set's batch, taken as it is converted
    // (where first_conv_bn_), and the workspace of their partial sums.
    float* moments_[InputSets::count] = {};
    void* moments_ws_ = nullptr;
    // A training batch converted by the moments kernel as it reads it
    // (launch_first_bn_moments_converting; DSTK_INPUT_IN_MOMENTS=0: the
    // conversion's own pass, then the moments).
    bool input_in_moments_ = false;
    // InputSets::open_gate at the end of each step's forward pass: by default
    // (plan_input_work), and whether DSTK_INPUT_GATE decided it.
    bool input_gate_ = false, input_gate_set_ = false;
    TensorShape input_; // as stored on the device: channels padded in bf16 before a first convolution
    cudnnDataType_t cudnn_type_ = CUDNN_DATA_FLOAT;
    cudaDataType_t blas_type_ = CUDA_R_32F;
    cublasComputeType_t blas_compute_ = CUBLAS_COMPUTE_32F;
    MemoryPlan plan_;
    std::uint64_t measured_ = 0;
    cudaStream_t stream_ = nullptr;
    cudnnHandle_t cudnn_ = nullptr;
    cublasHandle_t cublas_ = nullptr;
    cublasLtHandle_t lt_ = nullptr;
    std::map<std::uint32_t, std::vector<FcGemms>> fc_gemms_; // per batch size, per layer
    void* arena_ = nullptr;
    float *params_ = nullptr, *grads_ = nullptr, *slots_ = nullptr, *states_ = nullptr;
    float *mean_ = nullptr, *inv_std_ = nullptr, *side_mean_ = nullptr, *side_inv_std_ = nullptr;
    // Compute copies: copy[i] = params[map[i]]; conv weights first (their
    // gradients gcopy share those indices), then linear weights in bf16 mode
    // or where they read features in NHWC order (columns permuted).
    void *wcopy_ = nullptr, *gcopy_ = nullptr;
    std::uint32_t *map_ = nullptr, *inv_ = nullptr;
    std::vector<std::uint32_t> map_host_, inv_host_;
    std::uint64_t conv_copies_ = 0;
    std::vector<std::uint64_t> copy_offset_; // per layer, elements into wcopy
    std::vector<std::uint64_t> copy_count_;  // per conv layer, its elements there
    // Per conv layer: its copy holds every input channel, and a filter fits
    // launch_scatter_filter_grads (DSTK_FILTER_SCATTER=0: none does).
    std::vector<bool> filter_scatter_;
    // The converted input and the targets, one set per InputSets slot (the
    // graphs are captured once per set).
    std::unique_ptr<InputSets> in_;
    void* act0_[InputSets::count] = {};
    std::vector<std::size_t> input_aliases_; // layers whose output is act0_ itself (alias_input_set)
    void* input_grad_ = nullptr;
    GradBuffers gbuf_; // data gradients, three so that the side branch's reads overlap the layers below
    // Per head: the loss gradient of its outputs, its target (classes or
    // float values) and where its metric sums lie in a phase's block.
    struct HeadDev {
        void* dz = nullptr;
        std::int32_t* labels[InputSets::count] = {};
        float* y[InputSets::count] = {};
        std::uint64_t sums_offset = 0; // doubles into MetricsBlock::sums
    };
    std::vector<HeadDev> heads_;
    void* trunk_grad_ = nullptr; // heads: the sum of their gradients of the trunk's output
    double* bn_partials_ = nullptr;
    void* workspace_ = nullptr;
    std::uint64_t workspace_bytes_ = 0;
    void* cublas_ws_ = nullptr;
    // Weight gradients beside the data gradients (side_branch.hpp), with
    // their own cuDNN and cuBLAS workspaces.
    std::unique_ptr<SideBranch> side_;
    // The update of the upper layers' parameters, beside the last weight
    // gradient (upper_update_layer; DSTK_UPPER_UPDATE=0: none).
    std::unique_ptr<SideBranch> upper_;
    bool upper_update_ = true;
    // The classifier's last linear layer and its softmax cross-entropy in one
    // kernel (linear_xent.hpp, plan_linear_xent), in the steps that fuse:
    // that layer (npos: none), the ReLU whose output it reads and whose
    // backward it takes in (npos: none), and, during a training step's
    // backward pass, the layer's input gradient it wrote.
    bool linear_xent_ = true; // DSTK_LINEAR_XENT=0|1 decides either way
    std::size_t xent_layer_ = npos, xent_relu_ = npos;
    const void* xent_dx_ = nullptr;
    bool low_update_first_ = true; // low_update_before_join
    // Updates applied by the kernels that finish the gradients
    // (optimizer_step.hpp, ParamUpdate; DSTK_UPDATE_IN_GRADIENT=0|1 decides
    // either way), in the backward pass of a training step: the early
    // layer's weights in its weight gradient's sums (that layer, npos: none),
    // and the parameters below it in the first batch norm's backward.
    bool update_early_in_gradient_ = true, update_low_in_gradient_ = true;
    std::size_t update_in_wgrad_at_ = npos;
    bool low_update_in_first_bn_ = false;
    bool one_stream_ = false; // the weight gradients on the main stream too (choose_weight_branch)
    void *side_ws_ = nullptr, *side_cublas_ws_ = nullptr;
    // Per phase (training, evaluation, inspection): the heads' counters, their
    // metric sums and the first step whose loss was not finite, in one block.
    struct MetricsBlock {
        DeviceHeadMetrics* heads = nullptr;
        double* sums = nullptr;
        unsigned long long* first_nonfinite = nullptr;
    };
    MetricsBlock metrics_[3];
    std::uint64_t metric_sums_ = 0, metrics_bytes_ = 0;
    unsigned long long* step_dev_ = nullptr;
    StepScalars* scalars_ = nullptr; // this step's learning rate and bias corrections
    std::vector<LayerDev> dev_;
    std::vector<KernelReport> reports_;
    std::map<std::uint32_t, BatchDescs> descs_;
    cudaGraphExec_t train_graph_[InputSets::count] = {}, eval_graph_[InputSets::count] = {};
    // Training steps that overlap (steps_overlap; DSTK_OVERLAP_STEPS=0:
    // none): each set's graph runs on a lane of its own, so that a step's
    // first layers run beside the tail of the step before (its last weight
    // gradient and updates). The layer whose output those first layers write
    // while that tail still reads it has one buffer per input set
    // (overlap_layer; npos: none). head_done_: a step's main chain has ended
    // (recorded in its graph); step_done_: the whole step has (recorded on
    // its lane after it, waited for in the next step's graph before the
    // layers whose weights the tail updates).
    bool overlap_steps_ = true;
    bool graph_overlaps_ = false; // the training graphs were captured so
    bool overlapping_ = false;    // while one is captured
    // The last work enqueued was a lane's step: the next one waits for its
    // main chain alone. The main stream's work comes after a conversion for
    // it (convert) or after a host wait for it (sync_main), which clear it.
    bool after_lane_ = false;
    std::size_t overlap_x_ = npos;
    void* xbuf_[InputSets::count] = {};
    cudaStream_t lanes_[InputSets::count] = {};
    cudaEvent_t head_done_ = nullptr, step_done_ = nullptr, lane_sync_ = nullptr;
    dist::Reducer* reducer_ = nullptr; // data-parallel: averages grads_ over the ranks every step
    std::uint64_t step_ = 0, train_samples_ = 0, eval_samples_ = 0;
    std::uint32_t last_n_ = 0;
    // Profiling (DSTK_PROFILE_LAYERS): events recorded after each operation.
    std::vector<std::pair<std::string, cudaEvent_t>>* marks_ = nullptr;
};

// Parameters from the seed, normalisation, the copy maps; every counter and
// batch buffer zeroed.
void CudaTrainer::upload_initial_state() {
    std::vector<float> p(cfg_.plan.params), st(cfg_.plan.states);
    init_parameters(cfg_.plan, cfg_.seed, p, st);
    auto inverse = [](const std::vector<float>& v) {
        std::vector<float> out(v.size());
        for (std::size_t i = 0; i < v.size(); ++i) out[i] = 1.0f / v[i];
        return out;
    };
    auto upload = [](void* dst, const std::vector<float>& v) {
        if (!v.empty()) CUDA_CHECK(cudaMemcpy(dst, v.data(), v.size() * 4, cudaMemcpyHostToDevice));
    };
    upload(params_, p);
    upload(states_, st);
    upload(mean_, cfg_.mean);
    upload(inv_std_, inverse(cfg_.std));
    upload(side_mean_, cfg_.side.mean);
    upload(side_inv_std_, inverse(cfg_.side.std));
    if (!map_host_.empty())
        CUDA_CHECK(cudaMemcpy(map_, map_host_.data(), map_host_.size() * 4, cudaMemcpyHostToDevice));
    CUDA_CHECK(cudaMemcpy(inv_, inv_host_.data(), inv_host_.size() * 4, cudaMemcpyHostToDevice));
    CUDA_CHECK(cudaMemset(slots_, 0, cfg_.plan.params * cfg_.optimizer.slots() * 4));
    for (const MetricsBlock& m : metrics_) {
        CUDA_CHECK(cudaMemset(m.heads, 0, metrics_bytes_));
        CUDA_CHECK(cudaMemset(m.first_nonfinite, 0xff, 8));
    }
    CUDA_CHECK(cudaMemset(step_dev_, 0, 8));
    for (std::size_t h = 0; h < heads_.size(); ++h) {
        const std::uint64_t b = cfg_.max_batch, w = cfg_.plan.heads[h].target.width;
        for (unsigned k = 0; k < InputSets::count; ++k) {
            if (heads_[h].labels[k]) CUDA_CHECK(cudaMemset(heads_[h].labels[k], 0, 4 * b));
            if (heads_[h].y[k]) CUDA_CHECK(cudaMemset(heads_[h].y[k], 0, 4 * b * w));
        }
    }
    for (void* a : act0_) CUDA_CHECK(cudaMemset(a, 0, act_bytes(at_) * cfg_.max_batch * input_.numel()));
    for (float* m : moments_) // the zero input's
        if (m) CUDA_CHECK(cudaMemset(m, 0, first_bn_moments(direct_shape(cfg_.max_batch)) * sizeof(float)));
}

// The step's stream at the device's greatest priority, the input stream
// (InputSets) at its least: the next batch's gather and conversion then take
// the SMs the step leaves idle instead of delaying its kernels. The cuDNN and
// cuBLAS handles on the step's stream, the side branch beside it.
void CudaTrainer::create_streams() {
    int least = 0, greatest = 0;
    CUDA_CHECK(cudaDeviceGetStreamPriorityRange(&least, &greatest));
    CUDA_CHECK(cudaStreamCreateWithPriority(&stream_, cudaStreamNonBlocking, greatest));
    CUDNN_CHECK(cudnnCreate(&cudnn_));
    CUDNN_CHECK(cudnnSetStream(cudnn_, stream_));
    CUBLAS_CHECK(cublasCreate(&cublas_));
    CUBLAS_CHECK(cublasSetStream(cublas_, stream_));
    CUBLAS_CHECK(cublasLtCreate(&lt_));
    const cublasMath_t math = cfg_.precision == Precision::tf32 ? CUBLAS_TF32_TENSOR_OP_MATH : CUBLAS_DEFAULT_MATH;
    CUBLAS_CHECK(cublasSetMathMode(cublas_, math));
    side_ = std::make_unique<SideBranch>(stream_, math);
    if (upper_update_) upper_ = std::make_unique<SideBranch>(stream_, math, false);
    in_ = std::make_unique<InputSets>(stream_, least);
    for (cudaStream_t& l : lanes_) CUDA_CHECK(cudaStreamCreateWithPriority(&l, cudaStreamNonBlocking, greatest));
    for (cudaEvent_t* e : {&head_done_, &step_done_, &lane_sync_})
        CUDA_CHECK(cudaEventCreateWithFlags(e, cudaEventDisableTiming));
}

CudaTrainer::CudaTrainer(const TrainerConfig& c) : cfg_(c) {
    int count = 0;
    if (cudaGetDeviceCount(&count) != cudaSuccess || count == 0) {
        cudaGetLastError();
        throw no_fit_error("--device " + device_name(cfg_.device) + " (no CUDA GPU is visible) use --device cpu");
    }
    if (cfg_.device.index >= count)
        throw no_fit_error("--device " + device_name(cfg_.device) + " (only " + std::to_string(count) +
                           " GPU(s) visible)");
    CUDA_CHECK(cudaSetDevice(cfg_.device.index));
    if (cfg_.precision == Precision::bf16) {
        cudaDeviceProp prop{};
        CUDA_CHECK(cudaGetDeviceProperties(&prop, cfg_.device.index));
        if (prop.major < 8)
            throw no_fit_error("--precision bf16 (the GPU, compute capability " + std::to_string(prop.major) + "." +
                               std::to_string(prop.minor) + ", has no bf16 tensor cores) use --precision fp32");
        at_ = ActType::bf16;
        cudnn_type_ = CUDNN_DATA_BFLOAT16;
        blas_type_ = CUDA_R_16BF;
    }
    nchw_ = cfg_.precision == Precision::fp32;
    read_switches();
    input_ = cfg_.plan.input;
    if (at_ == ActType::bf16 && !layers().empty() && layers()[0].spec.kind == LayerKind::conv)
        input_.c = (input_.c + 7) / 8 * 8;
    blas_compute_ = cfg_.precision == Precision::tf32 ? CUBLAS_COMPUTE_32F_FAST_TF32 : CUBLAS_COMPUTE_32F;
    create_streams();
    gbuf_.create_events();
    dev_.resize(layers().size());
    for (std::size_t i = 0; i + 1 < layers().size(); ++i)
        dev_[i].relu_next = layers()[i].spec.kind == LayerKind::batchnorm &&
                            layers()[i + 1].spec.kind == LayerKind::relu &&
                            layers()[i + 1].source == static_cast<std::int32_t>(i);
    for (std::size_t i = 0; i + 2 < layers().size(); ++i) {
        const LayerPlan& l = layers()[i];
        const LayerSpec& pool = layers()[i + 2].spec;
        dev_[i].pool_next = dev_[i].relu_next && !nchw_ && pool.kind == LayerKind::maxpool && pool.kernel == 2 &&
                            pool.stride == 2 && pool.padding == 0 &&
                            bn_pool_fusable(at_, l.in.c, l.in.h, l.in.w, cfg_.max_batch);
        dev_[i].add_next = residual_fused_ && dev_[i].relu_next && !dev_[i].pool_next &&
                           layers()[i + 2].spec.kind == LayerKind::residual_end && only_reader(i + 1, i + 2);
    }
    plan_linear_fusion();
    plan_linear_xent();
    plan_copies();
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
    side_->set_cublas_workspace(side_cublas_ws_, cublas_workspace);

    upload_initial_state();
    refresh_copies();
    find_algorithms();
    descs(cfg_.max_batch);
    first_conv_bn_ = first_bn_into_wgrad();
    plan_input_work();
    plan_conv_bn_stats();
    plan_first_wgrad_in_dgrad();
    report_rule_choices(); // plans them for max_batch, before any capture

    const std::uint32_t n = cfg_.max_batch;
    choose_weight_branch();
    report_updates();
    for_each_set([&](unsigned k) {
        capture(eval_graph_[k], [&] {
            forward(n, false, true);
            losses(n, eval_phase, false, true);
        });
    });
    CUDA_CHECK(cudaDeviceSynchronize());
    std::size_t free_after = 0;
    CUDA_CHECK(cudaMemGetInfo(&free_after, &total));
    measured_ = free_before > free_after ? free_before - free_after : 0;
    if (const long n = env_long("DSTK_PROFILE_LAYERS", 0); n > 0)
        with_state_restored([&] { profile_layers(static_cast<int>(n)); });
    // Under a profiler started with --profile-from-start off (nsys, ncu), the
    // range starts here: the algorithm search and warm-up stay outside it.
    cudaProfilerStart();
}

// The switches that turn the engine's fused paths off (man/dstrain.1, ENVIRONMENT).
void CudaTrainer::read_switches() {
    if (env_off("DSTK_FC_FUSED")) fc_fused_ = false;
    if (env_off("DSTK_RESIDUAL_FUSED")) residual_fused_ = false;
    if (env_off("DSTK_FIRST_CONV_BN")) first_conv_bn_ = false;
    if (env_off("DSTK_CONV_BN_STATS")) conv_bn_stats_ = false;
    if (const std::string_view g = env_value("DSTK_CUDNN_GRAPH"); !g.empty()) {
        const std::string v = "," + std::string(g) + ",";
        const char* names[3] = {",fwd,", ",bwd_data,", ",bwd_filter,"};
        for (int op = 0; op < 3; ++op) graph_ops_[op] = v == ",1," || v.find(names[op]) != std::string::npos;
        graph_everywhere_ = true;
    }
    if (env_off("DSTK_UPPER_UPDATE")) upper_update_ = false;
    if (env_off("DSTK_LOW_UPDATE_FIRST")) low_update_first_ = false;
    overlap_steps_ = env_flag("DSTK_OVERLAP_STEPS").value_or(overlap_steps_);
    // The first batch norm's update not in tf32: there the step measured
    // slower with it (and faster with the early layer's).
    update_early_in_gradient_ = true;
    update_low_in_gradient_ = cfg_.precision != Precision::tf32;
    if (const auto on = env_flag("DSTK_UPDATE_IN_GRADIENT")) update_early_in_gradient_ = update_low_in_gradient_ = *on;
    // Not in tf32 by default: there the next batch's conversion runs beside
    // the small kernels this replaces (plan_input_work's gate), and the step
    // measured slower with the one kernel.
    linear_xent_ = cfg_.precision != Precision::tf32;
    linear_xent_ = env_flag("DSTK_LINEAR_XENT").value_or(linear_xent_);
}

// How a training batch is converted: by the first batch norm's moments
// kernel as it reads it, where that applies (DSTK_INPUT_IN_MOMENTS=0: a pass
// of its own), and when. The next batch's conversion is held back until a
// step's forward pass has run, in tf32 where steps do not overlap
// (step_body): beside the forward's own float convolutions (blocks that fill
// an SM) it slowed the step more than beside the backward pass. In bf16 the
// gate measured slower; in tf32 where steps overlap, no faster and less
// steady. DSTK_INPUT_GATE=0|1 decides either way.
void CudaTrainer::plan_input_work() {
    input_in_moments_ = first_conv_bn_ && first_bn_converts(at_, cfg_.input_dtype, direct_shape(cfg_.max_batch));
    if (env_off("DSTK_INPUT_IN_MOMENTS")) input_in_moments_ = false;
    input_gate_ = cfg_.precision == Precision::tf32;
    const auto gate = env_flag("DSTK_INPUT_GATE");
    input_gate_set_ = gate.has_value();
    if (input_gate_set_) input_gate_ = *gate;
}

void CudaTrainer::mark(std::size_t layer, const char* what) {
    if (!marks_) return;
    std::string label = what;
    if (layer < layers().size()) {
        const LayerPlan& l = layers()[layer];
        char buf[96];
        std::snprintf(buf, sizeof buf, "L%-2zu %-9s %4ux%ux%u ", layer,
                      std::string(layer_kind_name(l.spec.kind)).c_str(), l.out.c, l.out.h, l.out.w);
        label = buf + label;
    }
    cudaEvent_t ev;
    CUDA_CHECK(cudaEventCreate(&ev));
    CUDA_CHECK(cudaEventRecord(ev, stream_));
    marks_->emplace_back(std::move(label), ev);
}

void CudaTrainer::profile_layers(int steps) {
    const std::uint32_t n = cfg_.max_batch;
    std::vector<std::string> order;
    std::map<std::string, double> total;
    for (int it = -2; it < steps; ++it) { // two warm-up steps
        std::vector<std::pair<std::string, cudaEvent_t>> marks;
        marks_ = &marks;
        mark(~std::size_t{0}, "start");
        step_body(n);
        marks_ = nullptr;
        sync_main();
        for (std::size_t k = 1; k < marks.size(); ++k) {
            float ms = 0.0f;
            CUDA_CHECK(cudaEventElapsedTime(&ms, marks[k - 1].second, marks[k].second));
            if (it >= 0) {
                if (!total.count(marks[k].first)) order.push_back(marks[k].first);
                total[marks[k].first] += ms;
            }
        }
        for (auto& m : marks) cudaEventDestroy(m.second);
    }
    const double step_ms = time_on_stream(
        stream_, [&] { CUDA_CHECK(cudaGraphLaunch(train_graph_[in_->current()], stream_)); }, 50);
    // The conversion runs outside the graph: timed apart, on a zero batch
    // (every field reads the same zero bytes).
    void* xin = nullptr;
    std::uint64_t bytes = 0;
    for (const BatchField& f : batch_fields(cfg_)) bytes = std::max(bytes, n * f.sample_bytes());
    CUDA_CHECK(cudaMalloc(&xin, bytes));
    CUDA_CHECK(cudaMemset(xin, 0, bytes));
    StepFields zero_batch;
    zero_batch.x.data = zero_batch.side.data = xin;
    zero_batch.targets.fill({xin, nullptr});
    zero_batch.size = n;
    const double convert_ms = time_on_stream(
        in_->stream(), [&] { convert(zero_batch, true); }, 50);
    sync_main();
    cudaFree(xin);
    double sum = 0.0;
    for (auto& [k, v] : total) sum += v / steps;
    std::fprintf(stderr, "profile: %s, batch %u, %d steps outside the graph (ms per step, share)\n",
                 std::string(precision_name(cfg_.precision)).c_str(), n, steps);
    for (const auto& k : order)
        std::fprintf(stderr, "  %-48s %8.4f %5.1f%%\n", k.c_str(), total[k] / steps, 100.0 * total[k] / steps / sum);
    std::fprintf(stderr,
                 "profile: sum of operations %.4f ms; graph step %.4f ms (%.0f samples/s without input conversion)\n",
                 sum, step_ms, n * 1000.0 / step_ms);
    std::fprintf(stderr, "profile: conversion of the batch's fields (outside the graph) %.4f ms per batch\n",
                 convert_ms);
    std::vector<std::pair<std::string, double>> top(total.begin(), total.end());
    std::sort(top.begin(), top.end(), [](const auto& x, const auto& y) { return x.second > y.second; });
    std::fprintf(stderr, "profile: top operations\n");
    for (std::size_t k = 0; k < top.size() && k < 12; ++k)
        std::fprintf(stderr, "  %-48s %8.4f ms\n", top[k].first.c_str(), top[k].second / steps);
    for (std::size_t i = 0; i < layers().size(); ++i)
        if (i == 0 && direct_first_)
            std::fprintf(stderr, "profile: L0 conv direct kernels (forward, weight gradient)\n");
        else if (layers()[i].spec.kind == LayerKind::conv)
            std::fprintf(stderr, "profile: L%zu conv algorithms fwd %s bwd-data %s bwd-filter %s, workspace %s\n", i,
                         dev_[i].wgmma_fwd ? "wgmma_conv"
                         : dev_[i].tc_fwd  ? "tc_conv"
                                           : std::to_string(static_cast<int>(dev_[i].algos.fwd)).c_str(),
                         dev_[i].wgmma_dgrad ? "wgmma_conv"
                         : dev_[i].tc_dgrad  ? "tc_conv"
                                             : std::to_string(static_cast<int>(dev_[i].algos.bwd_data)).c_str(),
                         dev_[i].wgmma_wgrad ? "wgmma_wgrad"
                         : dev_[i].tc_wgrad  ? "tc_wgrad"
                                             : std::to_string(static_cast<int>(dev_[i].algos.bwd_filter)).c_str(),
                         format_bytes(workspace_bytes_).c_str());
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

// Where the weight gradients run (side_branch.hpp): beside the data
// gradients or on the main stream, whichever step is faster here. Both
// steps are captured and timed as two candidates of the kernel choice, by
// its rules and in its cache, unless DSTK_WEIGHT_BRANCH (0 or 1) fixes it.
// Timing trains: the state is restored after.
void CudaTrainer::choose_weight_branch() {
    const std::string names[2] = {"side_stream", "main_stream"};
    const std::size_t step_layer = layers().size(); // reported as the step's, not a layer's
    if (const auto branch = env_flag("DSTK_WEIGHT_BRANCH")) {
        one_stream_ = !*branch;
        reports_.push_back({step_layer, "weight_gradients", names[one_stream_], ChoiceSource::rule, 0.0});
        capture_train_graph(nullptr);
        return;
    }
    cudaGraphExec_t graphs[2] = {};
    for (int v = 0; v < 2; ++v) {
        one_stream_ = v == 1;
        capture_step(graphs[v]);
    }
    const DeviceIdentity id = device_identity(cfg_.device.index);
    ChoiceCache cache = choice_cache(id);
    ConvChooser chooser(search(), cfg_.kernels, &cache, id.text());
    std::size_t pick = 0;
    const auto choose = [&] {
        pick = chooser.choose_variant(step_key(), step_layer, "weight_gradients", {names[0], names[1]},
                                      [&](std::size_t j) { CUDA_CHECK(cudaGraphLaunch(graphs[j], stream_)); });
    };
    // Only these modes time (and so train); the others take the cache's or the heuristic choice.
    const bool may_time = cfg_.kernels == KernelMode::automatic || cfg_.kernels == KernelMode::retune;
    if (may_time) {
        with_state_restored(choose);
        cache.store();
    } else {
        choose();
    }
    reports_.insert(reports_.end(), chooser.reports().begin(), chooser.reports().end());
    one_stream_ = pick == 1;
    CUDA_CHECK(cudaGraphExecDestroy(graphs[1 - pick]));
    capture_train_graph(graphs[pick]);
}

// One word naming what the step's time depends on besides the device: the
// precision, determinism, batch, the layers' kinds and shapes and the
// convolutions' kernel choices (hashed).
std::string CudaTrainer::step_key() const {
    std::string text;
    for (const LayerPlan& l : layers())
        text += std::string(layer_kind_name(l.spec.kind)) + ":" + std::to_string(l.in.c) + "x" +
                std::to_string(l.in.h) + "x" + std::to_string(l.in.w) + ">" + std::to_string(l.out.c) + ";";
    for (const KernelReport& r : reports_) text += std::to_string(r.layer) + r.op + r.kernel + ";";
    return "step.weight_branch." + std::string(precision_name(cfg_.precision)) + (cfg_.deterministic ? ".det" : "") +
           ".n" + std::to_string(cfg_.max_batch) + "." + text_hash(text);
}

// Runs body (which may train) and puts parameters, optimiser state,
// statistics, the step counter and the training metrics back as they were.
void CudaTrainer::with_state_restored(const std::function<void()>& body) {
    const auto saved = save_state();
    body();
    load_state(saved);
    CUDA_CHECK(cudaMemset(metrics_[train_phase].heads, 0, metrics_bytes_));
    CUDA_CHECK(cudaMemset(metrics_[train_phase].first_nonfinite, 0xff, 8));
}

// The training graph of each input set; `current`: one already captured for
// the current set.
void CudaTrainer::capture_train_graph(cudaGraphExec_t current) {
    const unsigned now = in_->current();
    for_each_set([&](unsigned k) {
        if (train_graph_[k]) CUDA_CHECK(cudaGraphExecDestroy(train_graph_[k]));
        train_graph_[k] = k == now ? current : nullptr;
        if (!train_graph_[k]) capture_step(train_graph_[k]);
    });
    graph_overlaps_ = steps_overlap();
}

// A full training step's graph, tied to the steps before and after it by
// events where steps overlap (step_body, launch_on_lane).
void CudaTrainer::capture_step(cudaGraphExec_t& exec) {
    overlapping_ = steps_overlap();
    try {
        capture(exec, [&] { step_body(cfg_.max_batch); });
    } catch (...) {
        overlapping_ = false;
        throw;
    }
    overlapping_ = false;
}

// The layer whose output the next step's first layers write while the tail
// of the step before still reads it: the first batch norm's (its ReLU's,
// where fused) when the first convolution and that norm run as one
// (forward_first_conv_bn) and the second weighted layer alone reads it, as
// its input. npos where no step overlaps another (DSTK_OVERLAP_STEPS=0, a
// side input, which the conversion writes into the network's activations).
std::size_t CudaTrainer::overlap_layer() const {
    if (!overlap_steps_ || cfg_.plan.side || layers().size() < 3 || !first_bn_into_wgrad()) return npos;
    const std::size_t x = dev_[1].relu_next ? 2 : 1, next = weighted_layer(2);
    if (next != x + 1 || layers()[next].source != static_cast<std::int32_t>(x)) return npos;
    return readers(x) == std::vector<std::size_t>{next} ? x : npos;
}

// Whether a training step's first layers (up to overlap_layer's) run beside
// the tail of the step before: where the parameters they read are updated
// on the main stream before the side branches join it (early_update_layer
// right above them, low_update_before_join), so that the step's main chain
// ends before its tail does. Only the next layer, and the step's learning
// rate and turned filters, wait for that tail. Not where the gradients are
// averaged across ranks (no early update then). Results are the same bits.
bool CudaTrainer::steps_overlap() const {
    const std::size_t early = early_update_layer();
    return overlap_x_ != npos && first_conv_bn_ && early == overlap_x_ + 1 && low_update_before_join(early);
}

// body(k) with each input set current in turn (no conversion runs: only the
// buffers that input_of() and losses() name change), the current set after.
void CudaTrainer::for_each_set(const std::function<void(unsigned)>& body) {
    const unsigned was = in_->current();
    for (unsigned k = 0; k < InputSets::count; ++k) {
        in_->select(k);
        alias_input_set();
        body(k);
    }
    in_->select(was);
    alias_input_set();
}

// The layers whose output is the converted input itself (a flatten, a
// residual's start or a head right on the input) name the current set's, as
// does the layer whose output has a buffer per set (overlap_layer).
void CudaTrainer::alias_input_set() {
    for (const std::size_t i : input_aliases_) dev_[i].out = act0_[in_->current()];
    if (overlap_x_ != npos) dev_[overlap_x_].out = xbuf_[in_->current()];
}

// Rank 0's parameters everywhere, then the training graph captured again with
// (or without) the gradient all-reduce. The reducer's first collective runs
// before the capture: NCCL sets up its connections on first use, with calls
// a capture does not allow.
void CudaTrainer::set_reducer(dist::Reducer* reducer) {
    sync_main();
    if (reducer) {
        reducer->broadcast_device(params_, cfg_.plan.params, stream_);
        reducer->average_device(grads_, cfg_.plan.params, stream_); // grads_ is overwritten by every backward pass
        refresh_copies();
    }
    reducer_ = reducer;
    capture_train_graph(nullptr);
}

// BN running statistics are updated from each rank's own batches; their mean
// over the ranks is what evaluation and saved models use.
void CudaTrainer::average_states() {
    if (!reducer_ || cfg_.plan.states == 0) return;
    reducer_->average_device(states_, cfg_.plan.states, stream_);
    sync_main();
}

CudaTrainer::~CudaTrainer() {
    if (stream_) cudaStreamSynchronize(stream_);
    side_.reset();
    upper_.reset();
    in_.reset();
    for (auto g : train_graph_)
        if (g) cudaGraphExecDestroy(g);
    for (auto g : eval_graph_)
        if (g) cudaGraphExecDestroy(g);
    for (auto& [n, d] : descs_) {
        cudnnDestroyTensorDescriptor(d.input);
        for (auto t : d.out) cudnnDestroyTensorDescriptor(t);
    }
    for (auto& d : dev_) {
        if (d.filter) cudnnDestroyFilterDescriptor(d.filter);
        for (auto cd : {d.conv_fwd, d.conv_bwd_data, d.conv_bwd_filter})
            if (cd) cudnnDestroyConvolutionDescriptor(cd);
    }
    fc_gemms_.clear();
    if (lt_) cublasLtDestroy(lt_);
    if (cublas_) cublasDestroy(cublas_);
    if (cudnn_) cudnnDestroy(cudnn_);
    if (arena_) cudaFree(arena_);
    for (cudaEvent_t e : {head_done_, step_done_, lane_sync_})
        if (e) cudaEventDestroy(e);
    for (cudaStream_t l : lanes_)
        if (l) cudaStreamDestroy(l);
    if (stream_) cudaStreamDestroy(stream_);
}

// The layers that read layer x's output, and ~0 where it is a head's output.
std::vector<std::size_t> CudaTrainer::readers(std::size_t x) const {
    std::vector<std::size_t> r;
    for (const HeadPlan& h : cfg_.plan.heads)
        if (h.output == x) r.push_back(~std::size_t{0});
    for (std::size_t j = x + 1; j < layers().size(); ++j)
        if (layers()[j].source == static_cast<std::int32_t>(x)) r.push_back(j);
    return r;
}

// Whether only linear layers read x's output, directly or through heads (which alias it).
bool CudaTrainer::only_linear_reads(std::size_t x) const {
    for (const std::size_t j : readers(x)) {
        if (j == ~std::size_t{0}) return false;
        const LayerKind k = layers()[j].spec.kind;
        if (k == LayerKind::head ? !only_linear_reads(j) : k != LayerKind::linear) return false;
    }
    return true;
}

// What DSTK_FC_FUSED allows around the linear layers. A flatten of an NHWC
// map whose features only linear layers read leaves them in NHWC order: those
// layers' weight copies take their columns in that order instead
// (plan_copies), so neither pass transposes, and dx = W^T dy comes out in NHWC
// order too. A linear layer whose only reader is a relu writes the relu's
// output itself (in its GEMM's epilogue where cuBLASLt takes it).
void CudaTrainer::plan_linear_fusion() {
    if (!fc_fused_) return;
    for (std::size_t i = 0; i < layers().size(); ++i) {
        const LayerPlan& l = layers()[i];
        if (l.spec.kind == LayerKind::flatten && !nchw_ && l.in.h * l.in.w > 1 && only_linear_reads(i))
            dev_[i].nhwc_flat = l.in;
        const std::int32_t src = l.source;
        if (l.spec.kind == LayerKind::head && src >= 0)
            dev_[i].nhwc_flat = dev_[static_cast<std::size_t>(src)].nhwc_flat;
        const std::vector<std::size_t> r = readers(i);
        dev_[i].relu_in_gemm = l.spec.kind == LayerKind::linear && r.size() == 1 && r[0] == i + 1 &&
                               layers()[i + 1].spec.kind == LayerKind::relu;
    }
}

// Whether the one head's prediction is a linear layer that linear_xent_takes
// under a softmax cross-entropy, reading a layer's output (not the input
// itself): then the fused steps run it with its loss (linear_xent.hpp). Where
// it reads a ReLU's output that nothing else reads and whose backward is a
// kernel of its own (not a batch norm's), the kernel applies that ReLU's mask
// too.
void CudaTrainer::plan_linear_xent() {
    const auto& heads = cfg_.plan.heads;
    if (!linear_xent_ || heads.size() != 1 || heads[0].target.loss != LossKind::ce) return;
    const std::size_t i = heads[0].output;
    const LayerPlan& l = layers()[i];
    if (l.spec.kind != LayerKind::linear || !linear_xent_takes(l.out.c, l.in.c) || l.source < 0) return;
    xent_layer_ = i;
    const auto r = static_cast<std::size_t>(l.source);
    if (layers()[r].spec.kind == LayerKind::relu && readers(r) == std::vector<std::size_t>{i} &&
        !(r > 0 && dev_[r - 1].relu_next))
        xent_relu_ = r;
}

// Which parameters have compute copies, and where: conv filters KCRS -> KRSC
// (NHWC) or as they are (NCHW), then linear weights (bf16, or NHWC-ordered
// features in any precision), their columns in the order of their features.
// Padded input channels of a first convolution get no_copy (weight 0, no
// gradient).
void CudaTrainer::plan_copies() {
    inv_host_.assign(cfg_.plan.params, no_copy);
    copy_offset_.assign(layers().size(), 0);
    copy_count_.assign(layers().size(), 0);
    filter_scatter_.assign(layers().size(), false);
    const bool by_filter = !env_off("DSTK_FILTER_SCATTER");
    for (const bool conv_pass : {true, false}) {
        for (std::size_t i = 0; i < layers().size(); ++i) {
            const LayerPlan& l = layers()[i];
            if (conv_pass && l.spec.kind == LayerKind::conv) {
                // 16-byte aligned: the tensor memory accelerator reads them (wgmma_conv); the gap is never read
                while (map_host_.size() % 8) map_host_.push_back(no_copy);
                copy_offset_[i] = map_host_.size();
                const std::uint64_t rs = std::uint64_t{l.spec.kernel} * l.spec.kernel;
                const std::uint32_t cin = i == 0 ? input_.c : l.in.c;
                auto add = [&](std::uint64_t k, std::uint64_t c, std::uint64_t j) {
                    if (c >= l.in.c) {
                        map_host_.push_back(no_copy);
                        return;
                    }
                    const std::uint64_t src = l.param_offset + (k * l.in.c + c) * rs + j;
                    inv_host_[src] = static_cast<std::uint32_t>(map_host_.size());
                    map_host_.push_back(static_cast<std::uint32_t>(src));
                };
                for (std::uint64_t k = 0; k < l.out.c; ++k)
                    if (nchw_)
                        for (std::uint64_t c = 0; c < cin; ++c)
                            for (std::uint64_t j = 0; j < rs; ++j) add(k, c, j);
                    else
                        for (std::uint64_t j = 0; j < rs; ++j)
                            for (std::uint64_t c = 0; c < cin; ++c) add(k, c, j);
                copy_count_[i] = map_host_.size() - copy_offset_[i];
                filter_scatter_[i] =
                    by_filter && !nchw_ && cin == l.in.c && filter_scatter_fits(cin, static_cast<std::uint32_t>(rs));
            } else if (!conv_pass && l.spec.kind == LayerKind::linear && linear_copied(i)) {
                if (fc_fused_) // 256-byte aligned for cuBLASLt's fast kernels; the gap is never read
                    while (map_host_.size() % 128) map_host_.push_back(no_copy);
                copy_offset_[i] = map_host_.size();
                // Column j of the copy weighs feature j of the features as the layer reads them: of an
                // NHWC map f, pixel j / f.c and channel j % f.c, which the parameters hold in column
                // channel * hw + pixel (the cpu backend's NCHW flattening).
                const TensorShape f = nhwc_order(i);
                const std::uint64_t hw = std::uint64_t{f.h} * f.w;
                for (std::uint64_t o = 0; o < l.out.c; ++o)
                    for (std::uint64_t j = 0; j < l.in.c; ++j) {
                        const std::uint64_t col = f.c ? j % f.c * hw + j / f.c : j;
                        const std::uint64_t src = l.param_offset + o * l.in.c + col;
                        inv_host_[src] = static_cast<std::uint32_t>(map_host_.size());
                        map_host_.push_back(static_cast<std::uint32_t>(src));
                    }
            }
        }
        if (conv_pass) conv_copies_ = map_host_.size();
    }
}

void CudaTrainer::layout(Arena& a) {
    const std::uint64_t b = cfg_.max_batch, np = cfg_.plan.params, ab = act_bytes(at_);
    params_ = a.take<float>(np);
    grads_ = a.take<float>(np);
    slots_ = a.take<float>(np * cfg_.optimizer.slots());
    states_ = a.take<float>(cfg_.plan.states);
    mean_ = a.take<float>(cfg_.plan.input.c);
    inv_std_ = a.take<float>(cfg_.plan.input.c);
    side_mean_ = a.take<float>(cfg_.side.mean.size());
    side_inv_std_ = a.take<float>(cfg_.side.std.size());
    layout_metrics(a);
    step_dev_ = a.take<unsigned long long>(1);
    scalars_ = a.take<StepScalars>(1);
    wcopy_ = a.take_bytes(map_host_.size() * ab);
    gcopy_ = a.take_bytes(conv_copies_ * ab);
    map_ = a.take<std::uint32_t>(map_host_.size());
    inv_ = a.take<std::uint32_t>(np);
    plan_.parameters = a.used();
    const std::uint64_t start = a.used();
    for (void*& x : act0_) x = a.take_bytes(b * input_.numel() * ab);
    input_aliases_.clear();
    overlap_x_ = overlap_layer();
    for (std::size_t i = 0; i < layers().size(); ++i) {
        const LayerPlan& l = layers()[i];
        LayerDev& d = dev_[i];
        const std::uint64_t count = b * l.out.numel();
        if (l.spec.kind == LayerKind::residual_begin || l.spec.kind == LayerKind::head ||
            (l.spec.kind == LayerKind::flatten && (nchw_ || l.in.h * l.in.w == 1 || d.nhwc_flat.c))) {
            d.out = const_cast<void*>(input_of(i));
            if (d.out == act0_[in_->current()]) input_aliases_.push_back(i);
        } else
            d.out = a.take_bytes(count * ab);
        if (i == overlap_x_) {
            xbuf_[0] = d.out;
            for (unsigned k = 1; k < InputSets::count; ++k) xbuf_[k] = a.take_bytes(count * ab);
            d.out = xbuf_[in_->current()];
        }
        if (l.spec.kind == LayerKind::batchnorm) d.aux = a.take<float>(2 * std::uint64_t{l.in.c});
        if (l.spec.kind == LayerKind::dropout) d.aux = a.take<float>(count);
        if (l.spec.kind == LayerKind::residual_end) d.stash = a.take_bytes(count * ab);
        if (l.spec.kind == LayerKind::conv) {
            d.wk = static_cast<char*>(wcopy_) + copy_offset_[i] * ab;
            d.gk = static_cast<char*>(gcopy_) + copy_offset_[i] * ab;
            if (d.own_dgrad()) d.wturned = a.take_bytes(tc_conv_scratch(conv_shape(i, cfg_.max_batch, true)));
        } else if (l.spec.kind == LayerKind::linear && linear_copied(i)) {
            d.wk = static_cast<char*>(wcopy_) + copy_offset_[i] * ab;
            if (nhwc_order(i).c) d.gk = a.take<float>(std::uint64_t{l.out.c} * l.in.c);
        }
    }
    std::uint32_t bn_channels = 0;
    for (const auto& l : layers())
        if (l.spec.kind == LayerKind::batchnorm) bn_channels = std::max(bn_channels, l.in.c);
    bn_partials_ = a.take<double>(bn_partials(std::max(bn_channels, 1u)));
    if (direct_first_) {
        for (float*& m : moments_) m = a.take<float>(first_bn_moments(direct_shape(cfg_.max_batch)));
        moments_ws_ = a.take_bytes(first_bn_moments_workspace(direct_shape(cfg_.max_batch)));
    }
    for (std::size_t k = 0; k < GradBuffers::count; ++k)
        gbuf_.set(k, a.take_bytes(b * cfg_.plan.max_activation() * ab));
    input_grad_ = a.take_bytes(b * input_.numel() * ab);
    for (std::size_t h = 0; h < heads_.size(); ++h) {
        const Target& t = cfg_.plan.heads[h].target;
        heads_[h].dz = a.take_bytes(b * t.width * ab);
        for (unsigned k = 0; k < InputSets::count; ++k) {
            heads_[h].labels[k] = t.loss == LossKind::ce ? a.take<std::int32_t>(b) : nullptr;
            heads_[h].y[k] = t.loss == LossKind::ce ? nullptr : a.take<float>(b * t.width);
        }
    }
    if (cfg_.plan.heads[0].begin >= 0) {
        const std::int32_t t = cfg_.plan.trunk_end();
        trunk_grad_ =
            a.take_bytes(b * (t < 0 ? input_.numel() : layers()[static_cast<std::size_t>(t)].out.numel()) * ab);
    }
    plan_.activations = a.used() - start;
    const std::uint64_t ws_start = a.used();
    workspace_ = a.take<std::uint8_t>(workspace_bytes_);
    cublas_ws_ = a.take<std::uint8_t>(cublas_workspace);
    side_ws_ = a.take<std::uint8_t>(workspace_bytes_);
    side_cublas_ws_ = a.take<std::uint8_t>(cublas_workspace);
    plan_.workspace = a.used() - ws_start;
}

// Each phase's block: the heads' counters, then their metric sums (every
// loss but ce: HeadMetrics::rows per output), then the first non-finite step.
void CudaTrainer::layout_metrics(Arena& a) {
    heads_.resize(cfg_.plan.heads.size());
    metric_sums_ = 0;
    for (std::size_t h = 0; h < heads_.size(); ++h) {
        const Target& t = cfg_.plan.heads[h].target;
        heads_[h].sums_offset = metric_sums_;
        if (t.loss != LossKind::ce) metric_sums_ += std::uint64_t{HeadMetrics::rows} * t.width;
    }
    metrics_bytes_ = heads_.size() * sizeof(DeviceHeadMetrics) + metric_sums_ * sizeof(double);
    for (MetricsBlock& m : metrics_) { // one piece: a memset of metrics_bytes_ clears counters and sums
        char* block = static_cast<char*>(a.take_bytes(metrics_bytes_ + sizeof(unsigned long long)));
        m.heads = reinterpret_cast<DeviceHeadMetrics*>(block);
        m.sums = reinterpret_cast<double*>(block + heads_.size() * sizeof(DeviceHeadMetrics));
        m.first_nonfinite = reinterpret_cast<unsigned long long*>(block + metrics_bytes_);
    }
}

cudnnTensorDescriptor_t make_tensor(std::uint32_t n, TensorShape s, cudnnDataType_t t, bool nchw) {
    cudnnTensorDescriptor_t d;
    CUDNN_CHECK(cudnnCreateTensorDescriptor(&d));
    CUDNN_CHECK(cudnnSetTensor4dDescriptor(d, nchw ? CUDNN_TENSOR_NCHW : CUDNN_TENSOR_NHWC, t, static_cast<int>(n),
                                           static_cast<int>(s.c), static_cast<int>(s.h), static_cast<int>(s.w)));
    return d;
}

void CudaTrainer::create_layer_descriptors() {
    const cudnnMathType_t math = cfg_.precision == Precision::fp32 ? CUDNN_FMA_MATH : CUDNN_TENSOR_OP_MATH;
    for (std::size_t i = 0; i < layers().size(); ++i) {
        const LayerPlan& l = layers()[i];
        if (l.spec.kind != LayerKind::conv) continue;
        LayerDev& d = dev_[i];
        const int k = static_cast<int>(l.spec.kernel), s = static_cast<int>(l.spec.stride),
                  p = static_cast<int>(l.spec.padding);
        CUDNN_CHECK(cudnnCreateFilterDescriptor(&d.filter));
        CUDNN_CHECK(cudnnSetFilter4dDescriptor(d.filter, cudnn_type_, nchw_ ? CUDNN_TENSOR_NCHW : CUDNN_TENSOR_NHWC,
                                               static_cast<int>(l.out.c), static_cast<int>(i == 0 ? input_.c : l.in.c),
                                               k, k));
        for (auto* cd : {&d.conv_fwd, &d.conv_bwd_data, &d.conv_bwd_filter}) {
            CUDNN_CHECK(cudnnCreateConvolutionDescriptor(cd));
            CUDNN_CHECK(
                cudnnSetConvolution2dDescriptor(*cd, p, p, s, s, 1, 1, CUDNN_CROSS_CORRELATION, CUDNN_DATA_FLOAT));
            CUDNN_CHECK(cudnnSetConvolutionMathType(*cd, math));
        }
        d.algos.fwd_math = d.algos.data_math = d.algos.filter_math = math; // until find_algorithms chooses
    }
    // Workspace: the largest any heuristically ranked, allowed algorithm under the bound needs.
    BatchDescs probe;
    probe.input = make_tensor(cfg_.max_batch, input_, cudnn_type_, nchw_);
    for (const auto& l : layers()) probe.out.push_back(make_tensor(cfg_.max_batch, l.out, cudnn_type_, nchw_));
    std::uint64_t ws = 0;
    const Precision prec = cfg_.precision;
    for (std::size_t i = 0; i < layers().size(); ++i)
        if (layers()[i].spec.kind == LayerKind::conv)
            ws = std::max(ws, conv_workspace_need(search(), conv_call(probe, i), cfg_.workspace_limit));
    cudnnDestroyTensorDescriptor(probe.input);
    for (auto t : probe.out) cudnnDestroyTensorDescriptor(t);
    const std::string_view kernels = env_value("DSTK_CONV_KERNELS");
    const bool own = kernels != "cudnn";
    force_own_ = kernels == "own";
    const bool wgmma = !env_off("DSTK_WGMMA_CONV"), wgmma_back = wgmma && env_value("DSTK_WGMMA_CONV") != "fwd";
    const bool wgmma_wgrad = !env_off("DSTK_WGMMA_WGRAD");
    force_graph_ = kernels == "graph";
    direct_first_ = own && !layers().empty() && layers()[0].spec.kind == LayerKind::conv &&
                    direct_conv_supported(direct_shape(cfg_.max_batch));
    if (direct_first_)
        ws = std::max({ws, direct_conv_workspace(direct_shape(cfg_.max_batch)),
                       tc_conv_first_wgrad_workspace(direct_shape(cfg_.max_batch))});
    for (std::size_t i = direct_first_ ? 1 : 0; i < layers().size(); ++i) {
        const LayerSpec& sp = layers()[i].spec;
        const bool tc = own && sp.kind == LayerKind::conv && prec != Precision::fp32 && !nchw_ && sp.kernel == 3 &&
                        sp.stride == 1 && sp.padding == 1;
        dev_[i].tc_wgrad = tc && tc_wgrad_supported(wgrad_shape(i, cfg_.max_batch));
        if (dev_[i].tc_wgrad) ws = std::max(ws, tc_wgrad_workspace(wgrad_shape(i, cfg_.max_batch)));
        dev_[i].wgmma_wgrad =
            tc && prec == Precision::tf32 && wgmma_wgrad && wgmma_wgrad_supported(wgrad_shape(i, cfg_.max_batch));
        if (dev_[i].wgmma_wgrad) ws = std::max(ws, wgmma_wgrad_workspace(wgrad_shape(i, cfg_.max_batch)));
        dev_[i].tc_fwd = tc && tc_conv_supported(conv_shape(i, cfg_.max_batch, false));
        dev_[i].wgmma_fwd = tc && wgmma && wgmma_conv_supported(conv_shape(i, cfg_.max_batch, false));
        dev_[i].tc_dgrad = tc && tc_conv_supported(conv_shape(i, cfg_.max_batch, true));
        // Not where cuDNN's data gradient would sum itself into the skip path's (dgrad_sums_skip):
        // timed alone, the choice would not see the sum's pass that an own kernel then needs.
        dev_[i].wgmma_dgrad = tc && wgmma_back && !(i > 0 && skip_sum_site(i - 1)) &&
                              wgmma_conv_supported(conv_shape(i, cfg_.max_batch, true));
        if (dev_[i].own_dgrad()) ws = std::max(ws, tc_conv_scratch(conv_shape(i, cfg_.max_batch, true)));
    }
    for (std::size_t i = direct_first_ ? 1 : 0; i < layers().size(); ++i)
        if (layers()[i].spec.kind == LayerKind::conv) ws = std::max(ws, plan_graph_convs(i));
    workspace_bytes_ = ws;
}

TcWgradShape CudaTrainer::wgrad_shape(std::size_t i, std::uint32_t n) const {
    const LayerPlan& l = layers()[i];
    return {n, i == 0 ? input_.c : l.in.c, l.out.c, l.in.h, l.in.w};
}

TcConvShape CudaTrainer::conv_shape(std::size_t i, std::uint32_t n, bool data_gradient) const {
    const LayerPlan& l = layers()[i];
    const std::uint32_t in = i == 0 ? input_.c : l.in.c;
    TcConvShape s{n, l.in.h, l.in.w, data_gradient ? l.out.c : in, data_gradient ? in : l.out.c, data_gradient};
    s.tf32 = at_ == ActType::f32;
    s.one_group = data_gradient ? dev_[i].dgrad_one_group : dev_[i].fwd_one_group;
    return s;
}

DirectConvShape CudaTrainer::direct_shape(std::uint32_t n) const {
    const LayerPlan& l = layers()[0];
    DirectConvShape s;
    s.n = n;
    s.c = l.in.c;
    s.cstride = input_.c;
    s.h = l.in.h;
    s.w = l.in.w;
    s.k = l.out.c;
    s.oh = l.out.h;
    s.ow = l.out.w;
    s.stride = l.spec.stride;
    s.pad = l.spec.padding;
    s.kernel = l.spec.kernel;
    s.nchw = nchw_;
    s.tf32 = cfg_.precision == Precision::tf32;
    return s;
}

// The kernel choice cache of cfg_.kernels' rules (in memory only for heuristic).
ChoiceCache CudaTrainer::choice_cache(const DeviceIdentity& id) const {
    const bool use_cache = cfg_.kernels != KernelMode::heuristic;
    return ChoiceCache(use_cache ? (cfg_.choice_dir.empty() ? default_choice_dir() : fs::path(cfg_.choice_dir))
                                 : fs::path(),
                       id, [](const std::string& n) { std::fprintf(stderr, "notice: %s\n", n.c_str()); });
}

// Layer i's graph-API candidates (none in fp32, whose float math they do
// not keep to, nor where the kernels are not timed); the largest workspace
// they need. By default only in bf16 and on convolutions of at least
// graph_min_flop a pass at the planned batch: there they made resnet9's step
// faster; on ref-cnn's smaller ones, and in tf32, kernels that won their
// timing alone made the step slower (they run beside the side stream's
// weight gradients). DSTK_CUDNN_GRAPH lifts the rule.
std::uint64_t CudaTrainer::plan_graph_convs(std::size_t i) {
    if (cfg_.precision == Precision::fp32 || cfg_.kernels == KernelMode::heuristic) return 0;
    const LayerPlan& l = layers()[i];
    const ConvKey key = conv_key(i);
    const GraphConvShape s{key.n,   key.c,      key.h,   key.w,      key.k, l.out.h,
                           l.out.w, key.kernel, key.pad, key.stride, nchw_, cudnn_type_};
    constexpr double graph_min_flop = 8e9;
    const double flop = 2.0 * s.n * s.oh * s.ow * s.k * s.c * s.kernel * s.kernel;
    if (!graph_everywhere_ && (cfg_.precision != Precision::bf16 || flop < graph_min_flop)) return 0;
    GraphConvRules r;
    r.deterministic = cfg_.deterministic;
    r.workspace_limit = cfg_.workspace_limit;
    std::uint64_t ws = 0;
    for (const ConvOp op : {ConvOp::fwd, ConvOp::bwd_data, ConvOp::bwd_filter}) {
        if (!graph_ops_[static_cast<int>(op)]) continue;
        auto& to = dev_[i].graph_cands[static_cast<int>(op)];
        to = graph_conv_candidates(cudnn_, s, op, r);
        for (const auto& g : to) ws = std::max(ws, g->workspace());
    }
    return ws;
}

// Layer i's graph-API candidates as the chooser times them: on the buffers
// conv_call names, on the search's stream.
GraphKernels CudaTrainer::graph_kernels(std::size_t i) {
    LayerDev& d = dev_[i];
    void* x = const_cast<void*>(input_of(i));
    GraphKernels k;
    k.force = force_graph_;
    const auto add = [&](std::vector<KernelCandidate>& to, ConvOp op, void* a, void* w, void* y) {
        for (const auto& g : d.graph_cands[static_cast<int>(op)])
            to.push_back({g->name(), [this, g, a, w, y] { return g->run(cudnn_, a, w, y, workspace_); }});
    };
    add(k.fwd, ConvOp::fwd, x, d.wk, d.out);
    add(k.dgrad, ConvOp::bwd_data, gbuf_[1], d.wk, gbuf_[0]);
    add(k.wgrad, ConvOp::bwd_filter, x, d.gk, gbuf_[0]);
    return k;
}

// Chooses each convolution's kernels once, for max_batch, with the planned
// buffers and workspace, by cfg_.kernels' rules; stores what was timed.
// Layer i's own kernels as candidates of the kernel choice, each as a
// step runs it, and where tc_conv's and tc_wgrad's start in their lists.
OwnKernels CudaTrainer::own_candidates(std::size_t i, OwnStarts& at) {
    const LayerDev& d = dev_[i];
    OwnKernels own;
    own.force = force_own_;
    // tc_conv in blocks of groups and, where that differs, in one group
    // per block (the variant at index one_group: faster on some shapes).
    const auto tc_variants = [this, i](std::vector<KernelCandidate>& to, bool dgrad, auto run) {
        TcConvShape s = conv_shape(i, cfg_.max_batch, dgrad);
        s.one_group = false;
        to.push_back({"own:tc_conv", [run, s] { return run(s), true; }});
        if (tc_conv_groups(s) == 1) return;
        s.one_group = true;
        to.push_back({"own:tc_conv:1group", [run, s] { return run(s), true; }});
    };
    // Where its epilogue may sum the next batch norm's statistics, timed
    // doing so against cuDNN's forward and that norm's reduction pass
    // (plan_conv_bn_stats then takes the pass out where an own kernel won).
    // own:wgmma_conv first: where both apply, DSTK_CONV_KERNELS=own takes it.
    const bool stats = (d.tc_fwd || d.wgmma_fwd) && stats_in_conv_fit(i);
    if (d.wgmma_fwd)
        own.fwd.push_back({"own:wgmma_conv", [this, i, stats] {
                               launch_wgmma_conv(input_of(i), dev_[i].wk, dev_[i].out,
                                                 conv_shape(i, cfg_.max_batch, false), nullptr, stream_,
                                                 stats ? conv_stats(i) : TcConvStats{});
                               return true;
                           }});
    at.tc_fwd = static_cast<int>(own.fwd.size());
    if (d.tc_fwd)
        tc_variants(own.fwd, false, [this, i, stats](const TcConvShape& s) {
            launch_tc_conv(input_of(i), dev_[i].wk, dev_[i].out, s, nullptr, stream_,
                           stats ? conv_stats(i) : TcConvStats{});
        });
    if (stats)
        own.fwd_pass_saved = [this, i] {
            const TensorShape& o = layers()[i].out;
            launch_bn_statistics(dev_[i].out, at_, cfg_.max_batch, std::uint64_t{o.h} * o.w, o.c, nchw_, bn_partials_,
                                 stream_);
        };
    // Timed with its filters turned in line, though a training step turns them
    // ahead (turn_filters_ahead): timed on filters turned ahead, more layers went to
    // this kernel and the step measured slower (the timing is of one kernel alone,
    // the step runs it beside the side stream's weight gradients).
    if (d.wgmma_dgrad)
        own.dgrad.push_back({"own:wgmma_conv", [this, i] {
                                 launch_wgmma_conv(gbuf_[0], dev_[i].wk, gbuf_[1], conv_shape(i, cfg_.max_batch, true),
                                                   workspace_, stream_);
                                 return true;
                             }});
    at.tc_dgrad = static_cast<int>(own.dgrad.size());
    if (d.tc_dgrad)
        tc_variants(own.dgrad, true, [this, i](const TcConvShape& s) {
            launch_tc_conv(gbuf_[0], dev_[i].wk, gbuf_[1], s, workspace_, stream_);
        });
    // As a step runs them: into the gradient vector (overwritten by every backward pass).
    if (d.wgmma_wgrad)
        own.wgrad.push_back({"own:wgmma_wgrad", [this, i] {
                                 launch_wgmma_wgrad(static_cast<const float*>(input_of(i)),
                                                    static_cast<const float*>(gbuf_[0]), wgrad_shape(i, cfg_.max_batch),
                                                    workspace_, grads_, stream_, map_ + copy_offset_[i]);
                                 return true;
                             }});
    at.tc_wgrad = static_cast<int>(own.wgrad.size());
    if (d.tc_wgrad)
        own.wgrad.push_back({"own:tc_wgrad", [this, i] {
                                 launch_tc_wgrad(input_of(i), gbuf_[0], at_, wgrad_shape(i, cfg_.max_batch), workspace_,
                                                 grads_, stream_, map_ + copy_offset_[i]);
                                 return true;
                             }});
    return own;
}

void CudaTrainer::find_algorithms() {
    const DeviceIdentity id = device_identity(cfg_.device.index);
    ChoiceCache cache = choice_cache(id);
    ConvChooser chooser(search(), cfg_.kernels, &cache, id.text());
    BatchDescs& bd = descs(cfg_.max_batch);
    for (std::size_t i = 0; i < layers().size(); ++i) {
        if (layers()[i].spec.kind != LayerKind::conv) continue;
        LayerDev& d = dev_[i];
        if (i == 0 && direct_first_) {
            // Our direct kernels run this layer; cuDNN's heuristic pick serves
            // only an input gradient that inspection asks for.
            ConvChooser quiet(search(), KernelMode::heuristic, nullptr, id.text());
            d.algos = quiet.choose(conv_call(bd, i), conv_key(i), i, {}, nullptr);
            chooser.report(i, "fwd", "own:direct_conv");
            chooser.report(i, "bwd_filter", "own:direct_conv");
        } else {
            OwnStarts at;
            const OwnKernels own = own_candidates(i, at);
            KernelUse used;
            d.algos = chooser.choose(conv_call(bd, i), conv_key(i), i, own, &used, graph_kernels(i));
            const auto chosen = [&](ConvOp op, int at) {
                auto& c = d.graph_cands[static_cast<int>(op)];
                return at >= 0 ? c[static_cast<std::size_t>(at)] : nullptr;
            };
            d.graph_fwd = chosen(ConvOp::fwd, used.graph_fwd);
            d.graph_dgrad = chosen(ConvOp::bwd_data, used.graph_dgrad);
            d.graph_wgrad = chosen(ConvOp::bwd_filter, used.graph_wgrad);
            d.wgmma_fwd = used.fwd >= 0 && used.fwd < at.tc_fwd;
            d.tc_fwd = used.fwd >= at.tc_fwd;
            d.fwd_one_group = used.fwd == at.tc_fwd + one_group;
            d.wgmma_dgrad = used.dgrad >= 0 && used.dgrad < at.tc_dgrad;
            d.tc_dgrad = used.dgrad >= at.tc_dgrad;
            d.dgrad_one_group = used.dgrad == at.tc_dgrad + one_group;
            d.wgmma_wgrad = used.wgrad >= 0 && used.wgrad < at.tc_wgrad;
            d.tc_wgrad = used.wgrad >= at.tc_wgrad;
        }
        for (auto& c : dev_[i].graph_cands) c.clear();
        bd.algos[i] = d.algos;
    }
    if (cfg_.kernels == KernelMode::automatic || cfg_.kernels == KernelMode::retune) cache.store();
    reports_ = chooser.reports();
}

ConvKey CudaTrainer::conv_key(std::size_t i) const {
    const LayerPlan& l = layers()[i];
    ConvKey k;
    k.precision = cfg_.precision;
    k.deterministic = cfg_.deterministic;
    k.nchw = nchw_;
    k.n = cfg_.max_batch;
    k.c = i == 0 ? input_.c : l.in.c;
    k.h = l.in.h;
    k.w = l.in.w;
    k.k = l.out.c;
    k.kernel = l.spec.kernel;
    k.stride = l.spec.stride;
    k.pad = l.spec.padding;
    k.workspace = workspace_bytes_;
    return k;
}

ConvSearch CudaTrainer::search() const {
    return {cudnn_, stream_, workspace_, workspace_bytes_, cfg_.precision, cfg_.deterministic};
}

// Layer i's convolution at the batch size of bd, with the buffers timing may use.
ConvCall CudaTrainer::conv_call(const BatchDescs& bd, std::size_t i) const {
    const LayerDev& d = dev_[i];
    ConvCall c;
    c.x = input_desc(bd, i);
    c.y = bd.out[i];
    c.w = d.filter;
    c.fwd = d.conv_fwd;
    c.bwd_data = d.conv_bwd_data;
    c.bwd_filter = d.conv_bwd_filter;
    c.x_data = input_of(i);
    c.y_data = d.out;
    c.w_data = d.wk;
    c.dw_data = d.gk;
    c.dy_data = gbuf_[0];
    c.dx_data = gbuf_[1];
    return c;
}

// Descriptors and algorithms for batch size n.
BatchDescs& CudaTrainer::descs(std::uint32_t n) {
    auto it = descs_.find(n);
    if (it != descs_.end()) return it->second;
    BatchDescs d;
    d.input = make_tensor(n, input_, cudnn_type_, nchw_);
    for (const auto& l : layers()) d.out.push_back(make_tensor(n, l.out, cudnn_type_, nchw_));
    d.algos.resize(layers().size());
    d.unfit.resize(layers().size());
    for (std::size_t i = 0; i < layers().size(); ++i)
        if (layers()[i].spec.kind == LayerKind::conv)
            d.algos[i] = fit_conv_algorithms(search(), conv_call(d, i), dev_[i].algos, i, n, d.unfit[i]);
    return descs_.emplace(n, std::move(d)).first->second;
}

// Layer i's cuBLASLt plans at batch n, for the buffers layout() placed: the
// forward pass with its bias (and relu), the weight gradient with the bias
// gradient. Each is null where cuBLASLt refuses it or where no epilogue would
// spare a kernel (no bias, no relu).
CudaTrainer::FcGemms CudaTrainer::plan_fc_gemms(std::size_t i, std::uint32_t n) {
    FcGemms out;
    const LayerPlan& l = layers()[i];
    const LayerDev& d = dev_[i];
    if (!fc_fused_ || l.spec.kind != LayerKind::linear) return out;
    const int in = static_cast<int>(l.in.c), o = static_cast<int>(l.out.c), nn = static_cast<int>(n);
    const std::uint64_t bias_at = l.param_offset + std::uint64_t{l.out.c} * l.in.c;
    const auto plan = [&](const EpilogueGemmShape& s) {
        auto g = std::make_unique<EpilogueGemm>(lt_, s, cublas_workspace);
        return g->ok() ? std::move(g) : nullptr;
    };
    EpilogueGemmShape f; // y[out][n] = W x (+ b, relu)
    f.ta = CUBLAS_OP_T;
    f.m = o, f.n = nn, f.k = in;
    f.a_type = d.wk ? blas_type_ : CUDA_R_32F;
    f.b_type = f.d_type = blas_type_;
    f.lda = in, f.ldb = in, f.ldd = o;
    f.a_align = pointer_alignment(d.wk ? d.wk : params_ + l.param_offset);
    f.b_align = pointer_alignment(input_of(i));
    f.compute = blas_compute_;
    f.bias = l.spec.bias ? params_ + bias_at : nullptr;
    if (l.spec.bias) {
        f.epilogue = CUBLASLT_EPILOGUE_BIAS;
        out.forward = plan(f);
    }
    if (d.relu_in_gemm) {
        f.epilogue = l.spec.bias ? CUBLASLT_EPILOGUE_RELU_BIAS : CUBLASLT_EPILOGUE_RELU;
        out.forward_relu = plan(f);
    }
    if (l.spec.bias) { // dW[in][out] = x dy^T, db = dy summed over the batch (op(B)'s k)
        EpilogueGemmShape w;
        w.tb = CUBLAS_OP_T;
        w.m = in, w.n = o, w.k = nn;
        w.a_type = w.b_type = blas_type_;
        w.d_type = CUDA_R_32F;
        w.lda = in, w.ldb = o, w.ldd = in;
        w.a_align = f.b_align;
        w.d_align = pointer_alignment(d.gk ? d.gk : grads_ + l.param_offset);
        w.compute = blas_compute_;
        w.epilogue = CUBLASLT_EPILOGUE_BGRADB;
        w.bias = grads_ + bias_at;
        out.weight_grad = plan(w);
    }
    return out;
}

std::vector<CudaTrainer::FcGemms>& CudaTrainer::fc_gemms(std::uint32_t n) {
    auto it = fc_gemms_.find(n);
    if (it != fc_gemms_.end()) return it->second;
    std::vector<FcGemms> v(layers().size());
    for (std::size_t i = 0; i < layers().size(); ++i) v[i] = plan_fc_gemms(i, n);
    return fc_gemms_.emplace(n, std::move(v)).first->second;
}

// What the linear layers and the flattens before them run at max_batch, in
// the kernel report (rules, not timings).
void CudaTrainer::report_rule_choices() {
    const std::vector<FcGemms>& plans = fc_gemms(cfg_.max_batch);
    for (std::size_t i = 0; i < layers().size(); ++i) {
        const LayerDev& d = dev_[i];
        if (layers()[i].spec.kind == LayerKind::flatten && d.nhwc_flat.c)
            reports_.push_back({i, "fwd", "none:nhwc_order", ChoiceSource::rule, 0.0});
        if (plans[i].forward_relu)
            reports_.push_back({i, "fwd", "cublaslt:relu_epilogue", ChoiceSource::rule, 0.0});
        else if (plans[i].forward)
            reports_.push_back({i, "fwd", "cublaslt:bias_epilogue", ChoiceSource::rule, 0.0});
        if (plans[i].weight_grad)
            reports_.push_back({i, "bwd_filter", "cublaslt:bgradb_epilogue", ChoiceSource::rule, 0.0});
    }
    if (xent_layer_ != npos) {
        for (KernelReport& r : reports_)
            if (r.layer == xent_layer_ && r.op == "fwd") r.kernel = "own:linear_xent";
        if (std::none_of(reports_.begin(), reports_.end(),
                         [&](const KernelReport& r) { return r.layer == xent_layer_ && r.op == "fwd"; }))
            reports_.push_back({xent_layer_, "fwd", "own:linear_xent", ChoiceSource::rule, 0.0});
        reports_.push_back({xent_layer_, "bwd_data", "own:linear_xent", ChoiceSource::rule, 0.0});
        if (xent_relu_ != npos) reports_.push_back({xent_relu_, "bwd", "own:in_linear_xent", ChoiceSource::rule, 0.0});
    }
    if (first_conv_bn_) {
        reports_.push_back({1, "fwd", "own:input_moments", ChoiceSource::rule, 0.0});
        reports_.push_back({1, "bwd", "own:input_moments", ChoiceSource::rule, 0.0});
    }
    if (input_in_moments_) reports_.push_back({0, "convert", "own:in_input_moments", ChoiceSource::rule, 0.0});
    if (first_wgrad_at_ > 0)
        for (KernelReport& r : reports_)
            if (r.layer == 0 && r.op == "bwd_filter")
                r.kernel = "own:in_data_gradient_of_L" + std::to_string(first_wgrad_at_);
    for (std::size_t i = 0; i < layers().size(); ++i) {
        if (dev_[i].bn_stats) reports_.push_back({i + 1, "fwd", "own:stats_in_conv", ChoiceSource::rule, 0.0});
        if (dev_[i].add_next) reports_.push_back({i + 2, "fwd", "own:in_batchnorm", ChoiceSource::rule, 0.0});
        if (dgrad_sums_skip(i)) reports_.push_back({i, "bwd", "cudnn:in_data_gradient", ChoiceSource::rule, 0.0});
    }
    std::stable_sort(reports_.begin(), reports_.end(),
                     [](const KernelReport& a, const KernelReport& b) { return a.layer < b.layer; });
}

// Which parameters a training step updates in the kernels that finish
// their gradients (early_update_in_wgrad, low_update_in_first_bn), and
// whether steps overlap (steps_overlap), once the weight gradients' stream
// is chosen (rules, not timings).
void CudaTrainer::report_updates() {
    const std::size_t early = early_update_layer();
    if (early_update_in_wgrad(early, upper_update_layer(early)))
        reports_.push_back({early, "update", "own:in_weight_gradient_sums", ChoiceSource::rule, 0.0});
    if (low_update_in_first_bn(early))
        for (const std::size_t i : {std::size_t{0}, std::size_t{1}})
            reports_.push_back({i, "update", "own:in_first_bn_backward", ChoiceSource::rule, 0.0});
    if (graph_overlaps_) reports_.push_back({layers().size(), "steps", "overlapped", ChoiceSource::rule, 0.0});
    std::stable_sort(reports_.begin(), reports_.end(),
                     [](const KernelReport& a, const KernelReport& b) { return a.layer < b.layer; });
}

void CudaTrainer::refresh_copies() {
    launch_gather_weights(params_, map_, wcopy_, at_, map_host_.size(), stream_);
    sync_main();
}

std::vector<float> CudaTrainer::download_act(const void* p, std::uint64_t count) {
    std::vector<float> out(count);
    sync_main();
    if (at_ == ActType::f32) {
        CUDA_CHECK(cudaMemcpy(out.data(), p, count * 4, cudaMemcpyDeviceToHost));
        return out;
    }
    std::vector<std::uint16_t> raw(count);
    CUDA_CHECK(cudaMemcpy(raw.data(), p, count * 2, cudaMemcpyDeviceToHost));
    for (std::uint64_t i = 0; i < count; ++i) {
        const std::uint32_t bits = std::uint32_t{raw[i]} << 16;
        std::memcpy(&out[i], &bits, 4);
    }
    return out;
}

// The batch's fields into the other input set, on the input stream: the
// input (and, for a training step, its moments for the first batch norm),
// then in one more launch every head's target and the side input
// (normalised straight into its columns of the side layer's output, which is
// not in a set: that conversion waits for every step before).
// on_lane: for a step on the lane of the set it converts into (launch_on_lane).
void CudaTrainer::convert(const StepFields& b, bool training, bool on_lane) {
    in_->take(cfg_.plan.side != 0);
    alias_input_set();
    const unsigned k = in_->current();
    const TensorShape in = cfg_.plan.input;
    if (training && input_in_moments_) {
        launch_first_bn_moments_converting({b.x.data, b.x.rows, cfg_.input_dtype, mean_, inv_std_}, act0_[k], at_,
                                           direct_shape(b.size), moments_[k], moments_ws_, in_->stream());
    } else {
        launch_convert_input({b.x.data, b.x.rows, cfg_.input_dtype}, nullptr, b.size, in.c, std::uint64_t{in.h} * in.w,
                             mean_, inv_std_, act0_[k], at_, nchw_, input_.c, nullptr, in_->stream());
        if (training && first_conv_bn_)
            launch_first_bn_moments(act0_[k], at_, direct_shape(b.size), moments_[k], moments_ws_, in_->stream());
    }
    // The data path's one conversion step (dstk/data/convert.hpp): every
    // target and the side input in one launch.
    data::FieldConversion f[data::max_conversions];
    std::size_t count = 0;
    for (std::size_t h = 0; h < heads_.size(); ++h) {
        const Target& t = cfg_.plan.heads[h].target;
        data::FieldConversion& c = f[count++];
        c.src = b.targets[h].data;
        c.rows = b.targets[h].rows;
        c.dtype = t.dtype;
        c.per_sample = t.loss == LossKind::ce ? 1 : t.width;
        c.kind = t.loss == LossKind::ce ? data::FieldKind::classes32 : data::FieldKind::values;
        c.dst = t.loss == LossKind::ce ? static_cast<void*>(heads_[h].labels[k]) : heads_[h].y[k];
    }
    if (cfg_.plan.side) {
        for (std::size_t i = 0; i < layers().size(); ++i)
            if (layers()[i].spec.kind == LayerKind::side) {
                data::FieldConversion& c = f[count++];
                c.src = b.side.data;
                c.rows = b.side.rows;
                c.dtype = cfg_.side.dtype;
                c.per_sample = cfg_.plan.side;
                c.kind = data::FieldKind::normalised;
                c.bf16 = at_ == ActType::bf16;
                c.dst = dev_[i].out;
                c.stride = layers()[i].out.c;
                c.offset = layers()[i].in.c;
                c.mean = side_mean_;
                c.inv_std = side_inv_std_;
                c.hw = cfg_.plan.side / static_cast<std::uint32_t>(cfg_.side.mean.size());
            }
    }
    data::convert_fields_async({f, count}, b.size, in_->stream());
    in_->hand_over(on_lane ? lanes_[k] : stream_);
    if (!on_lane) after_lane_ = false; // the main stream's work follows
}

// Column-major C[m][n] = op(A) op(B) with float accumulation, the
// activations' type for B (and for A where it is not fp32).
void CudaTrainer::gemm(cublasHandle_t h, cublasOperation_t ta, cublasOperation_t tb, int m, int n, int k, const void* a,
                       cudaDataType_t at, int lda, const void* b, int ldb, void* c, cudaDataType_t ct, int ldc) {
    const float one = 1.0f, zero = 0.0f;
    CUBLAS_CHECK(cublasGemmEx(h, ta, tb, m, n, k, &one, a, at, lda, b, blas_type_, ldb, &zero, c, ct, ldc,
                              blas_compute_, CUBLAS_GEMM_DEFAULT));
}

// y = W x + b, then the relu above where fused: one cuBLASLt kernel where it
// takes the shape, else cuBLAS and our kernels.
void CudaTrainer::forward_linear(std::size_t i, std::uint32_t n, bool fuse) {
    const LayerPlan& l = layers()[i];
    const LayerDev& d = dev_[i];
    const bool relu = fuse && d.relu_in_gemm;
    void* y = relu ? dev_[i + 1].out : d.out;
    const float* p = params_ + l.param_offset;
    const void* w = d.wk ? d.wk : p;
    const FcGemms& plans = fc_gemms(n)[i];
    if (const EpilogueGemm* e = (relu ? plans.forward_relu : plans.forward).get()) {
        e->run(w, input_of(i), y, cublas_ws_, stream_);
        return;
    }
    const int in = static_cast<int>(l.in.c), out = static_cast<int>(l.out.c);
    gemm(cublas_, CUBLAS_OP_T, CUBLAS_OP_N, out, static_cast<int>(n), in, w, d.wk ? blas_type_ : CUDA_R_32F, in,
         input_of(i), in, y, blas_type_, out);
    if (l.spec.bias)
        launch_add_bias(y, at_, p + std::uint64_t{l.out.c} * l.in.c, n, l.out.c, 1, nchw_, stream_, relu);
    else if (relu)
        launch_relu_forward(y, y, at_, std::uint64_t{n} * l.out.c, stream_);
}

void CudaTrainer::forward(std::uint32_t n, bool training, bool fuse) {
    const float one = 1.0f, zero = 0.0f;
    BatchDescs& bd = descs(n);
    unsigned stats_splits = 0; // the splits of the statistics the last convolution summed (bn_stats)
    for (std::size_t i = 0; i < layers().size(); ++i) {
        const LayerPlan& l = layers()[i];
        LayerDev& d = dev_[i];
        const void* x = input_of(i);
        const auto xd = input_desc(bd, i), yd = bd.out[i];
        const std::uint64_t count = std::uint64_t{n} * l.out.numel();
        const std::uint64_t hw_in = std::uint64_t{l.in.h} * l.in.w, hw_out = std::uint64_t{l.out.h} * l.out.w;
        const float* p = params_ + l.param_offset;
        // Overlapping the step before (steps_overlap): its end, which this
        // layer's weights and the turned filters wait for, on the side branch.
        if (overlapping_ && i == overlap_x_ + 1) side_->join();
        switch (l.spec.kind) {
        case LayerKind::conv:
            if (i == 0 && training && fuse && first_conv_bn_)
                forward_first_conv_bn(n);
            else if (i == 0 && direct_first_)
                launch_direct_conv_forward(x, p, d.out, at_, direct_shape(n), stream_);
            else if (d.wgmma_fwd)
                forward_wgmma_conv(i, x, n, training, stats_splits);
            else if (d.tc_fwd && training && d.bn_stats)
                stats_splits = launch_tc_conv(x, d.wk, d.out, conv_shape(i, n, false), nullptr, stream_, conv_stats(i));
            else if (d.tc_fwd)
                launch_tc_conv(x, d.wk, d.out, conv_shape(i, n, false), nullptr, stream_);
            else if (!(d.graph_fwd && n == cfg_.max_batch &&
                       d.graph_fwd->run(cudnn_, const_cast<void*>(x), d.wk, d.out, workspace_))) {
                require_fit(bd.unfit[i].fwd);
                CUDNN_CHECK(cudnnSetConvolutionMathType(d.conv_fwd, bd.algos[i].fwd_math));
                CUDNN_CHECK(cudnnConvolutionForward(cudnn_, &one, xd, x, d.filter, d.wk, d.conv_fwd, bd.algos[i].fwd,
                                                    workspace_, workspace_bytes_, &zero, yd, d.out));
            }
            if (l.spec.bias) launch_add_bias(d.out, at_, p + conv_weights(l), n, l.out.c, hw_out, nchw_, stream_);
            break;
        case LayerKind::batchnorm: {
            if (i == 1 && training && fuse && first_conv_bn_) break; // forward_first_conv_bn applied it
            const bool fused = fuse && d.relu_next, pooled = fused && d.pool_next, summed = fused && d.add_next;
            void* y = pooled || summed ? dev_[i + 2].out : fused ? dev_[i + 1].out : d.out;
            const std::uint32_t pool_w = pooled ? l.in.w : 0;
            const void* skip = summed ? input_of(static_cast<std::size_t>(layers()[i + 2].partner)) : nullptr;
            float* rm = states_ + l.state_offset;
            const unsigned given_splits = i > 0 && dev_[i - 1].bn_stats ? stats_splits : 0;
            if (training)
                launch_bn_forward_train(x, y, at_, n, hw_in, l.in.c, nchw_, fused, p, p + l.in.c, rm, rm + l.in.c,
                                        d.aux, d.aux + l.in.c, bn_partials_, static_cast<float>(bn_momentum),
                                        static_cast<float>(bn_eps), stream_, pool_w, given_splits, skip);
            else
                launch_bn_forward_eval(x, y, at_, n, hw_in, l.in.c, nchw_, fused, p, p + l.in.c, rm, rm + l.in.c,
                                       static_cast<float>(bn_eps), bn_partials_, stream_, pool_w, skip);
            break;
        }
        case LayerKind::relu: // else the batchnorm or linear layer below wrote the output
            if (!(fuse && i > 0 && (dev_[i - 1].relu_next || dev_[i - 1].relu_in_gemm)))
                launch_relu_forward(x, d.out, at_, count, stream_);
            break;
        case LayerKind::tanh:
            launch_tanh_forward(x, d.out, at_, count, stream_);
            break;
        case LayerKind::side: // the side input's columns were written by the conversion
            launch_copy_rows(x, l.in.c, d.out, l.out.c, l.in.c, n, at_, stream_);
            break;
        case LayerKind::head: // aliases the trunk's output
            break;
        case LayerKind::maxpool:
        case LayerKind::avgpool:
            if (!(fuse && i >= 2 && dev_[i - 2].pool_next)) // else the batchnorm wrote the pooled output
                launch_pool_forward(x, d.out, at_, pool_shape(l, n, nchw_), l.spec.kind == LayerKind::maxpool, stream_);
            break;
        case LayerKind::global_avgpool:
            launch_gap_forward(x, d.out, at_, n, l.in.c, hw_in, nchw_, stream_);
            break;
        case LayerKind::linear:
            if (!(fuse && i == xent_layer_)) forward_linear(i, n, fuse); // else linear_xent, with the loss
            break;
        case LayerKind::dropout:
            if (training && l.spec.drop > 0.0f)
                launch_dropout_forward(x, d.out, d.aux, at_, count, l.out.c, hw_out, nchw_, l.spec.drop, cfg_.seed, i,
                                       step_dev_, stream_);
            else
                launch_copy(x, d.out, at_, count, stream_);
            break;
        case LayerKind::flatten: // features in the cpu backend's (NCHW) order unless only linear layers read them
            if (d.out != x) launch_nhwc_to_nchw(x, d.out, at_, n, l.in.c, std::uint64_t{l.in.h} * l.in.w, stream_);
            break;
        case LayerKind::residual_begin: // aliases its input
            break;
        case LayerKind::residual_end: // else the batchnorm below wrote the sum
            if (!(fuse && i >= 2 && dev_[i - 2].add_next))
                launch_add(x, input_of(static_cast<std::size_t>(l.partner)), d.out, at_, count, stream_);
            break;
        }
        mark(i, "fwd");
    }
}

// The first convolution and the batch norm after it (first_bn_into_wgrad) in
// a training step: the norm's statistics from the input's moments, then the
// convolution storing the norm's output (its ReLU's, where fused) at once.
void CudaTrainer::forward_first_conv_bn(std::uint32_t n) {
    const LayerPlan& b = layers()[1];
    const LayerDev& d = dev_[1];
    const float* gamma = params_ + b.param_offset;
    float* run = states_ + b.state_offset;
    const FirstBnForward f{run,
                           run + b.in.c,
                           d.aux,
                           d.aux + b.in.c,
                           static_cast<float>(bn_momentum),
                           static_cast<float>(bn_eps),
                           moments_[in_->current()]};
    launch_first_bn_forward(at_, direct_shape(n), params_ + layers()[0].param_offset, f, stream_);
    const BnApply apply{gamma, gamma + b.in.c, d.aux, d.aux + b.in.c, d.relu_next};
    launch_direct_conv_forward(input_of(0), params_ + layers()[0].param_offset, d.relu_next ? dev_[2].out : d.out, at_,
                               direct_shape(n), stream_, &apply);
}

// Where a layer's weight gradient runs: on the side branch, except while
// profiling (each operation is then timed on the main stream alone), where
// DSTK_WEIGHT_BRANCH=0 says so, and where no data gradient follows (the
// first layer: the main stream has nothing else left to run, while the side
// branch may still run the early update, early_update_layer).
CudaTrainer::Lane CudaTrainer::weight_lane(bool data_gradient_follows) {
    if (marks_ || one_stream_ || !data_gradient_follows) return {stream_, cudnn_, cublas_, workspace_, cublas_ws_};
    side_->fork();
    return {side_->stream(), side_->cudnn(), side_->cublas(), side_ws_, side_cublas_ws_};
}

// Whether layer `reader` alone reads layer `layer`'s output (no other layer,
// and no loss).
bool CudaTrainer::only_reader(std::size_t layer, std::size_t reader) const {
    for (std::size_t k = 0; k < layers().size(); ++k)
        if (k != reader && layers()[k].source == static_cast<std::int32_t>(layer)) return false;
    for (const auto& h : cfg_.plan.heads)
        if (h.output == layer) return false;
    return layers()[reader].source == static_cast<std::int32_t>(layer);
}

// Where a residual block (not on the input) starts with a convolution whose
// data gradient is cuDNN's, a fused backward has cuDNN sum that gradient
// into the skip path's (the block end's stash; beta 1) and the block's start
// adds nothing: one rounding of the sum in place of two, no pass of its own.
bool CudaTrainer::dgrad_sums_skip(std::size_t begin) const {
    return skip_sum_site(begin) && !dev_[begin + 1].own_dgrad();
}

// Whether a residual block starts at begin whose first convolution's data
// gradient, cuDNN's, may sum itself into the skip path's (dgrad_sums_skip).
bool CudaTrainer::skip_sum_site(std::size_t begin) const {
    if (!residual_fused_ || begin + 1 >= layers().size()) return false;
    const LayerPlan& b = layers()[begin];
    return b.spec.kind == LayerKind::residual_begin && b.source >= 0 &&
           layers()[begin + 1].spec.kind == LayerKind::conv && only_reader(begin, begin + 1);
}

// Where layer i alone reads a residual block's end whose branch ends with a
// fused bn, relu (add_next), a fused backward has i write its data gradient
// into the end's stash, where the skip path keeps it (no copy): the branch
// reads it there on the main stream alone (the batch norm's backward) before
// its first convolution's data gradient adds to it (dgrad_sums_skip).
void* CudaTrainer::stash_above(std::size_t i) const {
    const std::int32_t r = layers()[i].source;
    if (r < 2 || layers()[static_cast<std::size_t>(r)].spec.kind != LayerKind::residual_end) return nullptr;
    const auto end = static_cast<std::size_t>(r);
    return dev_[end - 2].add_next && only_reader(end, i) ? dev_[end].stash : nullptr;
}

// Layer i's weight gradient (and bias gradient) from dy, then dx where needed.
// turned: the step turned this layer's filters for the data gradient ahead (turn_filters_ahead).
// accumulate: dx += the data gradient (cuDNN's, dgrad_sums_skip).
void CudaTrainer::backward_conv(std::size_t i, std::uint32_t n, const void* dy, void* dx, bool need_dx, bool turned,
                                bool accumulate) {
    const float one = 1.0f, zero = 0.0f;
    const BatchDescs& bd = descs(n);
    const LayerPlan& l = layers()[i];
    const LayerDev& d = dev_[i];
    const void* x = input_of(i);
    const auto xd = input_desc(bd, i), yd = bd.out[i];
    float* g = grads_ + l.param_offset;
    const Lane w = weight_lane(need_dx);
    if (i == 0 && direct_first_ && first_wgrad_rows_ > 0) { // summed by the data gradient above (stream_, workspace_)
        launch_first_wgrad_sums(static_cast<float*>(workspace_), first_wgrad_rows_, at_, direct_shape(n), g,
                                *pending_bn_, stream_);
        first_wgrad_rows_ = 0;
        pending_bn_.reset();
    } else if (i == 0 && direct_first_) { // fp32, straight into the gradient vector
        launch_direct_conv_wgrad(x, dy, at_, direct_shape(n), w.workspace, g, w.stream,
                                 pending_bn_ ? &*pending_bn_ : nullptr);
        pending_bn_.reset();
    } else if (d.own_wgrad()) { // fp32 sums straight into the gradient vector, through the copy's map
        const ParamUpdate u = param_update(false);
        const ParamUpdate* update = i == update_in_wgrad_at_ ? &u : nullptr;
        if (d.wgmma_wgrad)
            launch_wgmma_wgrad(static_cast<const float*>(x), static_cast<const float*>(dy), wgrad_shape(i, n),
                               w.workspace, grads_, w.stream, map_ + copy_offset_[i], update);
        else
            launch_tc_wgrad(x, dy, at_, wgrad_shape(i, n), w.workspace, grads_, w.stream, map_ + copy_offset_[i],
                            update);
    } else if (!(d.graph_wgrad && n == cfg_.max_batch &&
                 d.graph_wgrad->run(w.cudnn, const_cast<void*>(x), d.gk, const_cast<void*>(dy), w.workspace))) {
        require_fit(bd.unfit[i].bwd_filter);
        CUDNN_CHECK(cudnnSetConvolutionMathType(d.conv_bwd_filter, bd.algos[i].filter_math));
        CUDNN_CHECK(cudnnConvolutionBackwardFilter(w.cudnn, &one, xd, x, yd, dy, d.conv_bwd_filter,
                                                   bd.algos[i].bwd_filter, w.workspace, workspace_bytes_, &zero,
                                                   d.filter, d.gk));
    }
    if (l.spec.bias)
        launch_bias_grad(dy, at_, g + conv_weights(l), n, l.out.c, std::uint64_t{l.out.h} * l.out.w, nchw_, w.stream);
    if (w.stream != stream_) gbuf_.read_by_side(dy, *side_); // the last read of dy: the scatter below reads gk
    // Into the gradient vector at once, beside the data gradients (a direct
    // first convolution and an own weight gradient wrote it there themselves).
    if (!(i == 0 && direct_first_) && !d.own_wgrad()) {
        if (filter_scatter_[i])
            launch_scatter_filter_grads(d.gk, at_, g, l.out.c, l.in.c, l.spec.kernel * l.spec.kernel, w.stream);
        else
            launch_scatter_grads(d.gk, at_, map_ + copy_offset_[i], grads_, copy_count_[i], w.stream);
    }
    mark(i, "bwd filter");
    if (accumulate && (!need_dx || d.own_dgrad()))
        throw std::logic_error("a data gradient summed into one not cuDNN's");
    if (need_dx && d.tc_dgrad && i == first_wgrad_at_ && leave_first_bn_ && turned) {
        // Into partials in workspace_, which nothing on stream_ uses before the first layer's backward reads them.
        const TcConvFirstWgrad f{input_of(0), first_relu_out(true), static_cast<float*>(workspace_), direct_shape(n)};
        first_wgrad_rows_ = launch_tc_conv(dy, d.wturned, dx, conv_shape(i, n, true), nullptr, stream_, {}, &f);
    } else if (need_dx && d.wgmma_dgrad)
        launch_wgmma_conv(dy, turned ? d.wturned : d.wk, dx, conv_shape(i, n, true), turned ? nullptr : workspace_,
                          stream_);
    else if (need_dx && d.tc_dgrad)
        launch_tc_conv(dy, turned ? d.wturned : d.wk, dx, conv_shape(i, n, true), turned ? nullptr : workspace_,
                       stream_);
    else if (need_dx && !(d.graph_dgrad && n == cfg_.max_batch &&
                          d.graph_dgrad->run(cudnn_, dx, d.wk, const_cast<void*>(dy), workspace_, accumulate))) {
        require_fit(bd.unfit[i].bwd_data);
        CUDNN_CHECK(cudnnSetConvolutionMathType(d.conv_bwd_data, bd.algos[i].data_math));
        CUDNN_CHECK(cudnnConvolutionBackwardData(cudnn_, &one, d.filter, d.wk, yd, dy, d.conv_bwd_data,
                                                 bd.algos[i].bwd_data, workspace_, workspace_bytes_,
                                                 accumulate ? &one : &zero, xd, dx));
    }
}

// dx_written: linear_xent wrote dx (need_dx still puts the weight gradient
// on the side branch: the data gradients below follow it).
void CudaTrainer::backward_linear(std::size_t i, std::uint32_t n, const void* dy, void* dx, bool need_dx,
                                  bool dx_written) {
    const LayerPlan& l = layers()[i];
    const LayerDev& d = dev_[i];
    const float* p = params_ + l.param_offset;
    float* g = grads_ + l.param_offset;
    const int in = static_cast<int>(l.in.c), out = static_cast<int>(l.out.c), nn = static_cast<int>(n);
    // dW (fp32) = x^T dy, straight into the gradient vector; where the copy's
    // columns are in NHWC order, into gk and transposed back after the last
    // read of dy.
    const Lane w = weight_lane(need_dx);
    float* dw = d.gk ? static_cast<float*>(d.gk) : g;
    if (const EpilogueGemm* e = fc_gemms(n)[i].weight_grad.get()) {
        e->run(input_of(i), dy, dw, w.blas_workspace, w.stream);
    } else {
        gemm(w.cublas, CUBLAS_OP_N, CUBLAS_OP_T, in, out, nn, input_of(i), blas_type_, in, dy, out, dw, CUDA_R_32F, in);
        if (l.spec.bias) launch_bias_grad(dy, at_, g + std::uint64_t{l.out.c} * l.in.c, n, l.out.c, 1, nchw_, w.stream);
    }
    if (w.stream != stream_) gbuf_.read_by_side(dy, *side_);
    if (const TensorShape f = nhwc_order(i); d.gk) // the copy's columns in NHWC order, the parameters' in NCHW
        launch_nhwc_to_nchw(d.gk, g, ActType::f32, l.out.c, f.c, std::uint64_t{f.h} * f.w, w.stream);
    if (need_dx && !dx_written) {
        const bool copy = d.wk != nullptr;
        gemm(cublas_, CUBLAS_OP_N, CUBLAS_OP_N, in, nn, out, copy ? d.wk : p, copy ? blas_type_ : CUDA_R_32F, in, dy,
             out, dx, blas_type_, in);
    }
}

// Layer i's backward pass from dy into dx; returns where its input gradient
// is (dx, or dy itself where the layer passes it through or a fused layer
// below applies it).
const void* CudaTrainer::backward_layer(std::size_t i, std::uint32_t n, const void* dy, void* dx, bool need_dx,
                                        bool fuse) {
    const LayerPlan& l = layers()[i];
    LayerDev& d = dev_[i];
    const void* x = input_of(i);
    const float* p = params_ + l.param_offset;
    float* g = grads_ + l.param_offset;
    const std::uint64_t count_in = std::uint64_t{n} * l.in.numel(), hw_in = std::uint64_t{l.in.h} * l.in.w;
    switch (l.spec.kind) {
    case LayerKind::conv: // a fused backward is step_body's, which turned the filters ahead
        if (fuse && i > 0 && dgrad_sums_skip(i - 1)) {
            void* sum = dev_[static_cast<std::size_t>(layers()[i - 1].partner)].stash;
            backward_conv(i, n, dy, sum, need_dx, fuse, true);
            return sum;
        }
        backward_conv(i, n, dy, dx, need_dx, fuse);
        return dx;
    case LayerKind::batchnorm: {
        const bool fused = fuse && d.relu_next; // dy: the ReLU's output gradient, or the pool's when pooled
        if (i == 1 && leave_first_bn_) {        // first_bn_into_wgrad
            pending_bn_.emplace();
            pending_bn_->relu_out = first_relu_out(fuse);
            pending_bn_->b = {params_ + layers()[0].param_offset,
                              p,
                              d.aux,
                              d.aux + l.in.c,
                              g,
                              g + l.in.c,
                              moments_[in_->current()],
                              low_update_in_first_bn_ ? param_update(true) : ParamUpdate{},
                              layers()[0].param_offset,
                              l.param_offset};
            return dy;
        }
        launch_bn_backward(x, dy, fused, dx, at_, n, hw_in, l.in.c, nchw_, p, p + l.in.c, d.aux, d.aux + l.in.c, g,
                           g + l.in.c, bn_partials_, stream_, fused && d.pool_next ? l.in.w : 0);
        return dx;
    }
    case LayerKind::relu:
        if (fuse && i > 0 && dev_[i - 1].relu_next) return dy; // the batchnorm below applies the mask
        if (xent_dx_ && i == xent_relu_) return dy;            // linear_xent applied it
        launch_relu_backward(d.out, dy, dx, at_, count_in, stream_);
        return dx;
    case LayerKind::tanh:
        launch_tanh_backward(d.out, dy, dx, at_, count_in, stream_);
        return dx;
    case LayerKind::side:
        launch_copy_rows(dy, l.out.c, dx, l.in.c, l.in.c, n, at_, stream_);
        return dx;
    case LayerKind::head: // the last head walked back sets the trunk's gradient, the others add to it
        if (i == static_cast<std::size_t>(cfg_.plan.heads.back().begin))
            launch_copy(dy, trunk_grad_, at_, count_in, stream_);
        else
            launch_add(trunk_grad_, dy, trunk_grad_, at_, count_in, stream_);
        return trunk_grad_;
    case LayerKind::maxpool:
    case LayerKind::avgpool:
        if (fuse && i >= 2 && dev_[i - 2].pool_next) return dy; // the batchnorm below takes the pooled gradient
        launch_pool_backward(x, dy, dx, at_, pool_shape(l, n, nchw_), l.spec.kind == LayerKind::maxpool, stream_);
        return dx;
    case LayerKind::global_avgpool:
        launch_gap_backward(dy, dx, at_, n, l.in.c, hw_in, nchw_, stream_);
        return dx;
    case LayerKind::linear:
        if (xent_dx_ && i == xent_layer_) { // linear_xent wrote dx: the weight gradient, beside what follows
            backward_linear(i, n, dy, nullptr, need_dx, true);
            return xent_dx_;
        }
        backward_linear(i, n, dy, dx, need_dx);
        return dx;
    case LayerKind::dropout:
        if (l.spec.drop > 0.0f)
            launch_mul_mask(dy, d.aux, dx, at_, count_in, stream_);
        else
            launch_copy(dy, dx, at_, count_in, stream_);
        return dx;
    case LayerKind::flatten:
        if (d.out != x)
            launch_nchw_to_nhwc(dy, dx, at_, n, l.in.c, hw_in, stream_);
        else if (i == 0)
            launch_copy(dy, dx, at_, count_in, stream_);
        else
            return dy;
        return dx;
    case LayerKind::residual_end:
        if (dy != d.stash) launch_copy(dy, d.stash, at_, count_in, stream_); // else the layer above wrote it there
        if (i != 0) return dy;
        launch_copy(dy, dx, at_, count_in, stream_);
        return dx;
    case LayerKind::residual_begin:
        if (fuse && dgrad_sums_skip(i)) return dy; // the convolution above summed its data gradient into the stash
        launch_add(dy, dev_[static_cast<std::size_t>(l.partner)].stash, dx, at_, count_in, stream_);
        return dx;
    }
    return dx;
}

// From the last layer to the first: each head's layers start from its loss
// gradient, the trunk from the sum of the heads' gradients of its output.
// before_join: issued on the main stream once every layer's backward is,
// before the side branches join it.
void CudaTrainer::backward(std::uint32_t n, bool want_input_grad, bool fuse, std::size_t early,
                           const std::function<void()>& before_join) {
    // A fused forward (forward_first_conv_bn) stores no first convolution output for the batch norm's own backward.
    if (fuse && want_input_grad && first_conv_bn_)
        throw std::logic_error("an input gradient asked of a fused training step whose first batch norm used moments");
    leave_first_bn_ = fuse && !want_input_grad && first_conv_bn_;
    const auto& heads = cfg_.plan.heads;
    const std::int32_t trunk_end = heads[0].begin >= 0 ? cfg_.plan.trunk_end() : -2;
    const void* dy = nullptr;
    const std::size_t upper = upper_update_layer(early);
    update_in_wgrad_at_ = fuse && early_update_in_wgrad(early, upper) ? early : npos;
    // With the early layer's weights updated in its weight gradient, the
    // upper update takes the parameters between (early_update_in_wgrad).
    std::uint64_t upper_begin = upper != npos ? layers()[upper].param_offset : 0;
    if (update_in_wgrad_at_ != npos) upper_begin = layers()[early].param_offset + conv_weights(layers()[early]);
    for (std::size_t i = layers().size(); i-- > 0;) {
        for (std::size_t h = 0; h < heads.size(); ++h)
            if (heads[h].output == i) dy = heads_[h].dz;
        if (static_cast<std::int32_t>(i) == trunk_end) dy = trunk_grad_;
        const bool first = layers()[i].source < 0;
        void* const stash = fuse ? stash_above(i) : nullptr;
        void* dx = first ? input_grad_ : stash ? stash : gbuf_.next(dy, stream_);
        if (i == early && upper != npos) upper_->wait_for(*side_); // the weight gradients from upper up, not i's
        dy = backward_layer(i, n, dy, dx, !first || want_input_grad, fuse);
        mark(i, layers()[i].spec.kind == LayerKind::conv ? "bwd data" : "bwd");
        if (i == early && upper != npos) { // after i's data gradient, beside its weight gradient
            upper_->fork();
            update({upper_begin, cfg_.plan.params}, upper_->stream());
        }
        // Nothing below reads these parameters or writes their gradients.
        if (i == early && update_in_wgrad_at_ == npos) {
            side_->fork();
            update({layers()[i].param_offset, upper == npos ? cfg_.plan.params : layers()[upper].param_offset},
                   side_->stream());
        }
    }
    if (trunk_end == -1 && want_input_grad) // the heads read the input itself
        launch_copy(trunk_grad_, input_grad_, at_, std::uint64_t{n} * input_.numel(), stream_);
    if (before_join) before_join();
    side_->join(); // the weight gradients are all there
    if (upper_) upper_->join();
    gbuf_.reset();
    xent_dx_ = nullptr;
    update_in_wgrad_at_ = npos;
}

// The output of the ReLU after the first batch norm where a fused backward
// takes that ReLU into the norm's (the mask of the first convolution's output
// gradient, first_bn.hpp), else null.
const void* CudaTrainer::first_relu_out(bool fuse) const {
    return fuse && dev_[1].relu_next ? dev_[2].out : nullptr;
}

// Whether a batch norm right after a direct first convolution (its input the
// convolution's output, no bias, no pool fused in) leaves its backward to the
// convolution's weight gradient and the input's moments (first_bn.hpp): its
// reduction over the largest activations, at the end of a step where nothing
// else runs beside it, is then not run. Only where no input gradient is
// wanted (the moments give the parameters' gradients, not the pass's output),
// and where that weight gradient can (direct_conv_wgrad_takes_bn: bf16 or
// tf32 on tensor cores).
bool CudaTrainer::first_bn_into_wgrad() const {
    if (!first_conv_bn_ || !direct_first_ || layers().size() < 2) return false;
    const LayerPlan &c = layers()[0], &b = layers()[1];
    return !c.spec.bias && b.spec.kind == LayerKind::batchnorm && b.source == 0 &&
           !(dev_[1].relu_next && dev_[1].pool_next) && direct_conv_wgrad_takes_bn(at_, direct_shape(cfg_.max_batch));
}

// The first convolution's weight gradient summed in the data gradient of the
// convolution above it (TcConvFirstWgrad): where the batch norm after the
// first convolution is left to that weight gradient (first_conv_bn_: bf16 or
// tf32), layers conv, bn[, relu], conv one after another, and the upper
// convolution's data gradient is tc_conv's and takes it. A rule, not timed:
// it saves a whole kernel's pass over dy and the ReLU's output, and the data
// gradient's store of dy.
void CudaTrainer::plan_first_wgrad_in_dgrad() {
    first_wgrad_at_ = 0;
    if (env_off("DSTK_FIRST_WGRAD_FUSED")) return;
    const auto& ls = layers();
    if (!first_conv_bn_ || ls[0].spec.bias) return;
    const std::size_t up = ls.size() > 2 && ls[2].spec.kind == LayerKind::relu ? 3 : 2;
    if (ls.size() <= up || ls[up].spec.kind != LayerKind::conv || !dev_[up].tc_dgrad) return;
    if (up == 3 && !dev_[1].relu_next) return; // the ReLU's mask comes with the batch norm's fused backward
    for (std::size_t i = 1; i <= up; ++i)
        if (ls[i].source != static_cast<std::int32_t>(i) - 1) return;
    if (tc_conv_takes_first_wgrad(conv_shape(up, cfg_.max_batch, true), direct_shape(cfg_.max_batch)))
        first_wgrad_at_ = up;
}

// Which convolutions run by tc_conv or wgmma_conv also sum the statistics of
// the batch norm right after them in their epilogue (the norm's reduction pass
// over the output is then not run). The kernel choice timed them so against
// cuDNN's forward followed by that pass (find_algorithms).
void CudaTrainer::plan_conv_bn_stats() {
    for (std::size_t i = 0; i < layers().size(); ++i)
        dev_[i].bn_stats = (dev_[i].tc_fwd || dev_[i].wgmma_fwd) && stats_in_conv_fit(i);
}

// Whether convolution i's forward may sum the next batch norm's statistics:
// no bias (added after the epilogue), the norm reading this output.
bool CudaTrainer::stats_in_conv_fit(std::size_t i) const {
    if (!conv_bn_stats_ || i + 1 >= layers().size()) return false;
    const LayerPlan &c = layers()[i], &b = layers()[i + 1];
    return c.spec.kind == LayerKind::conv && !c.spec.bias && b.spec.kind == LayerKind::batchnorm &&
           b.source == static_cast<std::int32_t>(i);
}

// Convolution i's forward by wgmma_conv, in training also summing the next
// batch norm's statistics where planned (bn_stats: their splits into splits).
void CudaTrainer::forward_wgmma_conv(std::size_t i, const void* x, std::uint32_t n, bool training, unsigned& splits) {
    const bool stats = training && dev_[i].bn_stats;
    const unsigned s = launch_wgmma_conv(x, dev_[i].wk, dev_[i].out, conv_shape(i, n, false), nullptr, stream_,
                                         stats ? conv_stats(i) : TcConvStats{});
    if (stats) splits = s;
}

// Where convolution i's epilogue sums them: the norm's partials, its running
// mean as the pivot.
TcConvStats CudaTrainer::conv_stats(std::size_t i) const {
    return {bn_partials_, states_ + layers()[i + 1].state_offset, bn_max_splits_of_partials()};
}

// The layer whose weight gradient is the last but one of a backward pass:
// once it is issued, every parameter from it up can be updated on the side
// stream while the layers below finish (the last weight gradient, usually
// the first layer's, is followed by a small update, low_update_before_join; where the data
// gradient above takes the first layer's, plan_first_wgrad_in_dgrad, both end
// the pass together, and starting the update a layer higher on the side
// stream measured slower; upper_update_layer's branch takes the layers above).
// None where the gradients are averaged across ranks first, where the weight
// gradients run on the main stream, or while profiling.
std::size_t CudaTrainer::early_update_layer() const {
    if (reducer_ || one_stream_ || marks_) return npos;
    return weighted_layer(2);
}

// Whether the update of the layers below early_update_layer's may run on the
// main stream before the side branches join it: every gradient it reads is
// the main stream's (the batch norms' are; the one convolution or linear
// layer there reads the input, so no data gradient follows its weight
// gradient and that runs on the main stream, weight_lane), so the step ends
// with whichever branch ends last instead of with this update after both
// (DSTK_LOW_UPDATE_FIRST=0: after the join).
bool CudaTrainer::low_update_before_join(std::size_t early) const {
    if (early == npos || !low_update_first_) return false;
    const std::size_t first = weighted_layer(1);
    return first != npos && first < early && layers()[first].source < 0;
}

// The n-th (from 1) convolution or linear layer, npos where there are fewer.
std::size_t CudaTrainer::weighted_layer(std::size_t n) const {
    std::size_t found = 0;
    for (std::size_t i = 0; i < layers().size(); ++i) {
        const LayerKind k = layers()[i].spec.kind;
        if ((k == LayerKind::conv || k == LayerKind::linear) && ++found == n) return i;
    }
    return npos;
}

// The layer above early_update_layer's from which the parameters are updated
// on a branch of their own (upper_): once the early layer's data gradient is
// issued, beside that layer's weight gradient (the step's last large kernels),
// after every gradient from this layer up. On the side branch, after that
// weight gradient, this update ended the step; started at this layer's own
// backward instead, it slowed the data gradients below it in tf32. The early
// update covers the layers between. None where there is no early update, no
// third convolution or linear layer, or DSTK_UPPER_UPDATE=0.
std::size_t CudaTrainer::upper_update_layer(std::size_t early) const {
    if (early == npos || !upper_) return npos; // DSTK_UPPER_UPDATE=0: create_streams
    return weighted_layer(3);
}

// Whether the early layer's weights are updated in its weight gradient's
// sums (ParamUpdate), the gradient's last kernel, instead of by an update
// kernel after it at the end of the step: a convolution without a bias whose
// weight gradient is an own kernel's (summed into the gradient vector through the
// map) and whose data gradient reads the filters turned ahead (nothing else
// in the step reads its weights or their copy), with an upper update, which
// then takes the parameters between the two layers (the batch norms', whose
// gradients the main stream computed before). Results are the same bits.
bool CudaTrainer::early_update_in_wgrad(std::size_t early, std::size_t upper) const {
    if (!update_early_in_gradient_ || early == npos || upper == npos) return false;
    const LayerPlan& l = layers()[early];
    return l.spec.kind == LayerKind::conv && !l.spec.bias && l.source >= 0 && dev_[early].own_wgrad() &&
           dev_[early].own_dgrad();
}

// Whether the parameters below the early layer's are updated in the first
// batch norm's backward, which computes their every gradient (first_bn.hpp):
// where that update runs on the main stream right after it
// (low_update_before_join) and those parameters are exactly the first
// convolution's weights and the batch norm's scale and shift.
bool CudaTrainer::low_update_in_first_bn(std::size_t early) const {
    if (!update_low_in_gradient_ || !low_update_before_join(early) || !first_bn_into_wgrad()) return false;
    const LayerPlan &c = layers()[0], &b = layers()[1];
    return c.param_offset == 0 && b.param_offset == conv_weights(c) &&
           layers()[early].param_offset == b.param_offset + 2 * std::uint64_t{b.in.c};
}

ParamUpdate CudaTrainer::param_update(bool advance) const {
    return {
        cfg_.optimizer, params_, slots_, cfg_.plan.params, scalars_, inv_, wcopy_, at_, advance ? step_dev_ : nullptr};
}

void CudaTrainer::update(ParamRange r, cudaStream_t s, bool advance) {
    launch_optimizer(param_update(advance), grads_, r, s);
}

// The data gradients' filters of this step's weights, turned once ahead of
// the backward pass (on the side stream, beside the forward, where one runs):
// each data gradient then starts as soon as its dy is ready. Turned in line,
// the turning kernel sat between dy and the data gradient, and the same
// layer's weight gradient on the side stream, ready first, took the SMs.
void CudaTrainer::turn_filters_ahead(cudaStream_t s) {
    for (std::size_t i = 0; i < layers().size(); ++i)
        if (dev_[i].own_dgrad())
            launch_turn_filters(dev_[i].wk, dev_[i].wturned, conv_shape(i, cfg_.max_batch, true), s);
}

void CudaTrainer::step_body(std::uint32_t n) {
    // The step's learning rate and turned filters, on the side stream (beside the forward pass) where one runs.
    const bool beside = !marks_ && !one_stream_;
    if (beside) side_->fork();
    // Overlapping the step before (steps_overlap): after its end, which its
    // tail's updates read these scalars before and the filters turned here.
    if (overlapping_) CUDA_CHECK(cudaStreamWaitEvent(side_->stream(), step_done_, cudaEventWaitExternal));
    launch_step_scalars(cfg_.optimizer, cfg_.schedule, step_dev_, scalars_, beside ? side_->stream() : stream_);
    turn_filters_ahead(beside ? side_->stream() : stream_);
    forward(n, true, true);
    // The next batch's conversion after this forward pass (off the main chain: a PDL edge stays).
    if (input_gate_ && (input_gate_set_ || !overlapping_)) {
        if (beside) side_->fork();
        in_->open_gate(beside ? side_->stream() : stream_);
    }
    losses(n, train_phase, true, true);
    mark(~std::size_t{0}, "loss");
    if (beside) side_->join(); // the turned filters are there
    const std::size_t early = early_update_layer();
    low_update_in_first_bn_ = low_update_in_first_bn(early);
    const auto low_update = [&] {
        if (!low_update_in_first_bn_) // else the first batch norm's backward updated them
            update({0, early == npos ? cfg_.plan.params : layers()[early].param_offset}, stream_, true);
        mark(~std::size_t{0}, "optimizer");
        // The main chain's end: the next step's first layers may start (launch_on_lane).
        if (overlapping_) CUDA_CHECK(cudaEventRecordWithFlags(head_done_, stream_, cudaEventRecordExternal));
    };
    const bool before_join = low_update_before_join(early);
    backward(n, false, true, early, before_join ? std::function<void()>(low_update) : nullptr);
    if (reducer_) { // grads_ holds every weight gradient: one collective
        reducer_->average_device(grads_, cfg_.plan.params, stream_);
        mark(~std::size_t{0}, "gradient all-reduce");
    }
    if (!before_join) low_update();
    low_update_in_first_bn_ = false;
}

void CudaTrainer::train_step(const Batch& batch) {
    const StepFields b = step_fields(cfg_, batch);
    last_n_ = b.size;
    const bool graph = b.size == cfg_.max_batch, on_lane = graph && graph_overlaps_;
    convert(b, true, on_lane);
    if (on_lane) {
        launch_on_lane();
    } else {
        if (graph)
            CUDA_CHECK(cudaGraphLaunch(train_graph_[in_->current()], stream_));
        else
            step_body(b.size);
    }
    ++step_;
    train_samples_ += b.size;
}

// The current set's training graph on that set's lane (steps_overlap): after
// the main chain of the step before where that was a lane's too (the graph
// waits for the rest of it itself), else after all work on the main stream.
// The main stream then waits for the step's end, so that all else enqueued
// there, and the caller's events on compute_stream(), follow it as before.
void CudaTrainer::launch_on_lane() {
    const cudaStream_t lane = lanes_[in_->current()];
    if (!after_lane_) CUDA_CHECK(cudaEventRecord(lane_sync_, stream_));
    CUDA_CHECK(cudaStreamWaitEvent(lane, after_lane_ ? head_done_ : lane_sync_, 0));
    CUDA_CHECK(cudaGraphLaunch(train_graph_[in_->current()], lane));
    CUDA_CHECK(cudaEventRecord(step_done_, lane));
    CUDA_CHECK(cudaStreamWaitEvent(stream_, step_done_, 0));
    after_lane_ = true;
}

void CudaTrainer::evaluate(const Batch& batch) {
    const StepFields b = step_fields(cfg_, batch);
    last_n_ = b.size;
    convert(b, false);
    if (b.size == cfg_.max_batch) {
        CUDA_CHECK(cudaGraphLaunch(eval_graph_[in_->current()], stream_));
    } else {
        forward(b.size, false, true);
        losses(b.size, eval_phase, false, true);
    }
    eval_samples_ += b.size;
}

void CudaTrainer::compute_gradients(const Batch& batch) {
    const StepFields b = step_fields(cfg_, batch);
    last_n_ = b.size;
    convert(b, false);
    forward(b.size, true, false);
    losses(b.size, scratch_phase, true, false);
    backward(b.size, true, false);
    sync_main();
}

HeadLossArgs CudaTrainer::head_loss_args(std::size_t h, std::uint32_t n, Phase phase, bool want_grad) const {
    const MetricsBlock& m = metrics_[phase];
    const HeadPlan& hp = cfg_.plan.heads[h];
    HeadLossArgs a;
    a.z = dev_[hp.output].out;
    a.n = n;
    a.k = hp.target.width;
    a.loss = hp.target.loss;
    a.smoothing = cfg_.label_smoothing;
    a.weight = hp.weight;
    a.labels = heads_[h].labels[in_->current()];
    a.y = heads_[h].y[in_->current()];
    a.dz = want_grad ? heads_[h].dz : nullptr;
    a.m = m.heads + h;
    a.sums = m.sums + heads_[h].sums_offset;
    a.first_nonfinite = m.first_nonfinite;
    a.step = step_dev_;
    return a;
}

// Every head's loss kernel: gradients (training), counters and sums of
// `phase`. fuse: as the forward pass before it (which left a linear_xent
// layer to this).
void CudaTrainer::losses(std::uint32_t n, Phase phase, bool want_grad, bool fuse) {
    if (fuse && xent_layer_ != npos)
        linear_xent(n, phase, want_grad);
    else
        for (std::size_t h = 0; h < heads_.size(); ++h)
            launch_head_loss(head_loss_args(h, n, phase, want_grad), at_, stream_);
}

// The one head's linear layer and loss (plan_linear_xent); training: its
// input gradient, into a data-gradient buffer that the backward pass hands on
// from that layer (xent_dx_).
void CudaTrainer::linear_xent(std::uint32_t n, Phase phase, bool want_grad) {
    const LayerPlan& l = layers()[xent_layer_];
    const LayerDev& d = dev_[xent_layer_];
    const float* p = params_ + l.param_offset;
    LinearXentArgs x;
    x.x = input_of(xent_layer_);
    x.w = d.wk ? d.wk : p;
    x.w_act = d.wk != nullptr;
    x.bias = l.spec.bias ? p + std::uint64_t{l.out.c} * l.in.c : nullptr;
    x.in = l.in.c;
    x.z = d.out;
    x.relu_mask = xent_relu_ != npos;
    if (want_grad) {
        x.dx = gbuf_.next(heads_[0].dz, stream_);
        xent_dx_ = x.dx;
    }
    launch_linear_xent(head_loss_args(0, n, phase, want_grad), x, at_, stream_);
}

Metrics CudaTrainer::take(Phase phase, std::uint64_t& samples) {
    const MetricsBlock& block = metrics_[phase];
    std::vector<DeviceHeadMetrics> counters(heads_.size());
    std::vector<double> sums(metric_sums_);
    sync_main(); // the counters' reset below, on the main stream, comes before the next step
    CUDA_CHECK(
        cudaMemcpy(counters.data(), block.heads, counters.size() * sizeof(DeviceHeadMetrics), cudaMemcpyDeviceToHost));
    if (!sums.empty())
        CUDA_CHECK(cudaMemcpy(sums.data(), block.sums, sums.size() * sizeof(double), cudaMemcpyDeviceToHost));
    CUDA_CHECK(cudaMemsetAsync(block.heads, 0, metrics_bytes_, stream_));
    Metrics out = empty_metrics(cfg_.plan);
    out.samples = std::exchange(samples, 0);
    for (std::size_t h = 0; h < heads_.size(); ++h) {
        const HeadPlan& hp = cfg_.plan.heads[h];
        HeadMetrics& hm = out.heads[h];
        if (counters[h].bad_labels && hp.target.loss == LossKind::bce)
            throw runtime_error(std::to_string(counters[h].bad_labels) + " targets of '" + hp.target.field +
                                "' are neither 0 nor 1, as the loss bce needs (class labels? choose ce; other "
                                "values: mse)");
        if (counters[h].bad_labels)
            throw runtime_error(std::to_string(counters[h].bad_labels) + " labels of '" + hp.target.field +
                                "' outside [0, " + std::to_string(hp.target.width) +
                                ") (corrupt labels, or more classes than the model's?)");
        hm.samples = out.samples;
        hm.correct = counters[h].correct;
        hm.top5 = counters[h].top5;
        hm.loss_sum = counters[h].loss_sum;
        if (!hm.sums.empty()) {
            std::copy_n(sums.begin() + static_cast<std::ptrdiff_t>(heads_[h].sums_offset), hm.sums.size(),
                        hm.sums.begin());
            double per_output = 0.0;
            for (std::uint32_t j = 0; j < hm.width; ++j) per_output += hm.at(HeadMetrics::row_loss, j);
            hm.loss_sum = per_output / hm.width;
        }
        out.loss_sum += hp.weight * hm.loss_sum;
    }
    return out;
}

std::optional<std::uint64_t> CudaTrainer::first_nonfinite_step() {
    unsigned long long v = 0;
    sync_main();
    CUDA_CHECK(cudaMemcpy(&v, metrics_[train_phase].first_nonfinite, 8, cudaMemcpyDeviceToHost));
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
    sync_main();
    CUDA_CHECK(cudaMemcpy(params_, p.data(), p.size() * 4, cudaMemcpyHostToDevice));
    CUDA_CHECK(cudaMemcpy(states_, s.data(), s.size() * 4, cudaMemcpyHostToDevice));
    CUDA_CHECK(cudaMemcpy(slots_, slots.data(), slots.size() * 4, cudaMemcpyHostToDevice));
    const unsigned long long st = step_;
    CUDA_CHECK(cudaMemcpy(step_dev_, &st, 8, cudaMemcpyHostToDevice));
    CUDA_CHECK(cudaMemset(metrics_[train_phase].first_nonfinite, 0xff, 8));
    refresh_copies();
}

} // namespace

std::unique_ptr<Trainer> make_cuda_trainer(const TrainerConfig& config) {
    return std::make_unique<CudaTrainer>(config);
}

std::unique_ptr<BackendBuffer> make_cuda_buffer(int device, std::uint64_t bytes) {
    return std::make_unique<CudaBuffer>(device, bytes);
}

} // namespace dstk::train
