// Learning with a known answer, on the CPU in seconds:
// - neuroscience-shaped: 12 simulated neurons whose Poisson rates are a known
//   function of an 8-value stimulus; a Poisson model's NLL on held-out
//   samples comes within 2% of the NLL of the true rates, and its explained
//   deviance near theirs;
// - chess-shaped: a policy head (the square of the one piece on the first of
//   12 planes) and a tanh value head (the sign of a piece count difference,
//   stored as i8) on one trunk, both learnt together.
#include <gtest/gtest.h>

#include <cmath>

#include "dstk/rng.hpp"
#include "dstk/train/trainer.hpp"

using namespace dstk;
using namespace dstk::train;

namespace {

TrainerConfig config(const std::string& spec, TensorShape in, const std::vector<Target>& targets, std::uint32_t batch,
                     float lr) {
    TrainerConfig c;
    c.plan = plan_network(parse_model_spec(spec), in, targets);
    c.input_dtype = DType::f32;
    c.mean.assign(in.c, 0.0f);
    c.std.assign(in.c, 1.0f);
    c.max_batch = batch;
    c.cpu_threads = 2;
    c.seed = 3;
    c.optimizer.kind = OptimizerKind::adamw;
    c.optimizer.lr = lr;
    c.optimizer.weight_decay = 0.0f;
    c.schedule.kind = ScheduleKind::constant;
    return c;
}

double log_factorial(double k) {
    return std::lgamma(k + 1.0);
}

} // namespace

TEST(TrainLearning, PoissonNeuronsComeWithinTwoPercentOfTheTrueRates) {
    constexpr std::uint32_t d = 8, k = 12, hidden = 6, train_n = 8192, test_n = 2048, batch = 128;
    CounterRng rng(17, 1);
    // rate_j(x) = softplus(a_j . tanh(U x) + b_j): U [hidden][d], a [k][hidden], b [k].
    std::vector<double> u(hidden * d), a(k * hidden), b(k);
    for (auto& v : u) v = rng.normal() / std::sqrt(double{d});
    for (auto& v : a) v = rng.normal();
    for (auto& v : b) v = rng.uniform(0.0, 1.0);
    const std::uint32_t n = train_n + test_n;
    std::vector<float> x(std::uint64_t{n} * d), y(std::uint64_t{n} * k);
    std::vector<double> rate(y.size());
    for (std::uint32_t s = 0; s < n; ++s) {
        for (std::uint32_t i = 0; i < d; ++i) x[s * d + i] = static_cast<float>(rng.normal());
        double h[hidden];
        for (std::uint32_t j = 0; j < hidden; ++j) {
            double acc = 0;
            for (std::uint32_t i = 0; i < d; ++i) acc += u[j * d + i] * x[s * d + i];
            h[j] = std::tanh(acc);
        }
        for (std::uint32_t j = 0; j < k; ++j) {
            double z = b[j];
            for (std::uint32_t i = 0; i < hidden; ++i) z += a[j * hidden + i] * h[i];
            const double r = std::log1p(std::exp(z));
            rate[s * k + j] = r;
            // Poisson draw by inversion (rates are small).
            double p = std::exp(-r), cdf = p, uu = rng.uniform(0.0, 1.0);
            std::uint32_t c = 0;
            while (uu > cdf && c < 100) p *= r / ++c, cdf += p;
            y[s * k + j] = static_cast<float>(c);
        }
    }
    const Target t{"robs", DType::f32, Shape{{k}}, LossKind::poisson, k};
    const TrainerConfig c = config("flatten,fc:32,tanh,fc:12", {d, 1, 1}, {t}, batch, 0.01f);
    auto tr = make_trainer(c);
    for (int epoch = 0; epoch < 6; ++epoch)
        for (std::uint32_t s = 0; s + batch <= train_n; s += batch)
            tr->train_step(step_batch(c, x.data() + std::uint64_t{s} * d, y.data() + std::uint64_t{s} * k, batch));
    // Held-out NLL (with log y!) of the model's rates and of the true ones.
    double model_nll = 0, true_nll = 0;
    for (std::uint32_t s = train_n; s < n; s += batch) {
        tr->evaluate(step_batch(c, x.data() + std::uint64_t{s} * d, y.data() + std::uint64_t{s} * k, batch));
        const auto z = tr->read_activation(c.plan.heads[0].output);
        for (std::uint32_t e = 0; e < batch * k; ++e) {
            const double yy = y[std::uint64_t{s} * k + e], r = std::log1p(std::exp(double{z[e]}));
            const double rt = rate[std::uint64_t{s} * k + e];
            model_nll += r - yy * std::log(r) + log_factorial(yy);
            true_nll += rt - yy * std::log(rt) + log_factorial(yy);
        }
    }
    const Metrics m = tr->take_eval_metrics();
    std::printf("poisson: held-out NLL %.5f (true rates %.5f, +%.2f%%), explained deviance %.3f\n",
                model_nll / (test_n * k), true_nll / (test_n * k), 100 * (model_nll / true_nll - 1),
                m.heads[0].explained());
    EXPECT_LE(model_nll, 1.02 * true_nll);
    EXPECT_GT(m.heads[0].explained(), 0.2);
    EXPECT_GT(m.heads[0].pearson(), 0.4);
}

TEST(TrainLearning, ChessShapedPolicyAndValueHeadsLearnTogether) {
    constexpr std::uint32_t planes = 12, squares = 64, train_n = 4096, test_n = 512, batch = 64;
    const std::uint32_t n = train_n + test_n, per = planes * squares;
    CounterRng rng(23, 2);
    std::vector<float> pos(std::uint64_t{n} * per, 0.0f);
    std::vector<std::int32_t> moves(n);
    std::vector<std::int8_t> results(n);
    for (std::uint32_t s = 0; s < n; ++s) {
        float* p = pos.data() + std::uint64_t{s} * per;
        moves[s] = static_cast<std::int32_t>(rng.below(squares)); // the policy: the square of the piece on plane 0
        p[moves[s]] = 1.0f;
        int count[planes] = {};
        for (std::uint32_t pl = 1; pl < planes; ++pl)
            for (std::uint32_t q = 0; q < squares; ++q)
                if (rng.below(16) == 0) p[pl * squares + q] = 1.0f, ++count[pl];
        // The value: which side has more pieces on planes 1 and 7.
        results[s] = static_cast<std::int8_t>((count[1] > count[7]) - (count[1] < count[7]));
    }
    const std::vector<Target> targets{{"moves", DType::i32, Shape{}, LossKind::ce, squares},
                                      {"results", DType::i8, Shape{}, LossKind::mse, 1}};
    const std::string spec = "conv3x3:16,relu,flatten,fc:64,relu,heads(policy=fc:64>ce:moves, "
                             "value=fc:16,relu,fc:1,tanh>mse:results)";
    const TrainerConfig c = config(spec, {planes, 8, 8}, targets, batch, 0.002f);
    auto tr = make_trainer(c);
    auto at = [&](std::uint32_t s) {
        const void* data[] = {pos.data() + std::uint64_t{s} * per, moves.data() + s, results.data() + s};
        return step_batch(c, data, batch);
    };
    for (int epoch = 0; epoch < 4; ++epoch)
        for (std::uint32_t s = 0; s + batch <= train_n; s += batch) tr->train_step(at(s));
    for (std::uint32_t s = train_n; s < n; s += batch) tr->evaluate(at(s));
    const Metrics m = tr->take_eval_metrics();
    ASSERT_EQ(m.heads.size(), 2u);
    std::printf("chess-shaped: policy accuracy %.3f (top-5 %.3f), value R2 %.3f, r %.3f\n", m.heads[0].accuracy(),
                m.heads[0].top5_accuracy(), m.heads[1].r2(), m.heads[1].pearson());
    EXPECT_GT(m.heads[0].accuracy(), 0.9);
    EXPECT_GT(m.heads[1].r2(), 0.5);
}
