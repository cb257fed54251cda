// On the GPU with --deterministic, a run interrupted after k steps (a
// checkpoint at --max-steps) and resumed ends with the weights of an
// uninterrupted run, within float tolerance, for the stream and device
// placements. The CPU version (bitwise) is tests/unit/checkpoint_resume_test.cpp.
#include <gtest/gtest.h>

#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <string>
#include <utility>
#include <vector>

#include "dstk/checkpoint.hpp"
#include "dstk/run/train_run.hpp"
#include "dstk/dataset_writer.hpp"
#include "dstk/gpu_info.hpp"
#include "dstk/rng.hpp"
#include "support/test_dataset.hpp"
#include "support/gpu_missing.hpp"

namespace fs = std::filesystem;
using namespace dstk;

namespace {

using test_support::gpu_missing;

fs::path temp(const std::string& name) {
    const fs::path d = fs::path(::testing::TempDir()) / ("dstk_gpu_resume_" + name + "_" + std::to_string(::getpid()));
    fs::remove_all(d);
    return d;
}

// Four classes of 3x16x16 u8 images: class c is brighter in its quadrant c.
fs::path make_dataset(const fs::path& dir) {
    CounterRng rng(7, 0);
    return test_support::write_u8_dataset(
        dir, Shape{{3, 16, 16}}, {{"train", 2000}, {"test", 300}}, 4, [&](std::uint64_t, std::span<std::uint8_t> img) {
            const auto label = static_cast<std::int32_t>(rng.below(4));
            for (std::size_t p = 0; p < img.size(); ++p) {
                const std::size_t row = p / 16 % 16, col = p % 16;
                const bool lit = static_cast<std::int32_t>((row / 8) * 2 + col / 8) == label;
                img[p] = static_cast<std::uint8_t>(rng.below(150) + (lit ? 80 : 0));
            }
            return label;
        });
}

struct Options {
    run::TrainOptions e;
    run::DataOptions d;
    OutputOptions out;
};

Options options(const fs::path& ds, const fs::path& ck, const std::string& placement, const std::string& order) {
    Options o;
    o.e.dataset = ds;
    o.e.model = "conv3x3:16,bn,relu,maxpool2,conv3x3:32,bn,relu,maxpool2,flatten,dropout:0.2,fc:4";
    o.e.epochs = 3;
    o.e.batch = 64; // 31 steps per epoch
    o.e.device = dstk::Device{dstk::Backend::cuda, 0};
    o.e.seed = 11;
    o.e.deterministic = true;
    o.d.data = placement;
    o.d.order = order;
    o.d.chunk_samples = 150;
    o.d.window = 3;
    o.d.checkpoint = ck;
    o.out.quiet = true;
    o.out.json = true; // epoch lines to stderr, silenced
    return o;
}

// The trainer state of a checkpoint: its header (sizes and step) and its floats.
struct State {
    std::vector<std::uint8_t> header;
    std::vector<float> values;
};

State state_of(const fs::path& ck) {
    const std::vector<std::uint8_t> blob = load_checkpoint(ck).trainer_state;
    const std::size_t header = train::state_magic.size() + 4 * 8;
    EXPECT_GE(blob.size(), header);
    State s;
    s.header.assign(blob.begin(), blob.begin() + static_cast<std::ptrdiff_t>(std::min(header, blob.size())));
    s.values.resize((blob.size() - s.header.size()) / 4);
    std::memcpy(s.values.data(), blob.data() + s.header.size(), s.values.size() * 4);
    return s;
}

// Largest |a - b| / (1e-3 + |a|) over the floats; infinity when the layouts differ.
double difference(const State& a, const State& b) {
    if (a.header != b.header || a.values.size() != b.values.size()) return INFINITY;
    double worst = 0;
    for (std::size_t i = 0; i < a.values.size(); ++i) {
        const double x = a.values[i], y = b.values[i];
        if (!std::isfinite(x) || !std::isfinite(y)) return INFINITY;
        worst = std::max(worst, std::abs(x - y) / (1e-3 + std::abs(x)));
    }
    return worst;
}

constexpr double tolerance = 1e-4;

} // namespace

TEST(GpuResume, DeterministicInterruptedRunsEndWithTheSameWeights) {
    if (const auto why = gpu_missing(); !why.empty()) GTEST_SKIP() << why;
    const fs::path ds = make_dataset(temp("ds"));
    for (const auto& [placement, order] :
         {std::pair<std::string, std::string>{"stream", "chunk"}, {"device", "full"}}) {
        SCOPED_TRACE(placement + " " + order);
        const fs::path whole = temp("whole"), again = temp("again"), parts = temp("parts");
        const Options first = options(ds, whole, placement, order);
        run::run_training(first.e, first.d, first.out);
        const State reference = state_of(whole);
        const Options twice = options(ds, again, placement, order);
        run::run_training(twice.e, twice.d, twice.out);
        EXPECT_LE(difference(reference, state_of(again)), tolerance)
            << "two uninterrupted --deterministic runs differ: the engine is not deterministic";

        // Stop mid-epoch (step 40: epoch 2, batch 9), then at the end of
        // epoch 2 (step 62), then finish.
        Options o = options(ds, parts, placement, order);
        o.d.max_steps = 40;
        run::run_training(o.e, o.d, o.out);
        const Checkpoint mid = load_checkpoint(parts);
        EXPECT_EQ(mid.position.epoch, 1u);
        EXPECT_EQ(mid.position.next_batch, 9u);
        EXPECT_GT(difference(reference, state_of(parts)), tolerance) << "the test could not fail";
        o.d.resume = true;
        o.d.max_steps = 62;
        run::run_training(o.e, o.d, o.out);
        EXPECT_EQ(load_checkpoint(parts).position.epoch, 2u);
        o.d.max_steps = 0;
        run::run_training(o.e, o.d, o.out);
        const double d = difference(reference, state_of(parts));
        EXPECT_LE(d, tolerance) << "resumed run's weights differ from the uninterrupted run's";
        std::printf("[ %s %s ] largest relative difference, resumed vs uninterrupted: %.3g\n", placement.c_str(),
                    order.c_str(), d);
        for (const auto& p : {whole, again, parts}) fs::remove_all(p);
    }
    fs::remove_all(ds);
}
