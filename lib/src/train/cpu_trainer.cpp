// The cpu backend: the reference implementation of every layer, forward and
// backward, in NCHW float. Work is split over samples (or channels, or output
// rows) in a fixed way, and reductions run in a fixed order, so results do not
// depend on the thread count.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <stdexcept>
#include <string>
#include <utility>

#include "backends.hpp"
#include "cpu_ops.hpp"
#include "dstk/widen.hpp"
#include "head_loss.hpp"
#include "dstk/dist/reducer.hpp"
#include "dstk/error.hpp"
#include "dstk/rng.hpp"
#include "dstk/thread_pool.hpp"

namespace dstk::train {
namespace {

constexpr int conv_chunks = 8; // fixed partition of the batch for weight-gradient partial sums
constexpr float bn_eps = 1e-5f, bn_momentum = 0.1f;

class CpuTrainer final : public Trainer {
  public:
    explicit CpuTrainer(const TrainerConfig& c);

    const TrainerConfig& config() const override { return cfg_; }
    MemoryPlan memory_plan() const override { return plan_; }
    std::uint64_t measured_device_bytes() const override { return 0; }

    void train_step(const Batch& b) override;
    void evaluate(const Batch& b) override;
    Metrics take_train_metrics() override { return std::exchange(train_metrics_, empty_metrics(cfg_.plan)); }
    Metrics take_eval_metrics() override { return std::exchange(eval_metrics_, empty_metrics(cfg_.plan)); }
    std::optional<std::uint64_t> first_nonfinite_step() override { return nonfinite_; }
    std::uint64_t steps() const override { return step_; }
    void synchronize() override {}
    void* compute_stream() const override { return nullptr; }

    std::vector<std::uint8_t> save_state() override { return pack_state({params_, states_, slots_, step_}); }
    void load_state(std::span<const std::uint8_t> blob) override {
        step_ = unpack_state(blob, params_, states_, slots_);
        nonfinite_.reset();
    }

    void compute_gradients(const Batch& b) override {
        need_input_grad_ = true;
        run_forward_backward(b, false);
        need_input_grad_ = false;
    }
    std::vector<float> read_activation(std::size_t layer) override {
        if (layer >= layers().size()) throw runtime_error("read_activation: no layer " + std::to_string(layer));
        const auto& a = act_[layer + 1];
        return {a.begin(), a.begin() + static_cast<std::ptrdiff_t>(last_n_ * layers()[layer].out.numel())};
    }
    std::vector<float> read_input_gradient() override {
        return {input_grad_.begin(),
                input_grad_.begin() + static_cast<std::ptrdiff_t>(last_n_ * cfg_.plan.input.numel())};
    }
    // Data parallel: rank 0's parameters (and optimiser slots, for a resume
    // whose ranks read the checkpoint) everywhere; gradients averaged in
    // train_step.
    void set_reducer(dist::Reducer* reducer) override {
        reducer_ = reducer;
        if (!reducer_) return;
        reducer_->broadcast_host(params_.data(), params_.size());
        reducer_->broadcast_host(states_.data(), states_.size());
        reducer_->broadcast_host(slots_.data(), slots_.size());
    }
    void average_states() override {
        if (reducer_ && !states_.empty()) reducer_->average_host(states_.data(), states_.size());
    }

    std::vector<float> read_gradients() override { return grads_; }
    std::vector<float> read_parameters() override { return params_; }
    std::vector<float> read_states() override { return states_; }
    void write_parameters(std::span<const float> p) override {
        if (p.size() != params_.size()) throw runtime_error("write_parameters: wrong size");
        std::copy(p.begin(), p.end(), params_.begin());
    }

  private:
    const std::vector<LayerPlan>& layers() const { return cfg_.plan.layers; }
    void convert(const StepFields& b);
    void convert_input(const StepFields& b);
    void forward(std::uint32_t n, bool training);
    void forward_layer(std::size_t i, std::uint32_t n, bool training);
    void pool_forward(std::size_t i, const float* x, float* y, std::uint32_t n);
    double loss_and_grad(std::uint32_t n, Metrics& m, bool want_grad);
    void backward(std::uint32_t n);
    void backward_layer(std::size_t i, const float* dy, float* dx, std::uint32_t n);
    void pool_backward(std::size_t i, const float* dy, float* dx, std::uint32_t n);
    const float* input_of(const LayerPlan& l) const { return act_[static_cast<std::size_t>(l.source + 1)].data(); }
    void run_forward_backward(const Batch& b, bool update);

    // Splits [0, n) into at most `parts` contiguous ranges and runs them on the pool.
    template <class F> void parallel_ranges(std::uint64_t n, std::uint64_t parts, F&& fn) {
        parts = std::max<std::uint64_t>(1, std::min(parts, n));
        pool_.parallel_for(parts, [&](std::uint64_t p) { fn(n * p / parts, n * (p + 1) / parts); });
    }
    std::uint64_t parts() const { return pool_.size() * 4ull; }

    void conv_forward(const LayerPlan& l, const float* x, float* y, std::uint32_t n);
    void conv_backward(const LayerPlan& l, const float* x, const float* dy, float* dx, std::uint32_t n, bool want_dx);
    void bn_forward(std::size_t i, const float* x, float* y, std::uint32_t n, bool training);
    void bn_backward(std::size_t i, const float* x, const float* dy, float* dx, std::uint32_t n);
    void linear_forward(const LayerPlan& l, const float* x, float* y, std::uint32_t n);
    void linear_backward(const LayerPlan& l, const float* x, const float* dy, float* dx, std::uint32_t n, bool want_dx);
    MemoryPlan allocated() const;

    TrainerConfig cfg_;
    MemoryPlan plan_;
    ThreadPool pool_;
    std::vector<float> params_, grads_, states_, slots_;
    std::vector<std::vector<float>> act_;           // act_[0] = normalised input, act_[i+1] = output of layer i
    std::vector<std::vector<float>> aux_;           // bn: mean, invstd; dropout: mask
    std::vector<std::vector<std::int32_t>> argmax_; // maxpool
    std::vector<std::vector<float>> stash_;         // residual_end: gradient for the skip path
    std::vector<float> gbuf_[2], input_grad_, wpart_;
    std::vector<std::vector<float>> dz_;            // per head: the loss gradient of its outputs
    std::vector<std::vector<std::int32_t>> labels_; // per ce head: the batch's classes
    std::vector<std::vector<float>> targets_;       // per other head: the batch's targets as float
    std::vector<float> side_;                       // the normalised side input
    std::vector<float> trunk_grad_;                 // heads: the sum of their gradients of the trunk's output
    std::uint64_t step_ = 0;
    std::uint32_t last_n_ = 0;
    bool need_input_grad_ = false;
    Metrics train_metrics_, eval_metrics_;
    std::optional<std::uint64_t> nonfinite_;
    dist::Reducer* reducer_ = nullptr;
};

} // namespace

// The buffers CpuTrainer's constructor allocates, from the plan alone.
MemoryPlan cpu_memory_plan(const TrainerConfig& c) {
    const NetworkPlan& plan = c.plan;
    const std::uint64_t b = c.max_batch, input = b * plan.input.numel();
    std::uint64_t act_floats = 0, max_w = 0;
    for (const auto& l : plan.layers) {
        act_floats += b * l.out.numel();
        if (l.spec.kind == LayerKind::conv) max_w = std::max(max_w, l.param_count);
    }
    std::uint64_t head_floats = b * plan.side; // side_
    if (plan.heads[0].begin >= 0) {            // trunk_grad_
        const std::int32_t t = plan.trunk_end();
        head_floats += b * (t < 0 ? plan.input.numel() : plan.layers[static_cast<std::size_t>(t)].out.numel());
    }
    for (const auto& h : plan.heads) // dz_, labels_ or targets_
        head_floats += b * h.target.width + (h.target.loss == LossKind::ce ? b : b * h.target.width);
    MemoryPlan m;
    m.parameters = 4 * (plan.params * 2 + plan.states + plan.params * c.optimizer.slots());
    // The layers' outputs, the input (act_[0]), two gradient buffers (gbuf_) and input_grad_.
    m.activations = 4 * (act_floats + input + 2 * b * plan.max_activation() + input + head_floats);
    m.workspace = 4 * conv_chunks * max_w;
    return m;
}

namespace {

CpuTrainer::CpuTrainer(const TrainerConfig& c) : cfg_(c), pool_(c.cpu_threads) {
    const auto& plan = cfg_.plan;
    const std::uint64_t b = cfg_.max_batch;
    params_.resize(plan.params);
    grads_.resize(plan.params);
    states_.resize(plan.states);
    slots_.resize(plan.params * cfg_.optimizer.slots());
    init_parameters(plan, cfg_.seed, params_, states_);
    std::uint64_t max_w = 0;
    act_.resize(layers().size() + 1);
    act_[0].resize(b * plan.input.numel());
    aux_.resize(layers().size());
    argmax_.resize(layers().size());
    stash_.resize(layers().size());
    for (std::size_t i = 0; i < layers().size(); ++i) {
        const auto& l = layers()[i];
        act_[i + 1].resize(b * l.out.numel());
        if (l.spec.kind == LayerKind::batchnorm) aux_[i].resize(2 * std::uint64_t{l.in.c});
        if (l.spec.kind == LayerKind::dropout) aux_[i].resize(b * l.out.numel());
        if (l.spec.kind == LayerKind::maxpool) argmax_[i].resize(b * l.out.numel());
        if (l.spec.kind == LayerKind::residual_end) stash_[i].resize(b * l.out.numel());
        if (l.spec.kind == LayerKind::conv) max_w = std::max(max_w, l.param_count);
    }
    gbuf_[0].resize(b * plan.max_activation());
    gbuf_[1].resize(b * plan.max_activation());
    input_grad_.resize(b * plan.input.numel());
    for (const auto& h : plan.heads) {
        const std::uint64_t w = b * h.target.width;
        dz_.emplace_back(w);
        labels_.emplace_back(h.target.loss == LossKind::ce ? b : 0);
        targets_.emplace_back(h.target.loss == LossKind::ce ? 0 : w);
    }
    side_.resize(b * plan.side);
    if (plan.heads[0].begin >= 0) {
        const std::int32_t t = plan.trunk_end();
        trunk_grad_.resize(b * (t < 0 ? plan.input.numel() : layers()[static_cast<std::size_t>(t)].out.numel()));
    }
    train_metrics_ = eval_metrics_ = empty_metrics(plan);
    wpart_.resize(conv_chunks * max_w);
    plan_ = cpu_memory_plan(cfg_);
    // dsplan sizes a run by cpu_memory_plan without making a trainer: what
    // was allocated above must be what it counts.
    const MemoryPlan got = allocated();
    if (got.parameters != plan_.parameters || got.activations != plan_.activations || got.workspace != plan_.workspace)
        throw std::logic_error("CpuTrainer: cpu_memory_plan counts " + std::to_string(plan_.total()) +
                               " bytes, the constructor allocated " + std::to_string(got.total()));
}

// The bytes of the buffers cpu_memory_plan counts, as allocated.
MemoryPlan CpuTrainer::allocated() const {
    const auto bytes = [](const auto& v) { return std::uint64_t{v.size()} * sizeof(v[0]); };
    const auto sum = [&](const auto& vs) {
        std::uint64_t n = 0;
        for (const auto& v : vs) n += bytes(v);
        return n;
    };
    MemoryPlan m;
    m.parameters = bytes(params_) + bytes(grads_) + bytes(states_) + bytes(slots_);
    m.activations = sum(act_) + bytes(gbuf_[0]) + bytes(gbuf_[1]) + bytes(input_grad_) + sum(dz_) + sum(labels_) +
                    sum(targets_) + bytes(side_) + bytes(trunk_grad_);
    m.workspace = bytes(wpart_);
    return m;
}

void CpuTrainer::convert_input(const StepFields& b) {
    const TensorShape in = cfg_.plan.input;
    const std::uint64_t hw = std::uint64_t{in.h} * in.w, per = in.numel();
    float* dst = act_[0].data();
    parallel_ranges(b.size, parts(), [&](std::uint64_t s0, std::uint64_t s1) {
        for (std::uint64_t s = s0; s < s1; ++s)
            for (std::uint64_t i = 0; i < per; ++i) {
                const std::uint64_t e = s * per + i, c = i / hw;
                dst[e] = (widen_float(b.x.data, cfg_.input_dtype, e) - cfg_.mean[c]) / cfg_.std[c];
            }
    });
}

// The input, then the side input (normalised per channel) and every head's
// target (classes as int32, other targets as float).
void CpuTrainer::convert(const StepFields& b) {
    convert_input(b);
    if (cfg_.plan.side) {
        const std::uint64_t per = cfg_.plan.side, hw = per / cfg_.side.mean.size();
        for (std::uint64_t e = 0; e < b.size * per; ++e) {
            const std::uint64_t c = (e % per) / hw;
            side_[e] = (widen_float(b.side.data, cfg_.side.dtype, e) - cfg_.side.mean[c]) / cfg_.side.std[c];
        }
    }
    for (std::size_t h = 0; h < cfg_.plan.heads.size(); ++h) {
        const Target& t = cfg_.plan.heads[h].target;
        if (t.loss == LossKind::ce) {
            for (std::uint32_t s = 0; s < b.size; ++s) {
                const double v = widen(b.targets[h].data, t.dtype, s);
                labels_[h][s] = v >= 0 && v < 2147483647.0 ? static_cast<std::int32_t>(v) : -1;
            }
        } else {
            for (std::uint64_t e = 0; e < std::uint64_t{b.size} * t.width; ++e)
                targets_[h][e] = widen_float(b.targets[h].data, t.dtype, e);
        }
    }
}

void CpuTrainer::conv_forward(const LayerPlan& l, const float* x, float* y, std::uint32_t n) {
    const cpu::ConvGeom g{static_cast<int>(l.in.c),        static_cast<int>(l.in.h),
                          static_cast<int>(l.in.w),        static_cast<int>(l.spec.kernel),
                          static_cast<int>(l.spec.stride), static_cast<int>(l.spec.padding),
                          static_cast<int>(l.out.h),       static_cast<int>(l.out.w)};
    const float* w = params_.data() + l.param_offset;
    const float* bias = l.spec.bias ? w + std::uint64_t{l.out.c} * g.rows() : nullptr;
    const int oc = static_cast<int>(l.out.c);
    parallel_ranges(n, parts(), [&](std::uint64_t s0, std::uint64_t s1) {
        thread_local std::vector<float> col;
        col.resize(static_cast<std::size_t>(g.rows()) * g.cols());
        for (std::uint64_t s = s0; s < s1; ++s) {
            cpu::im2col(g, x + s * l.in.numel(), col.data());
            float* out = y + s * l.out.numel();
            cpu::gemm(false, false, oc, g.cols(), g.rows(), 1.0f, w, g.rows(), col.data(), g.cols(), 0.0f, out,
                      g.cols());
            if (bias)
                for (int c = 0; c < oc; ++c)
                    for (int j = 0; j < g.cols(); ++j) out[c * g.cols() + j] += bias[c];
        }
    });
}

void CpuTrainer::conv_backward(const LayerPlan& l, const float* x, const float* dy, float* dx, std::uint32_t n,
                               bool want_dx) {
    const cpu::ConvGeom g{static_cast<int>(l.in.c),        static_cast<int>(l.in.h),
                          static_cast<int>(l.in.w),        static_cast<int>(l.spec.kernel),
                          static_cast<int>(l.spec.stride), static_cast<int>(l.spec.padding),
                          static_cast<int>(l.out.h),       static_cast<int>(l.out.w)};
    const float* w = params_.data() + l.param_offset;
    const int oc = static_cast<int>(l.out.c);
    const std::uint64_t pc = l.param_count, wcount = std::uint64_t{l.out.c} * g.rows();
    const std::uint64_t chunks = std::min<std::uint64_t>(conv_chunks, n);
    pool_.parallel_for(chunks, [&](std::uint64_t ch) {
        thread_local std::vector<float> col, dcol;
        col.resize(static_cast<std::size_t>(g.rows()) * g.cols());
        float* part = wpart_.data() + ch * pc;
        std::fill(part, part + pc, 0.0f);
        for (std::uint64_t s = n * ch / chunks; s < n * (ch + 1) / chunks; ++s) {
            const float* dys = dy + s * l.out.numel();
            cpu::im2col(g, x + s * l.in.numel(), col.data());
            cpu::gemm(false, true, oc, g.rows(), g.cols(), 1.0f, dys, g.cols(), col.data(), g.cols(), 1.0f, part,
                      g.rows());
            if (l.spec.bias)
                for (int c = 0; c < oc; ++c) {
                    float acc = 0.0f;
                    for (int j = 0; j < g.cols(); ++j) acc += dys[c * g.cols() + j];
                    part[wcount + c] += acc;
                }
            if (want_dx) {
                dcol.resize(col.size());
                cpu::gemm(true, false, g.rows(), g.cols(), oc, 1.0f, w, g.rows(), dys, g.cols(), 0.0f, dcol.data(),
                          g.cols());
                cpu::col2im(g, dcol.data(), dx + s * l.in.numel());
            }
        }
    });
    float* gw = grads_.data() + l.param_offset;
    parallel_ranges(pc, parts(), [&](std::uint64_t j0, std::uint64_t j1) {
        for (std::uint64_t j = j0; j < j1; ++j) {
            float acc = 0.0f;
            for (std::uint64_t ch = 0; ch < chunks; ++ch) acc += wpart_[ch * pc + j];
            gw[j] = acc;
        }
    });
}

void CpuTrainer::bn_forward(std::size_t i, const float* x, float* y, std::uint32_t n, bool training) {
    const auto& l = layers()[i];
    const std::uint64_t c = l.in.c, hw = std::uint64_t{l.in.h} * l.in.w, per = l.in.numel();
    const float* gamma = params_.data() + l.param_offset;
    const float* beta = gamma + c;
    float* run_mean = states_.data() + l.state_offset;
    float* run_var = run_mean + c;
    float* mean = aux_[i].data();
    float* invstd = mean + c;
    const double count = static_cast<double>(n) * static_cast<double>(hw);
    parallel_ranges(c, parts(), [&](std::uint64_t c0, std::uint64_t c1) {
        for (std::uint64_t ch = c0; ch < c1; ++ch) {
            float m, var;
            if (training) {
                double s = 0.0, ss = 0.0;
                for (std::uint32_t b = 0; b < n; ++b) {
                    const float* p = x + b * per + ch * hw;
                    for (std::uint64_t j = 0; j < hw; ++j) s += p[j];
                }
                const double md = s / count;
                for (std::uint32_t b = 0; b < n; ++b) {
                    const float* p = x + b * per + ch * hw;
                    for (std::uint64_t j = 0; j < hw; ++j) ss += (p[j] - md) * (p[j] - md);
                }
                m = static_cast<float>(md);
                var = static_cast<float>(ss / count);
                const double unbiased = count > 1 ? ss / (count - 1) : ss;
                run_mean[ch] = (1 - bn_momentum) * run_mean[ch] + bn_momentum * m;
                run_var[ch] = (1 - bn_momentum) * run_var[ch] + bn_momentum * static_cast<float>(unbiased);
            } else {
                m = run_mean[ch];
                var = run_var[ch];
            }
            const float is = 1.0f / std::sqrt(var + bn_eps);
            mean[ch] = m;
            invstd[ch] = is;
            const float a = gamma[ch] * is, bb = beta[ch] - m * a;
            for (std::uint32_t b = 0; b < n; ++b) {
                const float* p = x + b * per + ch * hw;
                float* q = y + b * per + ch * hw;
                for (std::uint64_t j = 0; j < hw; ++j) q[j] = p[j] * a + bb;
            }
        }
    });
}

void CpuTrainer::bn_backward(std::size_t i, const float* x, const float* dy, float* dx, std::uint32_t n) {
    const auto& l = layers()[i];
    const std::uint64_t c = l.in.c, hw = std::uint64_t{l.in.h} * l.in.w, per = l.in.numel();
    const float* gamma = params_.data() + l.param_offset;
    float* dgamma = grads_.data() + l.param_offset;
    float* dbeta = dgamma + c;
    const float* mean = aux_[i].data();
    const float* invstd = mean + c;
    const double count = static_cast<double>(n) * static_cast<double>(hw);
    parallel_ranges(c, parts(), [&](std::uint64_t c0, std::uint64_t c1) {
        for (std::uint64_t ch = c0; ch < c1; ++ch) {
            const float m = mean[ch], is = invstd[ch];
            double sdy = 0.0, sdyx = 0.0;
            for (std::uint32_t b = 0; b < n; ++b) {
                const float* p = x + b * per + ch * hw;
                const float* g = dy + b * per + ch * hw;
                for (std::uint64_t j = 0; j < hw; ++j) {
                    sdy += g[j];
                    sdyx += g[j] * (p[j] - m) * is;
                }
            }
            dgamma[ch] = static_cast<float>(sdyx);
            dbeta[ch] = static_cast<float>(sdy);
            const float k = gamma[ch] * is;
            const float mdy = static_cast<float>(sdy / count), mdyx = static_cast<float>(sdyx / count);
            for (std::uint32_t b = 0; b < n; ++b) {
                const float* p = x + b * per + ch * hw;
                const float* g = dy + b * per + ch * hw;
                float* q = dx + b * per + ch * hw;
                for (std::uint64_t j = 0; j < hw; ++j) q[j] = k * (g[j] - mdy - (p[j] - m) * is * mdyx);
            }
        }
    });
}

void CpuTrainer::linear_forward(const LayerPlan& l, const float* x, float* y, std::uint32_t n) {
    const int in = static_cast<int>(l.in.c), out = static_cast<int>(l.out.c);
    const float* w = params_.data() + l.param_offset;
    const float* bias = l.spec.bias ? w + std::uint64_t{l.out.c} * l.in.c : nullptr;
    parallel_ranges(n, parts(), [&](std::uint64_t r0, std::uint64_t r1) {
        const int rows = static_cast<int>(r1 - r0);
        float* yr = y + r0 * out;
        cpu::gemm(false, true, rows, out, in, 1.0f, x + r0 * in, in, w, in, 0.0f, yr, out);
        if (bias)
            for (int r = 0; r < rows; ++r)
                for (int j = 0; j < out; ++j) yr[r * out + j] += bias[j];
    });
}

void CpuTrainer::linear_backward(const LayerPlan& l, const float* x, const float* dy, float* dx, std::uint32_t n,
                                 bool want_dx) {
    const int in = static_cast<int>(l.in.c), out = static_cast<int>(l.out.c);
    const float* w = params_.data() + l.param_offset;
    float* gw = grads_.data() + l.param_offset;
    // dW[out][in] = dY^T X, split over output rows; db = column sums of dY.
    parallel_ranges(static_cast<std::uint64_t>(out), parts(), [&](std::uint64_t o0, std::uint64_t o1) {
        const int rows = static_cast<int>(o1 - o0);
        cpu::gemm(true, false, rows, in, static_cast<int>(n), 1.0f, dy + o0, out, x, in, 0.0f, gw + o0 * in, in);
        if (l.spec.bias)
            for (std::uint64_t o = o0; o < o1; ++o) {
                float acc = 0.0f;
                for (std::uint32_t s = 0; s < n; ++s) acc += dy[std::uint64_t{s} * out + o];
                gw[std::uint64_t{l.out.c} * l.in.c + o] = acc;
            }
    });
    if (want_dx)
        parallel_ranges(n, parts(), [&](std::uint64_t r0, std::uint64_t r1) {
            cpu::gemm(false, false, static_cast<int>(r1 - r0), in, out, 1.0f, dy + r0 * out, out, w, in, 0.0f,
                      dx + r0 * in, in);
        });
}

void CpuTrainer::pool_forward(std::size_t i, const float* x, float* y, std::uint32_t n) {
    const LayerPlan& l = layers()[i];
    const bool is_max = l.spec.kind == LayerKind::maxpool;
    const std::uint32_t k = l.spec.kernel, st = l.spec.stride;
    std::int32_t* am = is_max ? argmax_[i].data() : nullptr;
    parallel_ranges(std::uint64_t{n} * l.out.c, parts(), [&](std::uint64_t p0, std::uint64_t p1) {
        for (std::uint64_t p = p0; p < p1; ++p) {
            const float* src = x + p * l.in.h * l.in.w;
            for (std::uint32_t oy = 0; oy < l.out.h; ++oy)
                for (std::uint32_t ox = 0; ox < l.out.w; ++ox) {
                    float best = -std::numeric_limits<float>::infinity(), sum = 0.0f;
                    std::int32_t where = 0;
                    for (std::uint32_t ky = 0; ky < k; ++ky)
                        for (std::uint32_t kx = 0; kx < k; ++kx) {
                            const std::int32_t idx = static_cast<std::int32_t>((oy * st + ky) * l.in.w + ox * st + kx);
                            const float v = src[idx];
                            sum += v;
                            if (v > best || (kx == 0 && ky == 0)) {
                                best = v;
                                where = idx;
                            }
                        }
                    const std::uint64_t o = p * l.out.h * l.out.w + oy * l.out.w + ox;
                    if (is_max) {
                        y[o] = best;
                        am[o] = where;
                    } else {
                        y[o] = sum / static_cast<float>(k * k);
                    }
                }
        }
    });
}

void CpuTrainer::forward_layer(std::size_t i, std::uint32_t n, bool training) {
    const LayerPlan& l = layers()[i];
    const float* x = input_of(l);
    float* y = act_[i + 1].data();
    const std::uint64_t total = std::uint64_t{n} * l.out.numel();
    switch (l.spec.kind) {
    case LayerKind::conv:
        conv_forward(l, x, y, n);
        break;
    case LayerKind::batchnorm:
        bn_forward(i, x, y, n, training);
        break;
    case LayerKind::relu:
        for (std::uint64_t j = 0; j < total; ++j) y[j] = x[j] > 0.0f ? x[j] : 0.0f;
        break;
    case LayerKind::tanh:
        for (std::uint64_t j = 0; j < total; ++j) y[j] = std::tanh(x[j]);
        break;
    case LayerKind::maxpool:
    case LayerKind::avgpool:
        pool_forward(i, x, y, n);
        break;
    case LayerKind::global_avgpool: {
        const std::uint64_t hw = std::uint64_t{l.in.h} * l.in.w;
        for (std::uint64_t p = 0; p < std::uint64_t{n} * l.in.c; ++p) {
            float s = 0.0f;
            for (std::uint64_t j = 0; j < hw; ++j) s += x[p * hw + j];
            y[p] = s / static_cast<float>(hw);
        }
        break;
    }
    case LayerKind::linear:
        linear_forward(l, x, y, n);
        break;
    case LayerKind::dropout:
        if (training && l.spec.drop > 0.0f) {
            float* mask = aux_[i].data();
            const float keep_scale = 1.0f / (1.0f - l.spec.drop);
            const std::uint64_t stream = dropout_stream(i, step_);
            const auto threshold = static_cast<std::uint32_t>(static_cast<double>(l.spec.drop) * 4294967296.0);
            for (std::uint64_t j = 0; j < total; ++j) {
                mask[j] = philox(cfg_.seed, stream, j)[0] >= threshold ? keep_scale : 0.0f;
                y[j] = x[j] * mask[j];
            }
        } else {
            std::copy(x, x + total, y);
        }
        break;
    case LayerKind::flatten:
    case LayerKind::residual_begin:
    case LayerKind::head:
        std::copy(x, x + total, y);
        break;
    case LayerKind::residual_end: {
        const float* skip = act_[static_cast<std::size_t>(l.partner)].data();
        for (std::uint64_t j = 0; j < total; ++j) y[j] = x[j] + skip[j];
        break;
    }
    case LayerKind::side: {
        const std::uint64_t c = l.in.c, s = cfg_.plan.side;
        for (std::uint64_t r = 0; r < n; ++r) {
            std::copy(x + r * c, x + (r + 1) * c, y + r * (c + s));
            std::copy(side_.data() + r * s, side_.data() + (r + 1) * s, y + r * (c + s) + c);
        }
        break;
    }
    }
}

void CpuTrainer::forward(std::uint32_t n, bool training) {
    for (std::size_t i = 0; i < layers().size(); ++i) forward_layer(i, n, training);
}

// Every head's loss into m; the total of the heads' weighted losses, summed
// over samples.
double CpuTrainer::loss_and_grad(std::uint32_t n, Metrics& m, bool want_grad) {
    double total = 0.0;
    for (std::size_t h = 0; h < cfg_.plan.heads.size(); ++h) {
        const HeadPlan& hp = cfg_.plan.heads[h];
        const float* z = act_[hp.output + 1].data();
        const double sum = head_loss(hp, z, labels_[h].data(), targets_[h].data(), n, cfg_.label_smoothing,
                                     want_grad ? dz_[h].data() : nullptr, m.heads[h]);
        total += hp.weight * sum;
    }
    m.samples += n;
    m.loss_sum += total;
    return total;
}

void CpuTrainer::pool_backward(std::size_t i, const float* dy, float* dx, std::uint32_t n) {
    const LayerPlan& l = layers()[i];
    const bool is_max = l.spec.kind == LayerKind::maxpool;
    const std::uint32_t k = l.spec.kernel, st = l.spec.stride;
    const std::int32_t* am = argmax_[i].data();
    const std::uint64_t ohw = std::uint64_t{l.out.h} * l.out.w, ihw = std::uint64_t{l.in.h} * l.in.w;
    parallel_ranges(std::uint64_t{n} * l.out.c, parts(), [&](std::uint64_t p0, std::uint64_t p1) {
        for (std::uint64_t p = p0; p < p1; ++p) {
            float* d = dx + p * ihw;
            std::fill(d, d + ihw, 0.0f);
            for (std::uint32_t oy = 0; oy < l.out.h; ++oy)
                for (std::uint32_t ox = 0; ox < l.out.w; ++ox) {
                    const std::uint64_t o = p * ohw + oy * l.out.w + ox;
                    if (is_max) {
                        d[am[o]] += dy[o];
                    } else {
                        const float g = dy[o] / static_cast<float>(k * k);
                        for (std::uint32_t ky = 0; ky < k; ++ky)
                            for (std::uint32_t kx = 0; kx < k; ++kx) d[(oy * st + ky) * l.in.w + ox * st + kx] += g;
                    }
                }
        }
    });
}

// Layer i's backward pass from dy (its output's gradient) into dx (its
// input's); a head layer adds dy to the trunk's output gradient instead.
void CpuTrainer::backward_layer(std::size_t i, const float* dy, float* dx, std::uint32_t n) {
    const LayerPlan& l = layers()[i];
    const float* x = input_of(l);
    const float* y = act_[i + 1].data();
    const std::uint64_t total_in = std::uint64_t{n} * l.in.numel();
    const std::uint64_t total_out = std::uint64_t{n} * l.out.numel();
    switch (l.spec.kind) {
    case LayerKind::conv:
        conv_backward(l, x, dy, dx, n, true);
        break;
    case LayerKind::batchnorm:
        bn_backward(i, x, dy, dx, n);
        break;
    case LayerKind::relu:
        for (std::uint64_t j = 0; j < total_in; ++j) dx[j] = y[j] > 0.0f ? dy[j] : 0.0f;
        break;
    case LayerKind::tanh:
        for (std::uint64_t j = 0; j < total_in; ++j) dx[j] = dy[j] * (1.0f - y[j] * y[j]);
        break;
    case LayerKind::maxpool:
    case LayerKind::avgpool:
        pool_backward(i, dy, dx, n);
        break;
    case LayerKind::global_avgpool: {
        const std::uint64_t hw = std::uint64_t{l.in.h} * l.in.w;
        for (std::uint64_t j = 0; j < total_in; ++j) dx[j] = dy[j / hw] / static_cast<float>(hw);
        break;
    }
    case LayerKind::linear:
        linear_backward(l, x, dy, dx, n, true);
        break;
    case LayerKind::dropout:
        if (l.spec.drop > 0.0f)
            for (std::uint64_t j = 0; j < total_in; ++j) dx[j] = dy[j] * aux_[i][j];
        else
            std::copy(dy, dy + total_in, dx);
        break;
    case LayerKind::flatten:
        std::copy(dy, dy + total_in, dx);
        break;
    case LayerKind::residual_end:
        std::copy(dy, dy + total_out, stash_[i].data());
        std::copy(dy, dy + total_in, dx);
        break;
    case LayerKind::residual_begin: {
        const float* skip = stash_[static_cast<std::size_t>(l.partner)].data();
        for (std::uint64_t j = 0; j < total_in; ++j) dx[j] = dy[j] + skip[j];
        break;
    }
    case LayerKind::side: {
        const std::uint64_t c = l.in.c, w = l.out.c;
        for (std::uint64_t r = 0; r < n; ++r) std::copy(dy + r * w, dy + r * w + c, dx + r * c);
        break;
    }
    case LayerKind::head: // the last head walked back sets the trunk's gradient, the others add to it
        if (i == static_cast<std::size_t>(cfg_.plan.heads.back().begin))
            std::copy(dy, dy + total_in, trunk_grad_.data());
        else
            for (std::uint64_t j = 0; j < total_in; ++j) trunk_grad_[j] += dy[j];
        break;
    }
}

// From the last layer to the first: each head's layers start from its loss
// gradient, the trunk from the sum of the heads' gradients of its output.
void CpuTrainer::backward(std::uint32_t n) {
    std::fill(grads_.begin(), grads_.end(), 0.0f);
    const auto& heads = cfg_.plan.heads;
    const std::int32_t trunk_end = heads[0].begin >= 0 ? cfg_.plan.trunk_end() : -2;
    const float* dy = nullptr;
    int which = 0;
    for (std::size_t ii = layers().size(); ii-- > 0;) {
        for (std::size_t h = 0; h < heads.size(); ++h)
            if (heads[h].output == ii) dy = dz_[h].data();
        if (static_cast<std::int32_t>(ii) == trunk_end) dy = trunk_grad_.data();
        const LayerPlan& l = layers()[ii];
        if (ii == 0 && !need_input_grad_ && l.spec.kind == LayerKind::conv) {
            conv_backward(l, input_of(l), dy, nullptr, n, false);
            return;
        }
        float* dx = l.source < 0 ? input_grad_.data() : gbuf_[which].data();
        which ^= 1;
        backward_layer(ii, dy, dx, n);
        dy = dx;
    }
    if (trunk_end == -1 && need_input_grad_) // the heads read the input itself
        std::copy(trunk_grad_.begin(), trunk_grad_.begin() + static_cast<std::ptrdiff_t>(n * cfg_.plan.input.numel()),
                  input_grad_.begin());
}

void CpuTrainer::run_forward_backward(const Batch& batch, bool update) {
    const StepFields b = step_fields(cfg_, batch);
    last_n_ = b.size;
    convert(b);
    forward(b.size, true);
    Metrics m = empty_metrics(cfg_.plan);
    const double loss = loss_and_grad(b.size, m, true);
    if (!std::isfinite(loss) && !nonfinite_) nonfinite_ = step_;
    backward(b.size);
    if (!update) return;
    train_metrics_.add(m);
    // Each rank's gradient is the mean over its batch; their mean is the
    // global batch's (the ranks' batches are equal).
    if (reducer_) reducer_->average_host(grads_.data(), grads_.size());
    const float lr = learning_rate(cfg_.optimizer, cfg_.schedule, step_);
    const std::uint64_t np = params_.size();
    parallel_ranges(np, parts(), [&](std::uint64_t j0, std::uint64_t j1) {
        const std::span<float> p(params_.data() + j0, j1 - j0);
        const std::span<const float> g(grads_.data() + j0, j1 - j0);
        if (cfg_.optimizer.kind == OptimizerKind::sgd)
            sgd_update(cfg_.optimizer, lr, p, g, std::span<float>(slots_.data() + j0, j1 - j0));
        else
            adamw_update(cfg_.optimizer, lr, step_ + 1, p, g, std::span<float>(slots_.data() + j0, j1 - j0),
                         std::span<float>(slots_.data() + np + j0, j1 - j0));
    });
    ++step_;
}

void CpuTrainer::train_step(const Batch& b) {
    run_forward_backward(b, true);
}

void CpuTrainer::evaluate(const Batch& batch) {
    const StepFields b = step_fields(cfg_, batch);
    last_n_ = b.size;
    convert(b);
    forward(b.size, false);
    loss_and_grad(b.size, eval_metrics_, false);
}

} // namespace

std::unique_ptr<Trainer> make_cpu_trainer(const TrainerConfig& config) {
    return std::make_unique<CpuTrainer>(config);
}

} // namespace dstk::train
