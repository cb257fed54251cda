// The cpu backend as a whole: the matrix product against a naive one, input
// conversion, determinism across thread counts, state round trips, and a
// small network that learns.
#include <gtest/gtest.h>

#include <cmath>

#include "../../lib/src/train/cpu_ops.hpp"
#include "dstk/error.hpp"
#include "dstk/rng.hpp"
#include "dstk/train/trainer.hpp"

using namespace dstk;
using namespace dstk::train;

TEST(TrainCpu, GemmMatchesNaiveForAllTransposes) {
    CounterRng rng(1, 2);
    for (const auto [m, n, k] :
         {std::array{1, 1, 1}, std::array{7, 33, 300}, std::array{13, 17, 5}, std::array{64, 70, 257}}) {
        std::vector<float> a(static_cast<std::size_t>(m) * k), b(static_cast<std::size_t>(k) * n);
        for (auto& v : a) v = static_cast<float>(rng.normal());
        for (auto& v : b) v = static_cast<float>(rng.normal());
        for (int ta = 0; ta < 2; ++ta)
            for (int tb = 0; tb < 2; ++tb) {
                std::vector<float> c(static_cast<std::size_t>(m) * n, 1.0f);
                cpu::gemm(ta, tb, m, n, k, 0.5f, a.data(), ta ? m : k, b.data(), tb ? k : n, 2.0f, c.data(), n);
                for (int i = 0; i < m; ++i)
                    for (int j = 0; j < n; ++j) {
                        double ref = 2.0;
                        for (int p = 0; p < k; ++p)
                            ref += 0.5 * (ta ? a[p * m + i] : a[i * k + p]) * (tb ? b[j * k + p] : b[p * n + j]);
                        ASSERT_NEAR(c[i * n + j], ref, 1e-4 * (1 + std::abs(ref))) << m << "x" << n << "x" << k;
                    }
            }
    }
}

namespace {

// Learnable toy images: class c brightens quadrant c.
void toy_data(std::uint32_t n, std::vector<std::uint8_t>& x, std::vector<std::int32_t>& y, std::uint64_t seed) {
    CounterRng rng(seed, 3);
    x.resize(std::size_t{n} * 2 * 8 * 8);
    y.resize(n);
    for (std::uint32_t s = 0; s < n; ++s) {
        y[s] = static_cast<std::int32_t>(rng.below(4));
        for (int c = 0; c < 2; ++c)
            for (int i = 0; i < 8; ++i)
                for (int j = 0; j < 8; ++j) {
                    const int quadrant = (i / 4) * 2 + j / 4;
                    const double v = 60 + 40 * rng.normal() + (quadrant == y[s] ? 70 : 0);
                    x[((s * 2 + c) * 8 + i) * 8 + j] = static_cast<std::uint8_t>(std::clamp(v, 0.0, 255.0));
                }
    }
}

TrainerConfig toy_config(const char* spec, unsigned threads, OptimizerKind opt) {
    TrainerConfig c;
    c.plan = plan_network(parse_model_spec(spec), {2, 8, 8}, 4);
    c.input_dtype = DType::u8;
    c.mean = {70.0f, 70.0f};
    c.std = {50.0f, 50.0f};
    c.max_batch = 32;
    c.cpu_threads = threads;
    c.optimizer.kind = opt;
    c.optimizer.lr = opt == OptimizerKind::sgd ? 0.05f : 0.01f;
    c.schedule.kind = ScheduleKind::constant;
    c.seed = 3;
    return c;
}

Metrics train_toy(Trainer& t, int epochs) {
    std::vector<std::uint8_t> x, tx;
    std::vector<std::int32_t> y, ty;
    toy_data(256, x, y, 1);
    toy_data(128, tx, ty, 2);
    for (int e = 0; e < epochs; ++e)
        for (std::uint32_t s = 0; s < 256; s += 32)
            t.train_step(step_batch(t.config(), x.data() + s * 128, y.data() + s, 32));
    for (std::uint32_t s = 0; s < 128; s += 32)
        t.evaluate(step_batch(t.config(), tx.data() + s * 128, ty.data() + s, 32));
    return t.take_eval_metrics();
}

} // namespace

TEST(TrainCpu, SmallCnnLearnsWithSgdAndAdamW) {
    for (const auto opt : {OptimizerKind::sgd, OptimizerKind::adamw}) {
        auto t = make_trainer(toy_config("conv3x3:8,bn,relu,maxpool2,conv3x3:8,bn,relu,gap,flatten,fc:4", 2, opt));
        const Metrics m = train_toy(*t, 6);
        EXPECT_GE(m.accuracy(), 0.9) << optimizer_name(opt) << " loss " << m.loss();
        EXPECT_EQ(t->steps(), 48u);
        const Metrics tm = t->take_train_metrics();
        EXPECT_EQ(tm.samples, 6u * 256);
        EXPECT_FALSE(t->first_nonfinite_step());
    }
}

TEST(TrainCpu, ResultsDoNotDependOnThreadCount) {
    const char* spec = "conv3x3:4,bn,relu,maxpool2,flatten,dropout:0.2,fc:4";
    auto a = make_trainer(toy_config(spec, 1, OptimizerKind::sgd));
    auto b = make_trainer(toy_config(spec, 3, OptimizerKind::sgd));
    train_toy(*a, 1);
    train_toy(*b, 1);
    EXPECT_EQ(a->read_parameters(), b->read_parameters());
    EXPECT_EQ(a->read_states(), b->read_states());
}

TEST(TrainCpu, StateRoundTripsAndResumesIdentically) {
    const char* spec = "conv3x3:4,bn,relu,flatten,fc:4";
    auto a = make_trainer(toy_config(spec, 2, OptimizerKind::adamw));
    train_toy(*a, 1);
    const auto blob = a->save_state();
    auto b = make_trainer(toy_config(spec, 2, OptimizerKind::adamw));
    b->load_state(blob);
    EXPECT_EQ(b->steps(), a->steps());
    train_toy(*a, 1);
    train_toy(*b, 1);
    EXPECT_EQ(a->read_parameters(), b->read_parameters());
    auto c = make_trainer(toy_config("conv3x3:5,bn,relu,flatten,fc:4", 2, OptimizerKind::adamw));
    EXPECT_THROW(c->load_state(blob), Error);
    std::vector<std::uint8_t> truncated(blob.begin(), blob.end() - 4);
    EXPECT_THROW(b->load_state(truncated), Error);
}

TEST(TrainCpu, ConvertsEveryInputDtype) {
    const std::vector<float> values{0.0f, 1.5f, -2.0f, 100.0f};
    for (const DType dt : {DType::u8, DType::bf16, DType::f16, DType::f32}) {
        TrainerConfig c;
        c.plan = plan_network(parse_model_spec("flatten,fc:2"), {2, 1, 2}, 2);
        c.input_dtype = dt;
        c.mean = {1.0f, -1.0f};
        c.std = {2.0f, 4.0f};
        c.max_batch = 1;
        auto t = make_trainer(c);
        std::vector<std::uint8_t> raw(4 * dtype_size(dt));
        for (int i = 0; i < 4; ++i) {
            const float v = dt == DType::u8 ? std::floor(std::abs(values[i])) : values[i];
            if (dt == DType::u8)
                raw[i] = static_cast<std::uint8_t>(v);
            else if (dt == DType::bf16)
                reinterpret_cast<std::uint16_t*>(raw.data())[i] = float_to_bf16(v);
            else if (dt == DType::f16)
                reinterpret_cast<std::uint16_t*>(raw.data())[i] = float_to_f16(v);
            else
                reinterpret_cast<float*>(raw.data())[i] = v;
        }
        const std::int32_t label = 0;
        t->compute_gradients(step_batch(t->config(), raw.data(), &label, 1));
        // The layer-0 input gradient exists for each element: check the normalised input through fc weights.
        const auto p = t->read_parameters();
        const auto z = t->read_activation(1);
        double expect = p[8];
        for (int i = 0; i < 4; ++i) {
            const float v = dt == DType::u8 ? std::floor(std::abs(values[i])) : values[i];
            const float norm = (v - c.mean[i / 2]) / c.std[i / 2];
            expect += p[i] * norm;
        }
        EXPECT_NEAR(z[0], expect, 1e-4) << dtype_name(dt);
    }
}

TEST(TrainCpu, RejectsBadBatchesAndConfigs) {
    auto t = make_trainer(toy_config("flatten,fc:4", 1, OptimizerKind::sgd));
    std::vector<std::uint8_t> x(33 * 128);
    std::vector<std::int32_t> y(33, 0);
    EXPECT_THROW(t->train_step(step_batch(t->config(), x.data(), y.data(), 33)), Error);
    y[0] = 4;
    EXPECT_THROW(t->train_step(step_batch(t->config(), x.data(), y.data(), 1)), Error);
    TrainerConfig c = toy_config("flatten,fc:4", 1, OptimizerKind::sgd);
    c.input_dtype = DType::i64;
    EXPECT_THROW(make_trainer(c), Error);
}

TEST(TrainCpu, DivergenceIsReportedWithTheStep) {
    TrainerConfig c = toy_config("flatten,fc:4", 1, OptimizerKind::sgd);
    c.optimizer.lr = 1e30f;
    auto t = make_trainer(c);
    std::vector<std::uint8_t> x;
    std::vector<std::int32_t> y;
    toy_data(32, x, y, 1);
    for (int i = 0; i < 5; ++i) t->train_step(step_batch(t->config(), x.data(), y.data(), 32));
    ASSERT_TRUE(t->first_nonfinite_step());
    EXPECT_LE(*t->first_nonfinite_step(), 3u);
}
