// Finite-difference checks of every CPU layer's backward pass: the analytic
// gradients of the mean (label-smoothed) cross-entropy with respect to sampled
// parameters and inputs agree with central differences of the forward pass.
#include <gtest/gtest.h>

#include <cmath>

#include "dstk/rng.hpp"
#include "dstk/train/trainer.hpp"

using namespace dstk;
using namespace dstk::train;

namespace {

struct Net {
    std::unique_ptr<Trainer> t;
    std::vector<float> x;
    std::vector<std::int32_t> y;
    float smoothing = 0.0f;
};

Net make_net(const char* spec, TensorShape in, std::uint32_t classes, std::uint32_t batch, float smoothing = 0.0f) {
    TrainerConfig c;
    c.plan = plan_network(parse_model_spec(spec), in, classes);
    c.input_dtype = DType::f32;
    c.mean.assign(in.c, 0.0f);
    c.std.assign(in.c, 1.0f);
    c.max_batch = batch;
    c.label_smoothing = smoothing;
    c.seed = 7;
    c.cpu_threads = 2;
    Net n{make_trainer(c), {}, {}, smoothing};
    CounterRng rng(99, 1);
    n.x.resize(batch * in.numel());
    for (auto& v : n.x) v = static_cast<float>(rng.normal());
    for (std::uint32_t i = 0; i < batch; ++i) n.y.push_back(static_cast<std::int32_t>(rng.below(classes)));
    // Non-trivial BN affine parameters, so their gradients are tested away from gamma = 1, beta = 0.
    auto p = n.t->read_parameters();
    for (const auto& l : c.plan.layers)
        if (l.spec.kind == LayerKind::batchnorm)
            for (std::uint64_t j = 0; j < l.param_count; ++j)
                p[l.param_offset + j] = static_cast<float>(rng.uniform(0.5, 1.5));
    n.t->write_parameters(p);
    return n;
}

// Loss of the current parameters on the net's batch, in double from the logits.
double loss(Net& n) {
    const auto& plan = n.t->config().plan;
    const std::uint32_t batch = static_cast<std::uint32_t>(n.y.size()), k = plan.classes;
    n.t->compute_gradients(step_batch(n.t->config(), n.x.data(), n.y.data(), batch));
    const auto z = n.t->read_activation(plan.layers.size() - 1);
    double total = 0.0;
    for (std::uint32_t s = 0; s < batch; ++s) {
        double m = z[s * k];
        for (std::uint32_t j = 1; j < k; ++j) m = std::max(m, static_cast<double>(z[s * k + j]));
        double d = 0.0;
        for (std::uint32_t j = 0; j < k; ++j) d += std::exp(z[s * k + j] - m);
        const double lse = std::log(d) + m;
        for (std::uint32_t j = 0; j < k; ++j) {
            const double q = (static_cast<std::int32_t>(j) == n.y[s] ? 1.0 - n.smoothing : 0.0) + n.smoothing / k;
            total += q * (lse - z[s * k + j]);
        }
    }
    return total / batch;
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
void check_gradients(const char* spec, TensorShape in, std::uint32_t classes, std::uint32_t batch,
                     float smoothing = 0.0f, int samples = 12) {
    SCOPED_TRACE(spec);
    Net n = make_net(spec, in, classes, batch, smoothing);
    n.t->compute_gradients(step_batch(n.t->config(), n.x.data(), n.y.data(), batch));
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
