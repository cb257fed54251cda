// A training run interrupted and resumed ends with bitwise the same weights
// as an uninterrupted one (cpu backend), for every placement and order.
#include <gtest/gtest.h>

#include <unistd.h>

#include <filesystem>

#include "dstk/checkpoint.hpp"
#include "dstk/run/train_run.hpp"
#include "dstk/dataset_writer.hpp"
#include "dstk/error.hpp"
#include "dstk/rng.hpp"
#include "support/test_dataset.hpp"

namespace fs = std::filesystem;
using namespace dstk;

namespace {

fs::path temp(const std::string& name) {
    const fs::path d = fs::path(::testing::TempDir()) / ("dstk_resume_" + name + "_" + std::to_string(::getpid()));
    fs::remove_all(d);
    return d;
}

// Two classes of 1x8x8 u8 images: class 1 is brighter in its left half.
fs::path make_dataset(const fs::path& dir) {
    CounterRng rng(5, 0);
    return test_support::write_u8_dataset(
        dir, Shape{{1, 8, 8}}, {{"train", 300}, {"test", 64}}, 2, [&](std::uint64_t, std::span<std::uint8_t> img) {
            const auto label = static_cast<std::int32_t>(rng.below(2));
            for (std::size_t p = 0; p < img.size(); ++p)
                img[p] = static_cast<std::uint8_t>(rng.below(128) + ((label == 1 && p % 8 < 4) ? 100 : 0));
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
    o.e.model = "conv3x3:4,bn,relu,maxpool2,flatten,dropout:0.2,fc:2";
    o.e.epochs = 3;
    o.e.batch = 32;
    o.e.lr = 0.05f;
    o.e.device = dstk::Device{dstk::Backend::cpu, 0};
    o.e.seed = 11;
    o.e.threads = 2;
    o.d.data = placement;
    o.d.order = order;
    o.d.chunk_samples = 40; // 300 samples: 7 full chunks and a partial one
    o.d.window = 3;
    o.d.prefetch = 3;
    o.d.readers = 2;
    o.d.checkpoint = ck;
    o.out.quiet = true;
    o.out.json = true; // epoch lines go to stderr, silenced by quiet
    return o;
}

void train_run(const Options& o) {
    run::run_training(o.e, o.d, o.out);
}

std::vector<std::uint8_t> final_state(const fs::path& ck) {
    return load_checkpoint(ck).trainer_state;
}

} // namespace

TEST(CheckpointResume, InterruptedRunsEndBitwiseEqual) {
    const fs::path ds = make_dataset(temp("ds"));
    for (const auto& [placement, order] : {std::pair<std::string, std::string>{"stream", "chunk"},
                                           {"stream", "full"},
                                           {"device", "sequential"},
                                           {"device", "chunk"}}) {
        SCOPED_TRACE(placement + " " + order);
        const fs::path whole = temp("whole"), parts = temp("parts");
        train_run(options(ds, whole, placement, order));
        const auto reference = final_state(whole);
        EXPECT_EQ(load_checkpoint(whole).position.epoch, 3u);

        // Stop mid-epoch (step 13 of 9 per epoch: epoch 2, batch 4), then at
        // an epoch boundary, then finish.
        auto o = options(ds, parts, placement, order);
        o.d.max_steps = 13;
        train_run(o);
        const Checkpoint mid = load_checkpoint(parts);
        EXPECT_EQ(mid.position.epoch, 1u);
        EXPECT_EQ(mid.position.next_batch, 4u);
        EXPECT_EQ(mid.position.steps, 13u);
        EXPECT_NE(mid.trainer_state, reference);
        o.d.resume = true;
        o.d.max_steps = 18;
        train_run(o);
        EXPECT_EQ(load_checkpoint(parts).position.epoch, 2u);
        o.d.max_steps = 0;
        train_run(o);
        EXPECT_EQ(final_state(parts), reference);
        fs::remove_all(whole);
        fs::remove_all(parts);
    }
    fs::remove_all(ds);
}

TEST(CheckpointResume, RefusesDifferentOptionsAndExistingCheckpoint) {
    const fs::path ds = make_dataset(temp("ds2")), ck = temp("ck2");
    auto o = options(ds, ck, "stream", "chunk");
    o.d.max_steps = 2;
    train_run(o);
    auto again = o;
    try {
        train_run(again); // no --resume: refuses to overwrite
        FAIL();
    } catch (const Error& e) {
        EXPECT_EQ(e.code(), ExitCode::usage) << e.what();
    }
    again.d.resume = true;
    again.d.order = "full";
    try {
        train_run(again);
        FAIL();
    } catch (const Error& e) {
        EXPECT_EQ(e.code(), ExitCode::usage);
        EXPECT_NE(std::string(e.what()).find("order chunk -> full"), std::string::npos) << e.what();
    }
    fs::remove_all(ds);
    fs::remove_all(ck);
}
