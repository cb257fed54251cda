// Spec parser, presets, network planning, optimisers, schedules, state blobs.
#include <gtest/gtest.h>

#include <cmath>

#include "dstk/error.hpp"
#include "dstk/train/model.hpp"
#include "dstk/train/optimizer.hpp"
#include "dstk/train/trainer.hpp"

using namespace dstk;
using namespace dstk::train;

TEST(TrainSpec, ParsesEveryLayerAndRoundTrips) {
    const std::string text = "conv5x5:16:s2:p1:bias,bn,relu,maxpool3:s2,avgpool2,res(conv3x3:16,bn,relu),gap,"
                             "flatten,dropout:0.25,fc:32:nobias,fc:10";
    const ModelSpec m = parse_model_spec(text);
    ASSERT_EQ(m.layers.size(), 15u);
    EXPECT_EQ(m.layers[0].kind, LayerKind::conv);
    EXPECT_EQ(m.layers[0].kernel, 5u);
    EXPECT_EQ(m.layers[0].stride, 2u);
    EXPECT_EQ(m.layers[0].padding, 1u);
    EXPECT_TRUE(m.layers[0].bias);
    EXPECT_EQ(m.layers[3].stride, 2u);
    EXPECT_EQ(m.layers[5].kind, LayerKind::residual_begin);
    EXPECT_EQ(m.layers[9].kind, LayerKind::residual_end);
    EXPECT_FLOAT_EQ(m.layers[12].drop, 0.25f);
    EXPECT_FALSE(m.layers[13].bias);
    EXPECT_TRUE(m.layers[14].bias);
    EXPECT_EQ(to_spec_string(m), text);
    EXPECT_EQ(parse_model_spec(to_spec_string(m)).layers, m.layers);
}

TEST(TrainSpec, DropoutProbabilityRoundTripsExactly) {
    // Found by fuzz_model_spec: six significant digits lost the float and the spec no longer round-tripped.
    const ModelSpec m = parse_model_spec("dropout:0.5333333333333333333333333,fc:10");
    EXPECT_EQ(parse_model_spec(to_spec_string(m)).layers, m.layers);
    EXPECT_EQ(parse_model_spec("dropout:0.1").layers[0].drop, 0.1f);
    EXPECT_EQ(to_spec_string(parse_model_spec("dropout:0.1")), "dropout:0.1");
}

TEST(TrainSpec, RejectsMalformedSpecsWithUsageErrors) {
    for (const char* bad : {"",
                            ",",
                            "conv3x3",
                            "conv3x4:8",
                            "conv3x3:0",
                            "conv3x3:8:q",
                            "fc",
                            "fc:-1",
                            "fc:10:bias",
                            "dropout:1",
                            "dropout:0.99999999999",
                            "dropout:x",
                            "res(relu",
                            "relu)",
                            "res()",
                            "relu,,relu",
                            "relu,",
                            "maxpool",
                            "maxpool2:t3",
                            "bogus",
                            "relu:1",
                            "foo(relu)",
                            "conv3x3:8:p3",
                            "conv99999999x99999999:1"}) {
        try {
            parse_model_spec(bad);
            ADD_FAILURE() << "accepted '" << bad << "'";
        } catch (const Error& e) {
            EXPECT_EQ(e.code(), ExitCode::usage) << bad;
            EXPECT_NE(std::string(e.what()).find("model spec"), std::string::npos) << e.what();
        }
    }
}

TEST(TrainSpec, RefCnnIsExactlyAsSpecified) {
    const ModelSpec m = resolve_model("ref-cnn", 10);
    EXPECT_EQ(to_spec_string(m), "conv3x3:32,bn,relu,conv3x3:32,bn,relu,maxpool2,conv3x3:64,bn,relu,conv3x3:64,bn,"
                                 "relu,maxpool2,conv3x3:128,bn,relu,maxpool2,flatten,fc:256,relu,fc:10");
    const NetworkPlan p = plan_network(m, {3, 32, 32}, 10);
    // conv weights (no bias) + BN gamma/beta + fc weights and biases
    const std::uint64_t conv = 32 * 3 * 9 + 32 * 32 * 9 + 64 * 32 * 9 + 64 * 64 * 9 + 128 * 64 * 9;
    const std::uint64_t bn = 2 * (32 + 32 + 64 + 64 + 128);
    const std::uint64_t fc = 2048 * 256 + 256 + 256 * 10 + 10;
    EXPECT_EQ(p.params, conv + bn + fc);
    EXPECT_EQ(p.layers.back().out, (TensorShape{10, 1, 1}));
    EXPECT_EQ(p.layers[0].spec.padding, 1u);
    EXPECT_FALSE(p.layers[0].spec.bias);
}

TEST(TrainSpec, PresetsPlanForTheirInputs) {
    EXPECT_EQ(plan_network(resolve_model("small-cnn", 10), {1, 28, 28}, 10).layers.back().out.c, 10u);
    const NetworkPlan r = plan_network(resolve_model("resnet9", 10), {3, 32, 32}, 10);
    EXPECT_GT(r.params, 6'000'000u);
    const NetworkPlan m = plan_network(resolve_model("mlp:1024,512", 4), {20, 1, 1}, 4);
    EXPECT_EQ(m.params, 20u * 1024 + 1024 + 1024u * 512 + 512 + 512u * 4 + 4);
    EXPECT_EQ(resolve_model("mlp", 4).layers, resolve_model("mlp:1024,512", 4).layers);
    // Input channels follow the dataset.
    EXPECT_EQ(plan_network(resolve_model("ref-cnn", 10), {1, 32, 32}, 10).layers[0].param_count, 32u * 9);
}

// The matrix products' operations per sample, counted by hand: 2 per
// multiply-add; a training step runs each product's forward, weight gradient
// and, where a gradient flows into its input, data gradient.
TEST(TrainSpec, CountsTheMatrixProductsFlops) {
    const NetworkPlan p = plan_network(resolve_model("ref-cnn", 10), {3, 32, 32}, 10);
    const std::uint64_t first = 1024ull * 32 * 3 * 9; // reads the input: no data gradient
    const std::uint64_t rest = 1024ull * 32 * 32 * 9 + 256ull * 64 * 32 * 9 + 256ull * 64 * 64 * 9 +
                               64ull * 128 * 64 * 9 + 2048ull * 256 + 256ull * 10;
    EXPECT_EQ(p.forward_flops(), 2 * (first + rest));
    EXPECT_EQ(p.training_flops(), 2 * (2 * first + 3 * rest));
    // The figure for ref-cnn: about 178 MFLOP per trained sample.
    EXPECT_NEAR(static_cast<double>(p.training_flops()) / 1e6, 176.6, 0.1);
    // resnet9: its residual branches' products (4x4 and 16x16) counted too.
    const NetworkPlan r = plan_network(resolve_model("resnet9", 10), {3, 32, 32}, 10);
    const std::uint64_t r_first = 1024ull * 64 * 27;
    const std::uint64_t r_rest = 1024ull * 128 * 64 * 9 + 2 * 256ull * 128 * 128 * 9 + 256ull * 256 * 128 * 9 +
                                 64ull * 512 * 256 * 9 + 2 * 16ull * 512 * 512 * 9 + 512ull * 10;
    EXPECT_EQ(r.training_flops(), 2 * (2 * r_first + 3 * r_rest));
    // An MLP: the first product reads the flattened input (no data gradient);
    // a batch norm on the input has parameters, so the product after it needs one.
    const NetworkPlan m = plan_network(resolve_model("mlp:16", 4), {20, 1, 1}, 4);
    EXPECT_EQ(m.training_flops(), 2 * (2 * 20 * 16 + 3 * 16 * 4));
    const NetworkPlan b = plan_network(parse_model_spec("flatten,bn,fc:4"), {20, 1, 1}, 4);
    EXPECT_EQ(b.training_flops(), 2 * 3 * 20 * 4);
    EXPECT_EQ(b.forward_flops(), 2 * 20 * 4);
}

TEST(TrainSpec, PlanRejectsMismatchedNetworks) {
    auto plan_code = [](const char* spec, TensorShape in, std::uint32_t classes) {
        try {
            plan_network(parse_model_spec(spec), in, classes);
        } catch (const Error& e) {
            return e.code();
        }
        return ExitCode::ok;
    };
    EXPECT_EQ(plan_code("flatten,fc:10", {3, 4, 4}, 10), ExitCode::ok);
    EXPECT_EQ(plan_code("flatten,fc:9", {3, 4, 4}, 10), ExitCode::usage); // logits width
    EXPECT_EQ(plan_code("fc:10", {3, 4, 4}, 10), ExitCode::usage);        // fc on an image
    EXPECT_EQ(plan_code("maxpool8,flatten,fc:10", {3, 4, 4}, 10), ExitCode::usage);
    EXPECT_EQ(plan_code("res(conv3x3:4),flatten,fc:10", {3, 4, 4}, 10), ExitCode::usage); // shape change
    EXPECT_EQ(plan_code("conv5x5:4:p0,flatten,fc:10", {1, 3, 3}, 10), ExitCode::usage);
    EXPECT_EQ(tensor_shape_from(parse_shape("784")), (TensorShape{784, 1, 1}));
    EXPECT_EQ(tensor_shape_from(parse_shape("28x28")), (TensorShape{1, 28, 28}));
}

TEST(TrainOptimizer, SgdMatchesPyTorchFormula) {
    OptimizerConfig o;
    o.momentum = 0.9f;
    o.weight_decay = 0.1f;
    o.nesterov = false;
    std::vector<float> p{1.0f}, g{0.5f}, m{0.0f};
    sgd_update(o, 0.1f, p, g, m); // g' = 0.5 + 0.1 = 0.6; m = 0.6; p = 1 - 0.06
    EXPECT_FLOAT_EQ(m[0], 0.6f);
    EXPECT_FLOAT_EQ(p[0], 0.94f);
    sgd_update(o, 0.1f, p, g, m); // g' = 0.5 + 0.094 = 0.594; m = 0.54 + 0.594 = 1.134
    EXPECT_NEAR(m[0], 1.134f, 1e-6);
    EXPECT_NEAR(p[0], 0.94f - 0.1134f, 1e-6);
    o.nesterov = true;
    std::vector<float> q{1.0f}, mq{0.0f};
    sgd_update(o, 0.1f, q, g, mq); // step = g' + mu*m = 0.6 + 0.54
    EXPECT_NEAR(q[0], 1.0f - 0.1f * 1.14f, 1e-6);
}

TEST(TrainOptimizer, AdamWFirstStepIsSignTimesLr) {
    OptimizerConfig o;
    o.kind = OptimizerKind::adamw;
    o.weight_decay = 0.01f;
    std::vector<float> p{2.0f, -1.0f}, g{0.3f, -4.0f}, m(2), v(2);
    adamw_update(o, 0.01f, 1, p, g, m, v);
    // Bias-corrected first step: m_hat / sqrt(v_hat) = sign(g); decay first.
    EXPECT_NEAR(p[0], 2.0f * (1 - 0.01f * 0.01f) - 0.01f, 1e-5);
    EXPECT_NEAR(p[1], -1.0f * (1 - 0.01f * 0.01f) + 0.01f, 1e-5);
}

TEST(TrainSchedule, WarmupCosineAndStep) {
    OptimizerConfig o;
    o.lr = 1.0f;
    ScheduleConfig s;
    s.kind = ScheduleKind::cosine;
    s.total_steps = 110;
    s.warmup_steps = 10;
    EXPECT_FLOAT_EQ(learning_rate(o, s, 0), 0.1f);
    EXPECT_FLOAT_EQ(learning_rate(o, s, 9), 1.0f);
    EXPECT_FLOAT_EQ(learning_rate(o, s, 10), 1.0f);
    EXPECT_NEAR(learning_rate(o, s, 60), 0.5f, 1e-6);
    EXPECT_NEAR(learning_rate(o, s, 110), 0.0f, 1e-6);
    s = {};
    s.kind = ScheduleKind::step;
    s.step_every = 5;
    s.gamma = 0.5f;
    EXPECT_FLOAT_EQ(learning_rate(o, s, 4), 1.0f);
    EXPECT_FLOAT_EQ(learning_rate(o, s, 5), 0.5f);
    EXPECT_FLOAT_EQ(learning_rate(o, s, 12), 0.25f);
    s.kind = ScheduleKind::constant;
    EXPECT_FLOAT_EQ(learning_rate(o, s, 1000), 1.0f);
    EXPECT_EQ(parse_schedule("cosine"), ScheduleKind::cosine);
    EXPECT_THROW(parse_optimizer("adam"), Error);
}

TEST(TrainDevice, ParsesDevicesAndPrecisions) {
    EXPECT_EQ(parse_device("cpu").backend, Backend::cpu);
    EXPECT_EQ(parse_device("cuda:1").index, 1);
    EXPECT_EQ(parse_device("cuda").backend, Backend::cuda);
    for (const char* bad : {"gpu", "cuda:", "cuda:x", "cuda:-1", "cuda:123456"})
        EXPECT_THROW(parse_device(bad), Error) << bad;
    EXPECT_EQ(parse_precision("bf16"), Precision::bf16);
    EXPECT_THROW(parse_precision("fp16"), Error);
}
