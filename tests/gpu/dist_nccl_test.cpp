// The NCCL reducer on one GPU (N = 1, the unique id made in this process) and
// the cuda trainer's data-parallel path: with a reducer of size 1, training
// gives weights bit-equal to training without one, through the captured graph
// (full batches) and the eager path (a partial batch), in tf32 and bf16; a
// rank that never arrives is a timely error, not a hang.
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <future>
#include <memory>
#include <thread>

#include "dstk/dist/nccl.hpp"
#include "dstk/error.hpp"
#include "dstk/gpu_info.hpp"
#include "dstk/rng.hpp"
#include "dstk/train/trainer.hpp"

using namespace dstk;
using namespace dstk::train;

namespace {

bool gpu_and_nccl(std::string& why) {
#if !defined(DSTK_HAVE_CUDA)
    why = "built without CUDA support";
    return false;
#else
    if (!dist::nccl_available()) {
        why = "built without NCCL";
        return false;
    }
    return !detect_gpus(&why).empty();
#endif
}

#define REQUIRE_GPU_AND_NCCL()                                                                                         \
    do {                                                                                                               \
        std::string why_;                                                                                              \
        if (!gpu_and_nccl(why_)) GTEST_SKIP() << "no GPU or NCCL: " << why_;                                           \
    } while (0)

std::unique_ptr<dist::Reducer> single_rank_reducer() {
    return dist::make_nccl_reducer(dist::nccl_unique_id(), 0, 1, 0, 60.0);
}

const TensorShape in_shape{3, 16, 16};
constexpr std::uint32_t classes = 10, max_batch = 32;

TrainerConfig config(Precision p) {
    TrainerConfig c;
    c.plan = plan_network(resolve_model("conv3x3:8,bn,relu,res(conv3x3:8,bn,relu),maxpool2,conv3x3:16:bias,bn,relu,"
                                        "flatten,dropout:0.2,fc:32,relu,fc:10",
                                        classes),
                          in_shape, classes);
    c.input_dtype = DType::f32;
    c.mean.assign(in_shape.c, 0.5f);
    c.std.assign(in_shape.c, 2.0f);
    c.max_batch = max_batch;
    c.precision = p;
    c.device = {Backend::cuda, 0};
    c.seed = 5;
    c.optimizer.kind = OptimizerKind::adamw;
    c.optimizer.lr = 0.002f;
    c.schedule.kind = ScheduleKind::cosine;
    c.schedule.total_steps = 20;
    c.schedule.warmup_steps = 2;
    // The same kernels in both trainers, none that adds with atomics: any
    // difference is then the reducer's.
    c.deterministic = true;
    c.kernels = KernelMode::heuristic;
    return c;
}

// Random f32 samples and labels in device memory.
struct DeviceData {
    std::unique_ptr<BackendBuffer> x, y;
    explicit DeviceData(std::uint32_t n, int device = 0, std::uint64_t seed = 23) {
        CounterRng rng(seed, 1);
        std::vector<float> hx(std::uint64_t{n} * in_shape.numel());
        std::vector<std::int32_t> hy(n);
        for (auto& v : hx) v = static_cast<float>(rng.normal() * 2.0 + 0.5);
        for (auto& v : hy) v = static_cast<std::int32_t>(rng.below(classes));
        x = make_backend_buffer({Backend::cuda, device}, hx.size() * 4);
        y = make_backend_buffer({Backend::cuda, device}, hy.size() * 4);
        x->upload(0, hx.data(), hx.size() * 4);
        y->upload(0, hy.data(), hy.size() * 4);
    }
    // Batch k of size n (batches laid end to end at max_batch spacing).
    Batch batch(const TrainerConfig& c, std::uint32_t k, std::uint32_t n) const {
        const std::uint64_t first = std::uint64_t{k} * max_batch;
        return step_batch(c, static_cast<const float*>(x->data()) + first * in_shape.numel(),
                          static_cast<const std::int32_t*>(y->data()) + first, n);
    }
};

// Four full batches (the graph), one partial batch (eager), two full ones.
void run_steps(Trainer& t, const DeviceData& d) {
    for (std::uint32_t k = 0; k < 4; ++k) t.train_step(d.batch(t.config(), k, max_batch));
    t.train_step(d.batch(t.config(), 4, max_batch - 7));
    for (std::uint32_t k = 5; k < 7; ++k) t.train_step(d.batch(t.config(), k, max_batch));
    t.synchronize();
}

bool bit_equal(const std::vector<float>& a, const std::vector<float>& b) {
    return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

} // namespace

TEST(DistNccl, SingleRankCollectivesReturnTheirInputBitForBit) {
    REQUIRE_GPU_AND_NCCL();
    auto r = single_rank_reducer();
    EXPECT_EQ(r->rank(), 0);
    EXPECT_EQ(r->size(), 1);
    std::vector<float> v(1000);
    CounterRng rng(3, 3);
    for (auto& x : v) x = static_cast<float>(rng.normal());
    auto w = v;
    r->average_host(w.data(), w.size());
    EXPECT_TRUE(bit_equal(v, w));
    r->broadcast_host(w.data(), w.size());
    EXPECT_TRUE(bit_equal(v, w));
    r->average_host(w.data(), 0); // nothing to do, no error
}

TEST(DistNccl, SingleRankTrainingIsBitEqualToNoReducer) {
    REQUIRE_GPU_AND_NCCL();
    const DeviceData d(7 * max_batch);
    auto reducer = single_rank_reducer();
    for (const Precision p : {Precision::tf32, Precision::bf16}) {
        SCOPED_TRACE(std::string(precision_name(p)));
        auto plain = make_trainer(config(p));
        auto reduced = make_trainer(config(p));
        const auto initial = plain->read_parameters();
        reduced->set_reducer(reducer.get());
        EXPECT_TRUE(bit_equal(initial, reduced->read_parameters())) << "the broadcast from rank 0 changed parameters";
        run_steps(*plain, d);
        run_steps(*reduced, d);
        const auto trained = plain->read_parameters();
        EXPECT_FALSE(bit_equal(initial, trained)) << "training did not move the weights: the test proves nothing";
        EXPECT_TRUE(bit_equal(trained, reduced->read_parameters())) << "weights differ with a reducer of size 1";
        const auto states = plain->read_states();
        reduced->average_states();
        EXPECT_TRUE(bit_equal(states, reduced->read_states())) << "BN running statistics differ";
        EXPECT_EQ(plain->take_train_metrics().loss_sum, reduced->take_train_metrics().loss_sum);

        // Back to one process: the plain graph again, still in step.
        reduced->set_reducer(nullptr);
        run_steps(*plain, d);
        run_steps(*reduced, d);
        EXPECT_TRUE(bit_equal(plain->read_parameters(), reduced->read_parameters())) << "after set_reducer(nullptr)";
    }
}

// Rank 0 of a world of two whose rank 1 never starts: creation gives up at
// the timeout with a message naming the rank, and does not hang.
TEST(DistNccl, MissingRankTimesOutWithAClearError) {
    REQUIRE_GPU_AND_NCCL();
    const double timeout_s = 3.0;
    const auto id = dist::nccl_unique_id();
    // On a thread of its own, so that a hang is this test's failure, at once,
    // rather than the whole executable's at ctest's limit.
    auto outcome = std::make_shared<std::promise<std::string>>();
    auto done = outcome->get_future();
    const auto start = std::chrono::steady_clock::now();
    std::thread([outcome, id, timeout_s] {
        try {
            dist::make_nccl_reducer(id, 0, 2, 0, timeout_s);
            outcome->set_value("no error: a communicator of two ranks was created with one");
        } catch (const Error& e) {
            outcome->set_value(std::string(e.code() == ExitCode::failure ? "" : "wrong exit code: ") + e.what());
        }
    }).detach();
    if (done.wait_for(std::chrono::duration<double>(timeout_s + 30.0)) != std::future_status::ready) {
        ADD_FAILURE() << "make_nccl_reducer still waits " << timeout_s + 30.0 << " s after a " << timeout_s
                      << " s timeout";
        std::fflush(stdout);
        std::_Exit(1); // the hung NCCL thread cannot be stopped
    }
    const double waited = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    const std::string what = done.get();
    EXPECT_EQ(what.rfind("rank 0 of 2: NCCL communicator creation did not complete within 3 s", 0), 0u) << what;
    EXPECT_GE(waited, timeout_s);
}

// Two ranks as two threads of this process, one GPU each (on a machine with
// two or more): different initial weights and different batches, yet after
// the broadcast and the averaged steps both hold the same bits, BN running
// statistics included once averaged.
TEST(DistNccl, TwoRanksOnTwoGpusHoldTheSameWeights) {
    REQUIRE_GPU_AND_NCCL();
    if (detect_gpus().size() < 2) GTEST_SKIP() << "needs two GPUs (" << detect_gpus().size() << " visible)";
    for (const Precision p : {Precision::tf32, Precision::bf16}) {
        SCOPED_TRACE(std::string(precision_name(p)));
        const auto id = dist::nccl_unique_id(); // one per communicator
        std::vector<float> params[2], states[2], initial[2];
        std::string errors[2];
        auto rank_main = [&](int rank) {
            try {
                auto reducer = dist::make_nccl_reducer(id, rank, 2, rank, 60.0);
                TrainerConfig c = config(p);
                c.device = {Backend::cuda, rank};
                c.seed = 5 + static_cast<std::uint64_t>(rank);
                const DeviceData d(7 * max_batch, rank, 23 + static_cast<std::uint64_t>(rank));
                auto t = make_trainer(c);
                initial[rank] = t->read_parameters();
                t->set_reducer(reducer.get());
                run_steps(*t, d);
                t->average_states();
                params[rank] = t->read_parameters();
                states[rank] = t->read_states();
            } catch (const std::exception& e) {
                errors[rank] = e.what();
            }
        };
        std::thread r0(rank_main, 0), r1(rank_main, 1);
        r0.join();
        r1.join();
        ASSERT_EQ(errors[0] + errors[1], "");
        EXPECT_FALSE(bit_equal(initial[0], initial[1])) << "the ranks began equal: the broadcast is untested";
        EXPECT_FALSE(bit_equal(initial[0], params[0])) << "training did not move the weights";
        EXPECT_TRUE(bit_equal(params[0], params[1])) << "the ranks' weights differ";
        EXPECT_TRUE(bit_equal(states[0], states[1])) << "the ranks' averaged BN statistics differ";
    }
}

namespace {

double median(std::vector<double> v) {
    std::sort(v.begin(), v.end());
    return v.empty() ? 0.0 : v[v.size() / 2];
}

// Milliseconds per train_step over `steps` full batches (the captured graph),
// cycling through `batches`.
double step_ms(Trainer& t, const std::vector<Batch>& batches, int steps) {
    t.synchronize();
    const auto start = std::chrono::steady_clock::now();
    for (int k = 0; k < steps; ++k) t.train_step(batches[static_cast<std::size_t>(k) % batches.size()]);
    t.synchronize();
    return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count() / steps;
}

} // namespace

// For scripts/bench-dist.sh (run with --gtest_also_run_disabled_tests): the
// speed of dstrain's training step, ref-cnn, batch 256, u8 3x32x32 input in
// GPU memory, without a reducer and with an NCCL reducer of size 1,
// interleaved in rounds; and one gradient-sized all-reduce. Prints lines
// "bench ..." that the script tabulates.
TEST(DistNcclBench, DISABLED_StepTimeWithAndWithoutReducer) {
    REQUIRE_GPU_AND_NCCL();
    const std::uint32_t batch = 256, nbatches = 8;
    const TensorShape in{3, 32, 32};
    std::vector<std::uint8_t> hx(std::uint64_t{batch} * nbatches * in.numel());
    std::vector<std::int32_t> hy(std::uint64_t{batch} * nbatches);
    CounterRng rng(7, 7);
    for (auto& v : hx) v = static_cast<std::uint8_t>(rng.below(256));
    for (auto& v : hy) v = static_cast<std::int32_t>(rng.below(10));
    auto x = make_backend_buffer({Backend::cuda, 0}, hx.size());
    auto y = make_backend_buffer({Backend::cuda, 0}, hy.size() * 4);
    x->upload(0, hx.data(), hx.size());
    y->upload(0, hy.data(), hy.size() * 4);
    auto reducer = single_rank_reducer();
    const int rounds = 7, steps = 150;
    std::unique_ptr<Trainer> t; // a trainer's compute stream for the all-reduce below, as in training
    for (const Precision p : {Precision::tf32, Precision::bf16}) {
        TrainerConfig c;
        c.plan = plan_network(resolve_model("ref-cnn", 10), in, 10);
        c.input_dtype = DType::u8;
        c.mean.assign(3, 127.5f);
        c.std.assign(3, 64.0f);
        c.max_batch = batch;
        c.precision = p;
        c.device = {Backend::cuda, 0};
        c.schedule.total_steps = 100000;
        std::vector<Batch> batches;
        for (std::uint32_t k = 0; k < nbatches; ++k)
            batches.push_back(
                step_batch(c, static_cast<const std::uint8_t*>(x->data()) + std::uint64_t{k} * batch * in.numel(),
                           static_cast<const std::int32_t*>(y->data()) + std::uint64_t{k} * batch, batch));
        auto plain = make_trainer(c);
        auto reduced = make_trainer(c);
        reduced->set_reducer(reducer.get());
        step_ms(*plain, batches, 30); // warm-up: clocks, caches
        step_ms(*reduced, batches, 30);
        std::vector<double> a, b;
        for (int r = 0; r < rounds; ++r) {
            a.push_back(step_ms(*plain, batches, steps));
            b.push_back(step_ms(*reduced, batches, steps));
        }
        std::printf("bench %s plain_ms %.4f nccl1_ms %.4f params %llu\n", std::string(precision_name(p)).c_str(),
                    median(a), median(b), static_cast<unsigned long long>(c.plan.params));
        t = std::move(plain);
    }
    // One all-reduce of the gradient vector's size, enqueued 20 at a time: the
    // median over 60 groups of the time per call.
    const std::uint64_t count = plan_network(resolve_model("ref-cnn", 10), in, 10).params;
    auto g = make_backend_buffer({Backend::cuda, 0}, count * 4);
    std::vector<float> zeros(count, 0.0f);
    g->upload(0, zeros.data(), count * 4);
    std::vector<double> us;
    for (int r = 0; r < 63; ++r) {
        t->synchronize();
        const auto start = std::chrono::steady_clock::now();
        for (int k = 0; k < 20; ++k)
            reducer->average_device(static_cast<float*>(g->data()), count, t->compute_stream());
        t->synchronize();
        if (r >= 3)
            us.push_back(std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - start).count() /
                         20);
    }
    std::printf("bench allreduce_us %.2f bytes %llu ranks 1\n", median(us), static_cast<unsigned long long>(count * 4));
}
