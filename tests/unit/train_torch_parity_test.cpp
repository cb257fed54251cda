// The cpu backend against PyTorch: the same network, initialisation, batch and
// optimiser give the same losses, weights and BN statistics. The reference
// values come from PyTorch 2.15 on the twin of scripts/torch_baseline.py
// (build_model + dstk_init, which reproduces init_parameters bit for bit):
//
//   m, planned = build_model("conv3x3:3,bn,relu,maxpool2,flatten,fc:4", (2, 6, 6), 4)
//   dstk_init(planned, 7)
//   x = tensor([sin(0.37 * i) * 2 + 0.5 for i in range(432)]).view(6, 2, 6, 6)
//   y = tensor([0, 1, 2, 3, 1, 2])
//   o = SGD(m.parameters(), lr=0.1, momentum=0.9, nesterov=True, weight_decay=5e-4)
//     | AdamW(m.parameters(), lr=0.01, weight_decay=5e-4)   (label_smoothing=0.1)
//   3 x: logits = m(x); cross_entropy(logits, y, label_smoothing).backward(); o.step()
//   record cross_entropy(logits, y) without smoothing (what dstrain reports),
//   sum(p[i] * (i % 7 + 1)) over the flat parameters, and the BN statistics' sum.
#include <gtest/gtest.h>

#include <cmath>

#include "dstk/train/trainer.hpp"

using namespace dstk;
using namespace dstk::train;

namespace {

struct TorchReference {
    OptimizerKind optimizer;
    float lr, smoothing;
    double losses[3], weighted_sum, first, last, state_sum;
};

void expect_matches(const TorchReference& r) {
    TrainerConfig c;
    c.plan = plan_network(parse_model_spec("conv3x3:3,bn,relu,maxpool2,flatten,fc:4"), {2, 6, 6}, 4);
    c.input_dtype = DType::f32;
    c.mean = {0.0f, 0.0f};
    c.std = {1.0f, 1.0f};
    c.max_batch = 6;
    c.cpu_threads = 2;
    c.seed = 7;
    c.optimizer.kind = r.optimizer;
    c.optimizer.lr = r.lr;
    c.schedule.kind = ScheduleKind::constant;
    c.label_smoothing = r.smoothing;
    auto t = make_trainer(c);
    std::vector<float> x(6 * 72);
    for (std::size_t i = 0; i < x.size(); ++i)
        x[i] = static_cast<float>(std::sin(0.37 * static_cast<double>(i)) * 2 + 0.5);
    const std::vector<std::int32_t> y{0, 1, 2, 3, 1, 2};
    for (const double want : r.losses) {
        t->train_step(step_batch(t->config(), x.data(), y.data(), 6));
        EXPECT_NEAR(t->take_train_metrics().loss(), want, 2e-5) << optimizer_name(r.optimizer);
    }
    const auto p = t->read_parameters();
    ASSERT_EQ(p.size(), 172u);
    double weighted = 0.0, states = 0.0;
    for (std::size_t i = 0; i < p.size(); ++i) weighted += p[i] * static_cast<double>(i % 7 + 1);
    for (const float s : t->read_states()) states += s;
    EXPECT_NEAR(weighted, r.weighted_sum, 1e-4) << optimizer_name(r.optimizer);
    EXPECT_NEAR(p.front(), r.first, 1e-6);
    EXPECT_NEAR(p.back(), r.last, 1e-6);
    EXPECT_NEAR(states, r.state_sum, 1e-5);
}

} // namespace

TEST(TrainTorchParity, InitialisationIsTheTwinsBitForBit) {
    // small-cnn on 1x28x28, seed 0: values printed by dstk_init() in scripts/torch_baseline.py.
    const auto plan = plan_network(resolve_model("small-cnn", 10), {1, 28, 28}, 10);
    std::vector<float> p(plan.params), s(plan.states);
    init_parameters(plan, 0, p, s);
    ASSERT_EQ(p.size(), 20538u);
    EXPECT_EQ(p[0], -0.214213341f);
    EXPECT_EQ(p[2934], 0.0377955288f);
    EXPECT_EQ(p[17604], 0.0236715656f);
    EXPECT_EQ(p.back(), 0.0244403258f);
}

TEST(TrainTorchParity, ThreeSgdNesterovStepsEqualPyTorch) {
    expect_matches({OptimizerKind::sgd,
                    0.1f,
                    0.0f,
                    {1.46480048, 1.30492508, 1.02112567},
                    10.8815671,
                    0.0633450821,
                    0.0320412628,
                    2.96569568});
}

TEST(TrainTorchParity, ThreeAdamWStepsWithLabelSmoothingEqualPyTorch) {
    expect_matches({OptimizerKind::adamw,
                    0.01f,
                    0.1f,
                    {1.46480048, 1.29475534, 1.1890403},
                    17.5759416,
                    -0.120946832,
                    0.0107775666,
                    2.46825077});
}

TEST(TrainTorchParity, FreshSmallCnnStartsNearLogClasses) {
    // A freshly initialised network predicts nearly uniformly: the loss of the
    // first step on random images is close to ln(10), whatever the batch.
    TrainerConfig c;
    c.plan = plan_network(resolve_model("small-cnn", 10), {1, 28, 28}, 10);
    c.input_dtype = DType::u8;
    c.mean = {127.5f};
    c.std = {74.0f};
    c.max_batch = 64;
    c.cpu_threads = 2;
    auto t = make_trainer(c);
    std::vector<std::uint8_t> x(64 * 784);
    std::vector<std::int32_t> y(64);
    for (std::size_t i = 0; i < x.size(); ++i) x[i] = static_cast<std::uint8_t>((i * 2654435761u) >> 24);
    for (std::size_t i = 0; i < y.size(); ++i) y[i] = static_cast<std::int32_t>(i % 10);
    t->train_step(step_batch(t->config(), x.data(), y.data(), 64));
    EXPECT_NEAR(t->take_train_metrics().loss(), std::log(10.0), 0.35);
}
