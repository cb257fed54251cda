// dsbench's loader cases (lib/src/bench/loader_cases.cpp): registered in the
// built-in registry, run on the CPU (host memory) without a GPU, and waived
// with a reason where they cannot run.
#include <gtest/gtest.h>

#include <unistd.h>

#include <algorithm>
#include <filesystem>
#include <vector>

#include "dstk/bench/bench.hpp"
#include "dstk/dataset_writer.hpp"
#include "dstk/gpu_info.hpp"
#include "support/test_dataset.hpp"

using namespace dstk::bench;
namespace fs = std::filesystem;

namespace {

class LoaderCasesTest : public ::testing::Test {
  protected:
    void SetUp() override {
        dir_ = fs::temp_directory_path() / ("dstk_loader_cases_" + std::to_string(::getpid()));
        fs::remove_all(dir_);
        fs::create_directories(dir_);
        // Byte k of the split is k % 251; sample i's label is i % 3.
        data_ = dstk::test_support::write_u8_dataset(dir_ / "ds", dstk::Shape{{3, 4, 4}}, {{"train", 1024}}, 3,
                                                     [](std::uint64_t i, std::span<std::uint8_t> b) {
                                                         for (std::size_t j = 0; j < b.size(); ++j)
                                                             b[j] = static_cast<std::uint8_t>((i * 48 + j) % 251);
                                                         return static_cast<std::int32_t>(i % 3);
                                                     });
    }
    void TearDown() override { fs::remove_all(dir_); }

    BenchOptions options(std::string cases) const {
        BenchOptions o;
        o.target = data_.string();
        o.cases = std::move(cases);
        o.out.quiet = true;
        o.settings.repeat = {2, 0.0, 3};
        o.settings.threads = {1};
        o.settings.batch_samples = 32;
        o.settings.chunk_bytes = 4096;
        return o;
    }

    fs::path dir_, data_;
};

bool gpu_here() {
    return dstk::built_with_cuda() && !dstk::detect_gpus().empty();
}

} // namespace

TEST(LoaderCases, AreRegistered) {
    std::vector<std::string> keys;
    for (const Case& c : builtin_cases().cases())
        if (c.key.rfind("loader.", 0) == 0) keys.push_back(c.key);
    ASSERT_EQ(keys.size(), 12u);
    for (const char* p : {"device", "stream", "managed"})
        for (const char* o : {"sequential", "chunk", "full"})
            EXPECT_NE(std::find(keys.begin(), keys.end(), std::string("loader.") + p + "." + o), keys.end())
                << p << "." << o;
    for (const char* o : {"sequential", "chunk", "full"})
        EXPECT_NE(std::find(keys.begin(), keys.end(), std::string("loader.stream.direct.") + o), keys.end()) << o;
    const auto listed = format_case_list(builtin_cases());
    EXPECT_NE(listed.find("loader.stream.chunk"), std::string::npos);
}

TEST_F(LoaderCasesTest, DeviceAndStreamDeliverEveryBatch) {
    const Results r = run_cases(options("loader.device,loader.stream"), builtin_cases());
    ASSERT_EQ(r.results.size(), 9u);
    for (const CaseResult& c : r.results) {
        SCOPED_TRACE(c.key + ": " + c.reason);
        ASSERT_EQ(c.status, CaseStatus::ok);
        // The documented schema, as every other case: rate (B/s) and samples_rate.
        ASSERT_NE(c.metric("samples_rate"), nullptr);
        ASSERT_NE(c.metric("rate"), nullptr);
        EXPECT_GT(c.metric("samples_rate")->median, 0);
        EXPECT_EQ(c.metric("rate")->unit, "B/s");
        // A rate of real work: every batch is read, so no figure beyond what
        // memory can move (a resident split's slices once measured 9.4e13 B/s).
        EXPECT_LT(c.metric("rate")->median, 1e12);
        EXPECT_NEAR(c.metric("rate")->median / c.metric("samples_rate")->median, 48 + 4, 1e-6);
        EXPECT_EQ(c.params["batch"].get<std::uint32_t>(), 32u);
        EXPECT_EQ(c.params["batches_per_pass"].get<std::uint64_t>(), 1024u / 32);
        EXPECT_EQ(c.params["device"].get<std::string>(), gpu_here() ? "cuda:0" : "cpu");
    }
}

TEST_F(LoaderCasesTest, TheTableShowsEveryLoaderRate) {
    BenchOptions o = options("loader.device.sequential,loader.stream.chunk");
    const Results r = run_cases(o, builtin_cases());
    const std::string table = format_results_table(r);
    for (const char* key : {"loader.device.sequential", "loader.stream.chunk"}) {
        const auto at = table.find(key);
        ASSERT_NE(at, std::string::npos) << table;
        const std::string line = table.substr(at, table.find('\n', at) - at);
        EXPECT_NE(line.find("B/s"), std::string::npos) << "blank rate: " << line;
        EXPECT_NE(line.find("samples/s"), std::string::npos) << "blank per second: " << line;
    }
}

TEST_F(LoaderCasesTest, ManagedIsWaivedWithoutAGpu) {
    if (gpu_here()) GTEST_SKIP() << "a CUDA GPU is present: managed runs (tests/gpu covers it)";
    const Results r = run_cases(options("loader.managed"), builtin_cases());
    ASSERT_EQ(r.results.size(), 3u);
    for (const CaseResult& c : r.results) {
        EXPECT_EQ(c.status, CaseStatus::waived) << c.key;
        EXPECT_NE(c.reason.find("CUDA"), std::string::npos) << c.reason;
    }
}

TEST_F(LoaderCasesTest, NeedADatasetNotAPlainFile) {
    BenchOptions o = options("loader.stream.sequential");
    o.target = (data_ / "train_x.npy").string();
    o.sample_bytes = 48;
    const Results r = run_cases(o, builtin_cases());
    ASSERT_EQ(r.results.size(), 1u);
    EXPECT_EQ(r.results[0].status, CaseStatus::waived);
    EXPECT_NE(r.results[0].reason.find("dataset directory"), std::string::npos);
    o.target.clear();
    const Results none = run_cases(o, builtin_cases());
    EXPECT_EQ(none.results[0].status, CaseStatus::waived);
}
