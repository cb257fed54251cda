#include <gtest/gtest.h>

#include <unistd.h>

#include <filesystem>
#include <fstream>

#include "dstk/checkpoint.hpp"
#include "dstk/error.hpp"
#include "support/error_of.hpp"

namespace fs = std::filesystem;
using namespace dstk;
using test_support::code_of;

namespace {

fs::path temp_dir(const std::string& name) {
    const fs::path d = fs::path(::testing::TempDir()) / ("dstk_ckpt_" + name + "_" + std::to_string(::getpid()));
    fs::remove_all(d);
    return d;
}

Checkpoint sample(std::uint64_t steps) {
    Checkpoint c;
    c.position = {2, 17, steps};
    c.seed = 99;
    c.run = {{"model", "small-cnn"}, {"batch", "64"}};
    c.created = "2026-11-20T00:00:00Z";
    c.command_line = "dstrain data --checkpoint ck";
    for (int i = 0; i < 1000; ++i) c.trainer_state.push_back(static_cast<std::uint8_t>(i * 13 + steps));
    return c;
}

} // namespace

TEST(Checkpoint, RoundTripsAndReplacesAtomically) {
    const fs::path d = temp_dir("roundtrip");
    EXPECT_FALSE(checkpoint_exists(d));
    save_checkpoint(d, sample(5));
    save_checkpoint(d, sample(6));
    const Checkpoint c = load_checkpoint(d);
    EXPECT_EQ(c.position.epoch, 2u);
    EXPECT_EQ(c.position.next_batch, 17u);
    EXPECT_EQ(c.position.steps, 6u);
    EXPECT_EQ(c.seed, 99u);
    EXPECT_EQ(c.run, sample(6).run);
    EXPECT_EQ(c.trainer_state, sample(6).trainer_state);
    // Only the checkpoint remains: no temporary files left behind.
    std::size_t files = 0;
    for ([[maybe_unused]] const auto& e : fs::directory_iterator(d)) ++files;
    EXPECT_EQ(files, 1u);
    fs::remove_all(d);
}

TEST(Checkpoint, DamageIsDetectedAndNamesTheFile) {
    const fs::path d = temp_dir("damage");
    save_checkpoint(d, sample(1));
    const fs::path p = checkpoint_path(d);
    const auto size = fs::file_size(p);
    {
        std::fstream f(p, std::ios::in | std::ios::out | std::ios::binary);
        f.seekp(static_cast<std::streamoff>(size - 10));
        f.put('\x7f');
    }
    try {
        load_checkpoint(d);
        FAIL() << "flipped byte not detected";
    } catch (const Error& e) {
        EXPECT_EQ(e.code(), ExitCode::failure);
        EXPECT_NE(std::string(e.what()).find(p.string()), std::string::npos) << e.what();
        EXPECT_NE(std::string(e.what()).find("checksum"), std::string::npos) << e.what();
    }
    fs::resize_file(p, size - 100);
    EXPECT_EQ(code_of([&] { load_checkpoint(d); }), ExitCode::failure);
    fs::resize_file(p, 5);
    EXPECT_EQ(code_of([&] { load_checkpoint(d); }), ExitCode::failure);
    fs::remove_all(d);
    EXPECT_EQ(code_of([&] { load_checkpoint(d); }), ExitCode::failure);
}

TEST(Checkpoint, ResumeWithDifferentOptionsIsAUsageErrorListingThem) {
    const Checkpoint c = sample(1);
    EXPECT_EQ(code_of([&] { check_resume_compatible(c, c.run, "ck"); }), ExitCode::ok);
    auto other = c.run;
    other["batch"] = "128";
    try {
        check_resume_compatible(c, other, "ck");
        FAIL();
    } catch (const Error& e) {
        EXPECT_EQ(e.code(), ExitCode::usage);
        EXPECT_NE(std::string(e.what()).find("batch 64 -> 128"), std::string::npos) << e.what();
    }
}
