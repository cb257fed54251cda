// Heads, targets and side inputs: the spec grammar of heads(...) and "side",
// the planning of heads (sources, outputs, widths), the resolution of a model
// against the data's fields (default losses, checks that name the fix, the
// side input's place), the losses' values against hand computations, and the
// metrics' formulas.
#include <gtest/gtest.h>

#include <cmath>
#include <functional>
#include <limits>
#include <map>

#include "dstk/error.hpp"
#include "dstk/train/model.hpp"
#include "dstk/train/trainer.hpp"
#include "support/error_of.hpp"

using namespace dstk;
using namespace dstk::train;
using test_support::code_of;
using test_support::error_of;

namespace {

Target ce(const std::string& field, std::uint32_t classes) {
    return {field, DType::i32, Shape{}, LossKind::ce, classes};
}
Target values(const std::string& field, LossKind loss, std::uint32_t width) {
    return {field, DType::f32, Shape{{width}}, loss, width};
}

// A dataset's fields for resolve_model: x f32[3,8,8], y i32 (10 classes), robs f32[12], counts u8[12],
// moves i32, results i8, behavior f32[4].
const std::map<std::string, FieldFacts> fields{
    {"x", {DType::f32, Shape{{3, 8, 8}}, std::nullopt}}, {"y", {DType::i32, Shape{}, 10u}},
    {"robs", {DType::f32, Shape{{12}}, std::nullopt}},   {"counts", {DType::u8, Shape{{12}}, std::nullopt}},
    {"moves", {DType::i32, Shape{}, std::nullopt}},      {"results", {DType::i8, Shape{}, std::nullopt}},
    {"behavior", {DType::f32, Shape{{4}}, std::nullopt}}};

ResolvedModel resolve(const std::string& model, const std::string& label = "y", std::optional<LossKind> loss = {},
                      const std::string& side = "") {
    ModelRequest r;
    r.model = model;
    r.input = "x";
    r.label = label;
    r.loss = loss;
    r.side = side;
    r.fields_known = "x, y, robs, counts, moves, results, behavior";
    return resolve_model(r, [](const std::string& f) -> std::optional<FieldFacts> {
        const auto it = fields.find(f);
        if (it == fields.end()) return std::nullopt;
        return it->second;
    });
}

} // namespace

TEST(TrainHeads, ParsesHeadsAndRoundTrips) {
    const ModelSpec m = parse_model_spec(
        "conv3x3:8,relu,flatten,fc:16,relu,heads(policy=fc:5>ce:moves, value=fc:1,tanh>mse:results*0.5,  raw=>y)");
    ASSERT_EQ(m.heads.size(), 3u);
    EXPECT_EQ(m.heads[0], (HeadSpec{"policy", "moves", LossKind::ce, 1.0f}));
    EXPECT_EQ(m.heads[1], (HeadSpec{"value", "results", LossKind::mse, 0.5f}));
    EXPECT_EQ(m.heads[2], (HeadSpec{"raw", "y", std::nullopt, 1.0f}));
    EXPECT_EQ(m.layers[5].kind, LayerKind::head);
    EXPECT_EQ(m.layers[7].kind, LayerKind::head);
    EXPECT_EQ(m.layers[9].kind, LayerKind::tanh);
    EXPECT_EQ(m.layers.back().kind, LayerKind::head); // raw: no layers of its own
    const std::string canon = to_spec_string(m);
    EXPECT_EQ(canon, "conv3x3:8,relu,flatten,fc:16,relu,heads(policy=fc:5>ce:moves,value=fc:1,tanh>mse:results*0.5,"
                     "raw=>y)");
    const ModelSpec again = parse_model_spec(canon);
    EXPECT_EQ(again.layers, m.layers);
    EXPECT_EQ(again.heads, m.heads);
    EXPECT_EQ(to_spec_string(parse_model_spec("heads(a=flatten,res(fc:3,relu),fc:2>bce:y)")),
              "heads(a=flatten,res(fc:3,relu),fc:2>bce:y)");
    EXPECT_EQ(to_spec_string(parse_model_spec("flatten,side,fc:3")), "flatten,side,fc:3");
}

TEST(TrainHeads, RejectsMalformedHeadsWithUsageErrors) {
    for (const char* bad : {"heads(",
                            "heads()",
                            "heads(a=fc:2)",
                            "heads(a=fc:2>)",
                            "heads(a=fc:2>y*0)",
                            "heads(a=fc:2>y*x)",
                            "heads(a=fc:2>bogus:y)",
                            "heads(a=fc:2>y,a=fc:2>y)",
                            "relu,heads(a=fc:2>y),relu",
                            "res(heads(a=>y))",
                            "heads(a=heads(b=>y)>y)",
                            "side,side",
                            "res(side)",
                            "heads(a=side>y)",
                            "heads(a b=>y)",
                            "heads(=fc:2>y)",
                            "heads(a=fc:2>y:z)",
                            "heads(a=fc:2>y)x",
                            "relu>fc:2",
                            "heads(a=fc:2,>y)"}) {
        const auto parse = [&] { parse_model_spec(bad); };
        EXPECT_EQ(code_of(parse), ExitCode::usage) << bad;
        EXPECT_NE(error_of(parse).find("model spec"), std::string::npos) << bad << ": " << error_of(parse);
    }
}

TEST(TrainHeads, PlansHeadsOnTheTrunksOutput) {
    const ModelSpec m =
        parse_model_spec("flatten,fc:16,relu,side,heads(policy=fc:5>ce:moves, value=fc:1,tanh>mse:results*2)");
    const NetworkPlan p = plan_network(m, {3, 2, 2}, {ce("moves", 5), values("results", LossKind::mse, 1)}, 4);
    ASSERT_EQ(p.heads.size(), 2u);
    EXPECT_EQ(p.trunk_end(), 3); // the side layer
    EXPECT_EQ(p.layers[3].out, (TensorShape{20, 1, 1}));
    EXPECT_EQ(p.heads[0].begin, 4);
    EXPECT_EQ(p.heads[0].output, 5u);
    EXPECT_EQ(p.heads[1].begin, 6);
    EXPECT_EQ(p.heads[1].output, 8u);
    EXPECT_EQ(p.layers[6].source, 3);
    EXPECT_EQ(p.layers[6].in, (TensorShape{20, 1, 1}));
    EXPECT_EQ(p.layers[7].source, 6);
    EXPECT_FLOAT_EQ(p.heads[1].weight, 2.0f);
    EXPECT_EQ(p.params, (12u * 16 + 16) + (20u * 5 + 5) + (20u + 1));
    // Without heads(...): one head, the whole network.
    const NetworkPlan one =
        plan_network(parse_model_spec("flatten,fc:12"), {3, 1, 1}, {values("robs", LossKind::poisson, 12)});
    EXPECT_EQ(one.heads[0].begin, -1);
    EXPECT_EQ(one.heads[0].output, 1u);
    EXPECT_EQ(one.trunk_end(), -1);
    // A ce head of unknown classes takes the network's width.
    EXPECT_EQ(plan_network(parse_model_spec("flatten,fc:7"), {3, 1, 1}, {ce("moves", 0)}).heads[0].target.width, 7u);
}

TEST(TrainHeads, PlanRejectsHeadsThatDoNotFitTheirTargets) {
    const auto msg = [](const char* spec, const std::vector<Target>& t, std::uint32_t side = 0) {
        return error_of([&] { plan_network(parse_model_spec(spec), {3, 4, 4}, t, side); });
    };
    EXPECT_NE(msg("flatten,fc:5", {values("robs", LossKind::mse, 12)}).find("end with 'fc:12'"), std::string::npos);
    EXPECT_NE(msg("conv3x3:4", {values("robs", LossKind::mse, 64)}).find("flatten, gap or fc"), std::string::npos);
    EXPECT_NE(msg("flatten,fc:1", {ce("y", 0)}).find("2 or more classes"), std::string::npos);
    EXPECT_NE(msg("flatten,side,fc:2", {ce("y", 2)}).find("no side input"), std::string::npos);
    EXPECT_NE(msg("side,flatten,fc:2", {ce("y", 2)}, 3).find("after flatten, gap or fc"), std::string::npos);
    EXPECT_NE(msg("flatten,heads(a=fc:2>ce:y, b=fc:3>mse:robs)", {ce("y", 2), values("robs", LossKind::mse, 12)})
                  .find("head 'b'"),
              std::string::npos);
}

TEST(TrainHeads, ResolvesLossesByDtypeAndPresetsByTarget) {
    const ResolvedModel cls = resolve("small-cnn");
    EXPECT_EQ(cls.targets[0], ce("y", 10));
    EXPECT_EQ(cls.spec.layers.back().out, 10u);
    const ResolvedModel reg = resolve("mlp:32", "robs");
    EXPECT_EQ(reg.targets[0].loss, LossKind::mse);
    EXPECT_EQ(reg.targets[0].width, 12u);
    EXPECT_EQ(to_spec_string(reg.spec), "flatten,fc:32,relu,fc:12");
    EXPECT_EQ(resolve("mlp:32", "counts", LossKind::poisson).targets[0].dtype, DType::u8);
    // Integers of one value per sample are classes; i8 results too, unless a loss says otherwise.
    EXPECT_EQ(resolve("flatten,fc:3", "results").targets[0].loss, LossKind::ce);
    EXPECT_EQ(resolve("flatten,fc:1", "results", LossKind::mse).targets[0].width, 1u);
    const ResolvedModel two = resolve("flatten,fc:8,heads(policy=fc:6>moves, value=fc:1,tanh>mse:results)");
    ASSERT_EQ(two.targets.size(), 2u);
    EXPECT_EQ(two.targets[0], ce("moves", 0));
    EXPECT_EQ(two.spec.heads[0].loss, LossKind::ce); // resolved into the spec: the saved spec says it
    EXPECT_EQ(two.targets[1].dtype, DType::i8);
}

TEST(TrainHeads, ResolveErrorsNameTheFix) {
    const auto msg = [](const std::function<void()>& f) {
        EXPECT_EQ(code_of(f), ExitCode::usage);
        return error_of(f);
    };
    EXPECT_NE(msg([] { resolve("mlp", "robs", LossKind::ce); }).find("choose mse"), std::string::npos);
    EXPECT_NE(msg([] { resolve("mlp", "nope"); }).find("fields: x, y, robs"), std::string::npos);
    EXPECT_NE(msg([] { resolve("mlp", "x"); }).find("is the input field"), std::string::npos);
    EXPECT_NE(msg([] { resolve("mlp", "moves"); }).find("no class count"), std::string::npos);
    EXPECT_NE(msg([] { resolve("flatten,heads(a=fc:2>y)", "y", LossKind::mse); }).find("give each head its loss"),
              std::string::npos);
    EXPECT_NE(msg([] { resolve("flatten,fc:10", "y", {}, "y"); }).find("also a target"), std::string::npos);
    EXPECT_NE(msg([] { resolve("flatten,fc:10", "y", {}, "nope"); }).find("side input 'nope'"), std::string::npos);
    EXPECT_NE(msg([] { resolve("flatten", "", {}); }).find("name the label"), std::string::npos);
    EXPECT_NE(msg([] { resolve("conv3x3:4,gap", "y", {}, "behavior"); }).find("place 'side'"), std::string::npos);
}

TEST(TrainHeads, PlacesTheSideInputBeforeTheHeads) {
    EXPECT_EQ(to_spec_string(resolve("flatten,fc:8,relu,fc:10", "y", {}, "behavior").spec),
              "flatten,fc:8,relu,side,fc:10");
    EXPECT_EQ(to_spec_string(resolve("flatten,fc:8,heads(a=fc:10>ce:y)", "y", {}, "behavior").spec),
              "flatten,fc:8,side,heads(a=fc:10>ce:y)");
    EXPECT_EQ(to_spec_string(resolve("flatten,side,fc:8,relu,fc:10", "y", {}, "behavior").spec),
              "flatten,side,fc:8,relu,fc:10"); // where the spec says
    EXPECT_EQ(resolve("flatten,fc:10", "y", {}, "behavior").side, 4u);
}

namespace {

// One sample through "flatten,fc:K:nobias" with the identity as weights: the
// loss of outputs z against targets y, from the trainer's evaluation.
Metrics eval_metrics(LossKind loss, const std::vector<float>& z, const void* y, DType ydtype) {
    const auto k = static_cast<std::uint32_t>(z.size());
    TrainerConfig c;
    Target t{"t", ydtype, loss == LossKind::ce ? Shape{} : Shape{{k}}, loss, k};
    c.plan = plan_network(parse_model_spec("flatten,fc:" + std::to_string(k) + ":nobias"), {k, 1, 1}, {t});
    c.mean.assign(k, 0.0f);
    c.std.assign(k, 1.0f);
    c.max_batch = 1;
    c.cpu_threads = 1;
    auto tr = make_trainer(c);
    std::vector<float> w(std::uint64_t{k} * k, 0.0f);
    for (std::uint32_t i = 0; i < k; ++i) w[i * k + i] = 1.0f;
    tr->write_parameters(w);
    tr->evaluate(step_batch(c, z.data(), y, 1));
    return tr->take_eval_metrics();
}
double eval_loss(LossKind loss, const std::vector<float>& z, const void* y, DType ydtype) {
    return eval_metrics(loss, z, y, ydtype).loss();
}

} // namespace

// The losses' values against hand computations of PyTorch's formulas.
TEST(TrainHeads, LossValuesMatchTheirFormulas) {
    const std::vector<float> z{0.5f, -1.0f, 2.0f};
    const float y[] = {2.0f, 0.0f, 1.0f};
    const double rate[] = {std::log1p(std::exp(0.5)), std::log1p(std::exp(-1.0)), std::log1p(std::exp(2.0))};
    EXPECT_NEAR(eval_loss(LossKind::mse, z, y, DType::f32), (2.25 + 1.0 + 1.0) / 3, 1e-6);
    EXPECT_NEAR(eval_loss(LossKind::poisson, z, y, DType::f32),
                ((rate[0] - 2 * std::log(rate[0])) + rate[1] + (rate[2] - std::log(rate[2]))) / 3, 1e-6);
    EXPECT_NEAR(eval_loss(LossKind::poisson_exp, z, y, DType::f32),
                ((std::exp(0.5) - 1.0) + std::exp(-1.0) + (std::exp(2.0) - 2.0)) / 3, 1e-5);
    const float bits[] = {1.0f, 0.0f, 1.0f};
    EXPECT_NEAR(eval_loss(LossKind::bce, z, bits, DType::f32),
                (std::log1p(std::exp(-0.5)) + std::log1p(std::exp(-1.0)) + std::log1p(std::exp(-2.0))) / 3, 1e-6);
    const std::int32_t label = 2;
    const double lse = std::log(std::exp(0.5) + std::exp(-1.0) + std::exp(2.0));
    EXPECT_NEAR(eval_loss(LossKind::ce, z, &label, DType::i32), lse - 2.0, 1e-6);
    // Targets of other dtypes are widened to float: u8 counts, bf16 values.
    const std::uint8_t counts[] = {2, 0, 1};
    EXPECT_NEAR(eval_loss(LossKind::poisson, z, counts, DType::u8), eval_loss(LossKind::poisson, z, y, DType::f32),
                1e-7);
    const std::uint16_t b16[] = {float_to_bf16(2.0f), float_to_bf16(0.0f), float_to_bf16(1.0f)};
    EXPECT_NEAR(eval_loss(LossKind::mse, z, b16, DType::bf16), (2.25 + 1.0 + 1.0) / 3, 1e-6);
    const std::int8_t cls = 2;
    EXPECT_NEAR(eval_loss(LossKind::ce, z, &cls, DType::i8), lse - 2.0, 1e-6);
}

TEST(TrainHeads, MetricsFormulas) {
    // One output, 4 samples: y = 1, 2, 3, 4; p = 1.5, 1.5, 3.5, 3.5.
    HeadMetrics m;
    m.kind = LossKind::mse;
    m.width = 1;
    m.samples = 4;
    m.sums.assign(HeadMetrics::rows, 0.0);
    const double y[] = {1, 2, 3, 4}, p[] = {1.5, 1.5, 3.5, 3.5};
    for (int i = 0; i < 4; ++i) {
        m.sums[HeadMetrics::row_y] += y[i];
        m.sums[HeadMetrics::row_yy] += y[i] * y[i];
        m.sums[HeadMetrics::row_p] += p[i];
        m.sums[HeadMetrics::row_pp] += p[i] * p[i];
        m.sums[HeadMetrics::row_py] += p[i] * y[i];
        m.sums[HeadMetrics::row_ylogy] += y[i] * std::log(y[i]);
        m.sums[HeadMetrics::row_loss] += p[i] - y[i] * std::log(p[i]);
    }
    EXPECT_NEAR(m.r2(), 1.0 - 1.0 / 5.0, 1e-12);           // SSE 1, SST 5
    EXPECT_NEAR(m.pearson(), 2.0 / std::sqrt(5.0), 1e-12); // cov 2, var(y) 5, var(p) 4 (over n)
    EXPECT_TRUE(std::isnan(m.explained()));                // not a Poisson head
    m.kind = LossKind::poisson;
    double d_model = 0, d_null = 0;
    for (int i = 0; i < 4; ++i) {
        d_model += 2 * (y[i] * std::log(y[i] / p[i]) - (y[i] - p[i]));
        d_null += 2 * (y[i] * std::log(y[i] / 2.5) - (y[i] - 2.5));
    }
    EXPECT_NEAR(m.explained(), 1.0 - d_model / d_null, 1e-12);
    // Outputs whose target never varies are left out of the mean; none left: NaN.
    m.sums.assign(HeadMetrics::rows, 4.0);
    EXPECT_TRUE(std::isnan(m.r2()));
    // Sums over ranks.
    Metrics a{4, 2.0, {m}}, b = a;
    a.add(b);
    EXPECT_EQ(a.samples, 8u);
    EXPECT_EQ(a.heads[0].sums[0], 8.0);
    Metrics c = b;
    auto packed = a.pack();
    c.unpack(packed);
    EXPECT_EQ(c.heads[0].samples, 8u);
    EXPECT_EQ(c.loss_sum, 4.0);
}

// A NaN or Inf output is never a right prediction: comparisons with NaN are
// false, which ranked the label first (a model gone to NaN scored 100%).
TEST(TrainHeads, NonFiniteOutputsAreNeverRight) {
    const float nan = std::numeric_limits<float>::quiet_NaN(), inf = std::numeric_limits<float>::infinity();
    const std::int32_t label = 0;
    for (const std::vector<float>& z : {std::vector<float>{nan, nan, nan}, std::vector<float>{1.0f, nan, 0.0f},
                                        std::vector<float>{inf, 0.0f, 0.0f}}) {
        const HeadMetrics m = eval_metrics(LossKind::ce, z, &label, DType::i32).heads[0];
        EXPECT_EQ(m.correct, 0u);
        EXPECT_EQ(m.top5, 0u);
    }
    const std::vector<float> tie{1.0f, 0.5f, 1.0f}; // ties go to the lower class
    EXPECT_EQ(eval_metrics(LossKind::ce, tie, &label, DType::i32).heads[0].correct, 1u);
    // bce: a NaN output is no decision, right neither for 0 nor for 1 (the
    // identity layer spreads one NaN input to every output: 0 x NaN).
    const float bits[] = {0.0f, 1.0f, 0.0f};
    EXPECT_EQ(eval_metrics(LossKind::bce, {nan, 0.0f, 0.0f}, bits, DType::f32).heads[0].correct, 0u);
    EXPECT_EQ(eval_metrics(LossKind::bce, {-1.0f, 1.0f, 1.0f}, bits, DType::f32).heads[0].correct, 2u);
    // mse: one output NaN makes the head's r2 and r NaN, not the other outputs' mean.
    HeadMetrics m;
    m.kind = LossKind::mse;
    m.width = 2;
    m.samples = 4;
    m.sums.assign(std::size_t{HeadMetrics::rows} * 2, 1.0);
    m.sums[HeadMetrics::row_yy * 2] = m.sums[HeadMetrics::row_yy * 2 + 1] = 10.0;
    EXPECT_TRUE(m.finite_predictions());
    m.sums[HeadMetrics::row_p * 2 + 1] = nan;
    EXPECT_FALSE(m.finite_predictions());
    EXPECT_TRUE(std::isnan(m.r2()));
    EXPECT_TRUE(std::isnan(m.pearson()));
}

// bce learns 0 or 1: a label of more than 2 classes is refused when the model
// is resolved (exit 2), any other target value when it is read (exit 1).
TEST(TrainHeads, BceTargetsAreZeroOrOne) {
    EXPECT_EQ(code_of([] { resolve("mlp:8", "y", LossKind::bce); }), ExitCode::usage);
    EXPECT_NE(error_of([] { resolve("mlp:8", "y", LossKind::bce); }).find("has 10 classes (0 to 9)"),
              std::string::npos);
    const float twos[] = {0.0f, 2.0f, 1.0f};
    EXPECT_EQ(code_of([&] { eval_loss(LossKind::bce, {0.5f, -1.0f, 2.0f}, twos, DType::f32); }), ExitCode::failure);
    EXPECT_NE(error_of([&] {
                  eval_loss(LossKind::bce, {0.5f, -1.0f, 2.0f}, twos, DType::f32);
              }).find("target 2 of 't' (output 1) is neither 0 nor 1"),
              std::string::npos);
}
