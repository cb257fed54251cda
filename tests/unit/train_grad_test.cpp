// Finite-difference checks of every CPU layer's backward pass and of every
// loss: the analytic gradients of the weighted sum of the heads' mean losses
// (cross-entropy, label-smoothed where asked; MSE; Poisson NLL with a softplus
// or exp rate; BCE with logits) with respect to sampled parameters and inputs
// agree with central differences of the forward pass. The losses are computed
// here in double, apart from the trainer's own code.
#include <gtest/gtest.h>

#include <cmath>

#include "dstk/rng.hpp"
#include "dstk/train/trainer.hpp"

using namespace dstk;
using namespace dstk::train;

namespace {

struct Net {
    std::unique_ptr<Trainer> t;
    std::vector<float> x, side;
    std::vector<std::vector<std::int32_t>> labels; // per head: ce classes
    std::vector<std::vector<float>> values;        // per head: other targets
    float smoothing = 0.0f;
    std::uint32_t batch = 0;

    // Input, each head's target (one field per head here), side input.
    Batch step() const {
        std::vector<const void*> data{x.data()};
        for (std::size_t h = 0; h < labels.size(); ++h)
            data.push_back(t->config().plan.heads[h].target.loss == LossKind::ce
                               ? static_cast<const void*>(labels[h].data())
                               : values[h].data());
        if (!side.empty()) data.push_back(side.data());
        return step_batch(t->config(), data, batch);
    }
};

// One target per head, field "t<h>": i32 classes for ce, f32 values otherwise.
Target target(LossKind loss, std::uint32_t width, int h) {
    const bool ce = loss == LossKind::ce;
    return {"t" + std::to_string(h), ce ? DType::i32 : DType::f32, ce ? Shape{} : Shape{{width}}, loss, width};
}

Net make_net(const char* spec, TensorShape in, const std::vector<Target>& targets, std::uint32_t batch,
             float smoothing = 0.0f, std::uint32_t side = 0) {
    TrainerConfig c;
    c.plan = plan_network(parse_model_spec(spec), in, targets, side);
    c.input_dtype = DType::f32;
    c.mean.assign(in.c, 0.0f);
    c.std.assign(in.c, 1.0f);
    if (side) c.side = {"side", DType::f32, std::vector<float>(side, 0.5f), std::vector<float>(side, 2.0f)};
    c.max_batch = batch;
    c.label_smoothing = smoothing;
    c.seed = 7;
    c.cpu_threads = 2;
    Net n{make_trainer(c), {}, {}, {}, {}, smoothing, batch};
    CounterRng rng(99, 1);
    n.x.resize(batch * in.numel());
    for (auto& v : n.x) v = static_cast<float>(rng.normal());
    n.side.resize(std::uint64_t{batch} * side);
    for (auto& v : n.side) v = static_cast<float>(rng.normal());
    for (const auto& h : c.plan.heads) {
        const std::uint32_t k = h.target.width;
        n.labels.emplace_back();
        n.values.emplace_back();
        for (std::uint32_t i = 0; i < batch; ++i) {
            if (h.target.loss == LossKind::ce) n.labels.back().push_back(static_cast<std::int32_t>(rng.below(k)));
            for (std::uint32_t j = 0; j < k && h.target.loss != LossKind::ce; ++j)
                n.values.back().push_back(h.target.loss == LossKind::mse   ? static_cast<float>(rng.normal())
                                          : h.target.loss == LossKind::bce ? static_cast<float>(rng.below(2))
                                                                           : static_cast<float>(rng.below(5)));
        }
    }
    // Non-trivial BN affine parameters, so their gradients are tested away from gamma = 1, beta = 0.
    auto p = n.t->read_parameters();
    for (const auto& l : c.plan.layers)
        if (l.spec.kind == LayerKind::batchnorm)
            for (std::uint64_t j = 0; j < l.param_count; ++j)
                p[l.param_offset + j] = static_cast<float>(rng.uniform(0.5, 1.5));
    n.t->write_parameters(p);
    return n;
}

// One head's mean loss over the batch, from its outputs, in double.
double head_mean_loss(const HeadPlan& h, const std::vector<float>& z, const Net& n, std::size_t hi) {
    const std::uint32_t k = h.target.width;
    double total = 0.0;
    for (std::uint32_t s = 0; s < n.batch; ++s) {
        if (h.target.loss == LossKind::ce) {
            double m = z[s * k];
            for (std::uint32_t j = 1; j < k; ++j) m = std::max(m, static_cast<double>(z[s * k + j]));
            double d = 0.0;
            for (std::uint32_t j = 0; j < k; ++j) d += std::exp(z[s * k + j] - m);
            const double lse = std::log(d) + m;
            for (std::uint32_t j = 0; j < k; ++j) {
                const double q =
                    (static_cast<std::int32_t>(j) == n.labels[hi][s] ? 1.0 - n.smoothing : 0.0) + n.smoothing / k;
                total += q * (lse - z[s * k + j]);
            }
            continue;
        }
        for (std::uint32_t j = 0; j < k; ++j) {
            const double v = z[s * k + j], y = n.values[hi][s * k + j];
            switch (h.target.loss) {
            case LossKind::mse:
                total += (v - y) * (v - y) / k;
                break;
            case LossKind::poisson: {
                const double rate = std::log1p(std::exp(v));
                total += (rate - y * std::log(rate + 1e-8)) / k;
                break;
            }
            case LossKind::poisson_exp:
                total += (std::exp(v) - y * v) / k;
                break;
            case LossKind::bce:
                total += (std::max(v, 0.0) - v * y + std::log1p(std::exp(-std::abs(v)))) / k;
                break;
            case LossKind::ce:
                break;
            }
        }
    }
    return total / n.batch;
}

// The weighted sum of the heads' losses of the current parameters on the net's batch.
double loss(Net& n) {
    const auto& plan = n.t->config().plan;
    n.t->compute_gradients(n.step());
    double total = 0.0;
    for (std::size_t h = 0; h < plan.heads.size(); ++h)
        total += plan.heads[h].weight * head_mean_loss(plan.heads[h], n.t->read_activation(plan.heads[h].output), n, h);
    return total;
}

double tolerance(double a, double b) {
    return 2e-3 + 2e-2 * std::max(std::abs(a), std::abs(b));
}

// Central differences at h and h/2: where they disagree, the step crossed a
// kink (ReLU, max-pool switch) and the point proves nothing, so it is skipped.
// Returns false for a skipped point.
template <class F> bool check_point(F&& loss_at, double analytic, const std::string& what) {
    const double h = 4e-3;
    const double n1 = (loss_at(h) - loss_at(-h)) / (2 * h);
    const double n2 = (loss_at(h / 2) - loss_at(-h / 2)) / h;
    if (std::abs(n1 - n2) > tolerance(n1, n2) / 2) return false;
    EXPECT_NEAR(analytic, n2, tolerance(analytic, n2)) << what;
    return true;
}

// Checks `samples` parameters of every layer that has any, and `samples` inputs.
void check_net(const char* spec, Net n, int samples = 12) {
    SCOPED_TRACE(spec);
    n.t->compute_gradients(n.step());
    const auto grads = n.t->read_gradients();
    const auto dx = n.t->read_input_gradient();
    auto params = n.t->read_parameters();
    CounterRng pick(5, 5);
    int checked = 0, total = 0;
    for (const auto& l : n.t->config().plan.layers) {
        for (int s = 0; s < samples && l.param_count; ++s) {
            const std::uint64_t j = l.param_offset + pick.below(l.param_count);
            const float saved = params[j];
            auto at = [&](double d) {
                params[j] = saved + static_cast<float>(d);
                n.t->write_parameters(params);
                const double v = loss(n);
                params[j] = saved;
                n.t->write_parameters(params);
                return v;
            };
            ++total;
            checked += check_point(at, grads[j],
                                   std::string(layer_kind_name(l.spec.kind)) + " parameter " + std::to_string(j));
        }
    }
    for (int s = 0; s < samples; ++s) {
        const std::uint64_t j = pick.below(n.x.size());
        const float saved = n.x[j];
        auto at = [&](double d) {
            n.x[j] = saved + static_cast<float>(d);
            const double v = loss(n);
            n.x[j] = saved;
            return v;
        };
        ++total;
        checked += check_point(at, dx[j], "input " + std::to_string(j));
    }
    EXPECT_GE(checked, total * 3 / 4) << "too many points skipped at kinks";
}

// A network of one softmax cross-entropy head of `classes` classes.
void check_gradients(const char* spec, TensorShape in, std::uint32_t classes, std::uint32_t batch,
                     float smoothing = 0.0f) {
    check_net(spec, make_net(spec, in, {target(LossKind::ce, classes, 0)}, batch, smoothing));
}

} // namespace

TEST(TrainGrad, ConvWithBias) {
    check_gradients("conv3x3:3:bias,flatten,fc:3", {2, 5, 5}, 3, 3);
}
TEST(TrainGrad, ConvStridedUnpadded) {
    check_gradients("conv3x3:4:s2:p0,flatten,fc:3", {2, 7, 7}, 3, 3);
}
TEST(TrainGrad, Conv1x1AndConv5x5) {
    check_gradients("conv1x1:3,conv5x5:2,flatten,fc:3", {2, 6, 6}, 3, 2);
}
TEST(TrainGrad, BatchNorm) {
    check_gradients("conv3x3:3,bn,flatten,fc:3", {2, 4, 4}, 3, 4);
}
TEST(TrainGrad, BatchNormOnFeatures) {
    check_gradients("flatten,fc:6,bn,relu,fc:3", {5, 1, 1}, 3, 6);
}
TEST(TrainGrad, Relu) {
    check_gradients("conv3x3:3:bias,relu,flatten,fc:3", {2, 4, 4}, 3, 3);
}
TEST(TrainGrad, MaxPool) {
    check_gradients("conv3x3:3,maxpool2,flatten,fc:3", {2, 6, 6}, 3, 3);
}
TEST(TrainGrad, MaxPoolOverlapping) {
    check_gradients("maxpool3:s2,flatten,fc:3", {2, 7, 7}, 3, 3);
}
TEST(TrainGrad, AvgPool) {
    check_gradients("conv3x3:2,avgpool2,flatten,fc:3", {2, 6, 6}, 3, 3);
}
TEST(TrainGrad, GlobalAvgPool) {
    check_gradients("conv3x3:4,gap,flatten,fc:3", {2, 5, 5}, 3, 3);
}
TEST(TrainGrad, LinearStack) {
    check_gradients("flatten,fc:7,relu,fc:3:nobias", {2, 3, 3}, 3, 4);
}
TEST(TrainGrad, Dropout) {
    check_gradients("flatten,fc:8,dropout:0.5,fc:3", {6, 1, 1}, 3, 4);
}
TEST(TrainGrad, Residual) {
    check_gradients("conv3x3:2,res(conv3x3:2,bn,relu),flatten,fc:3", {2, 4, 4}, 3, 3);
}
TEST(TrainGrad, LabelSmoothing) {
    check_gradients("flatten,fc:4", {5, 1, 1}, 4, 5, 0.2f);
}

TEST(TrainGrad, Tanh) {
    check_gradients("flatten,fc:6,tanh,fc:3", {4, 1, 1}, 3, 4);
}

// Every loss on one head of several outputs.
TEST(TrainGrad, EveryLoss) {
    for (const LossKind loss : {LossKind::mse, LossKind::poisson, LossKind::poisson_exp, LossKind::bce}) {
        SCOPED_TRACE(std::string(loss_name(loss)));
        const char* spec = "flatten,fc:6,relu,fc:4";
        check_net(spec, make_net(spec, {3, 1, 1}, {target(loss, 4, 0)}, 5));
    }
}

// Two weighted heads on one trunk: the trunk's gradient is the sum of theirs.
TEST(TrainGrad, TwoHeadsWeighted) {
    const char* spec = "conv3x3:3,flatten,fc:8,relu,heads(a=fc:5>ce:t0, b=fc:1,tanh>mse:t1*0.5)";
    check_net(spec, make_net(spec, {2, 4, 4}, {target(LossKind::ce, 5, 0), target(LossKind::mse, 1, 1)}, 4, 0.1f));
}

// Heads that read the input itself, and a head with no layers of its own.
TEST(TrainGrad, HeadsOnTheInputAndAnEmptyHead) {
    const char* spec = "heads(a=flatten,fc:3>ce:t0, b=flatten,fc:2>poisson:t1)";
    check_net(spec, make_net(spec, {2, 2, 2}, {target(LossKind::ce, 3, 0), target(LossKind::poisson, 2, 1)}, 4));
    const char* empty = "flatten,fc:4,heads(a=>ce:t0, b=fc:2>bce:t1*2)";
    check_net(empty, make_net(empty, {5, 1, 1}, {target(LossKind::ce, 4, 0), target(LossKind::bce, 2, 1)}, 4));
}

// A side input joined before the last fc (and before heads).
TEST(TrainGrad, SideInput) {
    const char* spec = "flatten,fc:6,relu,side,fc:3";
    check_net(spec, make_net(spec, {4, 1, 1}, {target(LossKind::mse, 3, 0)}, 4, 0.0f, 3));
    const char* heads = "conv3x3:2,gap,side,heads(a=fc:3>ce:t0, b=fc:2>poisson-exp:t1)";
    check_net(heads, make_net(heads, {2, 4, 4}, {target(LossKind::ce, 3, 0), target(LossKind::poisson_exp, 2, 1)}, 4,
                              0.0f, 2));
}
