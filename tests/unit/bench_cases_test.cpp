// dsbench cases on a tiny dataset, and the runner's isolation of failing cases.
#include <gtest/gtest.h>

#include <unistd.h>

#include <filesystem>
#include <cstdio>
#include <numeric>

#include "dstk/bench/bench.hpp"
#include "dstk/bench/gpu.hpp"
#include "dstk/chunked_file.hpp"
#include "dstk/thread_pool.hpp"
#include "dstk/dataset_writer.hpp"
#include "dstk/error.hpp"
#include "support/test_dataset.hpp"

using namespace dstk::bench;
namespace fs = std::filesystem;

namespace {

class BenchCasesTest : public ::testing::Test {
  protected:
    void SetUp() override {
        dir_ = fs::temp_directory_path() / ("dstk_bench_test_" + std::to_string(::getpid()));
        fs::remove_all(dir_);
        fs::create_directories(dir_);
        // Byte k of the split is (k * 7) % 61; every label is 1.
        data_ = dstk::test_support::write_u8_dataset(dir_ / "ds", dstk::Shape{{3, 8, 8}}, {{"train", 2048}}, 2,
                                                     [](std::uint64_t i, std::span<std::uint8_t> b) {
                                                         for (std::size_t j = 0; j < b.size(); ++j)
                                                             b[j] = static_cast<std::uint8_t>(((i * 192 + j) * 7) % 61);
                                                         return 1;
                                                     });
    }
    void TearDown() override { fs::remove_all(dir_); }

    BenchOptions options(std::string cases) {
        BenchOptions o;
        o.target = data_.string();
        o.cases = std::move(cases);
        o.out.quiet = true;
        o.settings.repeat = {2, 0.0, 4};
        o.settings.threads = {1, 2};
        o.settings.size_bytes = 256 << 10;
        o.settings.chunk_bytes = 64 << 10;
        o.settings.batch_samples = 16;
        return o;
    }

    fs::path dir_, data_;
};

} // namespace

TEST_F(BenchCasesTest, TargetIsTheTrainingInputs) {
    const Target t = open_target(data_, 0);
    EXPECT_EQ(t.file, data_ / "train_x.npy");
    EXPECT_EQ(t.sample_bytes, 192u);
    EXPECT_EQ(t.samples(), 2048u);
    EXPECT_EQ(t.data_offset % 64, 0u);
    EXPECT_EQ(t.data_offset + t.data_bytes, t.file_bytes);
    EXPECT_THROW(open_target(dir_ / "missing", 3072), dstk::Error);
}

TEST_F(BenchCasesTest, WarmIoAndDecodeCasesMeasure) {
    const Results r =
        run_cases(options("io.seq.pread.warm,io.seq.mmap.warm,io.rand.batch.pread.warm,io.rand.sample.pread.warm,"
                          "io.rand.chunk.pread.warm,decode.zstd,decode.convert.cpu.bf16"),
                  builtin_cases());
    ASSERT_FALSE(r.results.empty());
    EXPECT_EQ(r.context.sample_bytes, 192u);
    EXPECT_FALSE(r.context.settings.empty());
    for (const auto& c : r.results) {
        SCOPED_TRACE(c.key + " " + c.variant + ": " + c.reason);
        if (c.key == "decode.zstd.chunked") { // the prefix "decode.zstd" selects it too; npy data waives it
            EXPECT_EQ(c.status, CaseStatus::waived);
            continue;
        }
        ASSERT_EQ(c.status, CaseStatus::ok);
        EXPECT_GE(c.repetitions, 2u);
        ASSERT_NE(c.metric("rate"), nullptr);
        EXPECT_GT(c.metric("rate")->median, 0);
        EXPECT_LE(c.metric("rate")->min, c.metric("rate")->max);
    }
    const CaseResult* seq = r.find("io.seq.pread.warm");
    ASSERT_NE(seq, nullptr);
    EXPECT_EQ(seq->params["bytes_per_repetition"].get<std::uint64_t>(), 256u << 10);
    const CaseResult* batch = r.find("io.rand.batch.pread.warm", "threads=2");
    ASSERT_NE(batch, nullptr);
    EXPECT_EQ(batch->params["read_bytes"].get<std::uint64_t>(), 16u * 192);
    // A pass repeats no read while positions last (an epoch reads each chunk
    // once; repeats would be page-cache hits in a cold pass): the 2048 reads
    // of 16-sample batches start at each of the 2033 starts, the 2048 sample
    // reads read every sample, the 64 chunk reads every one of the 6 chunks.
    EXPECT_EQ(batch->params["reads_per_repetition"].get<std::uint64_t>(), 2048u);
    EXPECT_EQ(batch->params["distinct_reads"].get<std::uint64_t>(), 2033u);
    for (const char* threads : {"threads=1", "threads=2"}) {
        const CaseResult* sample = r.find("io.rand.sample.pread.warm", threads);
        ASSERT_NE(sample, nullptr);
        EXPECT_EQ(sample->params["reads_per_repetition"].get<std::uint64_t>(), 2048u);
        EXPECT_EQ(sample->params["distinct_reads"].get<std::uint64_t>(), 2048u);
        const CaseResult* chunk = r.find("io.rand.chunk.pread.warm", threads);
        ASSERT_NE(chunk, nullptr);
        EXPECT_EQ(chunk->params["reads_per_repetition"].get<std::uint64_t>(), 64u);
        EXPECT_EQ(chunk->params["distinct_reads"].get<std::uint64_t>(), 6u);
    }
    ASSERT_NE(batch->metric("latency_p99"), nullptr);
    EXPECT_GE(batch->metric("latency_p99")->median, batch->metric("latency_p50")->median);
    const CaseResult* z = r.find("decode.zstd", "threads=1");
    ASSERT_NE(z, nullptr);
    EXPECT_GT(z->params["ratio"].get<double>(), 1.5); // the test data is very regular
}

TEST_F(BenchCasesTest, WaivedAndFailingCasesDoNotStopTheOthers) {
    CaseRegistry reg;
    Case waived{"t.waived", "always waived", true, [](const CaseContext&) { return std::optional<std::string>("no"); },
                [](const CaseContext&) -> std::vector<CaseResult> { throw std::logic_error("must not run"); }};
    Case failing{"t.failing", "always fails", true, {}, [](const CaseContext&) -> std::vector<CaseResult> {
                     throw std::runtime_error("disk on fire");
                 }};
    Case fine{"t.fine", "works", true, {}, [](const CaseContext&) {
                  CaseResult r;
                  r.metrics["rate"] = Metric{"B/s", 1, 1, 1};
                  return std::vector<CaseResult>{r};
              }};
    reg.add(waived);
    reg.add(failing);
    reg.add(fine);
    EXPECT_THROW(reg.add(fine), std::logic_error);
    const Results r = run_cases(options(""), reg);
    ASSERT_EQ(r.results.size(), 3u);
    EXPECT_EQ(r.results[0].status, CaseStatus::waived);
    EXPECT_EQ(r.results[0].reason, "no");
    EXPECT_EQ(r.results[1].status, CaseStatus::failed);
    EXPECT_EQ(r.results[1].reason, "disk on fire");
    EXPECT_EQ(r.results[2].status, CaseStatus::ok);
    EXPECT_EQ(r.results[2].key, "t.fine");
}

TEST_F(BenchCasesTest, UsageErrors) {
    try {
        run_cases(options("no.such.case"), builtin_cases());
        FAIL();
    } catch (const dstk::Error& e) {
        EXPECT_EQ(e.code(), dstk::ExitCode::usage);
    }
    BenchOptions o = options("io.seq.pread.warm");
    o.settings.threads.clear();
    EXPECT_THROW(run_cases(o, builtin_cases()), dstk::Error);
}

TEST_F(BenchCasesTest, CasesNeedingAFileAreWaivedWithoutOne) {
    BenchOptions o = options("io.seq.pread.warm,decode.convert.cpu.u8");
    o.target.clear();
    const Results r = run_cases(o, builtin_cases());
    ASSERT_GE(r.results.size(), 2u);
    EXPECT_EQ(r.results[0].status, CaseStatus::waived);
    EXPECT_NE(r.results[0].reason.find("needs a dataset"), std::string::npos);
    EXPECT_EQ(r.results[1].status, CaseStatus::ok);
}

TEST(BenchGpuWaiver, SaysWhy) {
    // Without CUDA the waiver says so; with it, it is empty exactly when a GPU is visible.
    const auto why = gpu_unavailable();
#ifndef DSTK_HAVE_CUDA
    ASSERT_TRUE(why);
    EXPECT_NE(why->find("without CUDA"), std::string::npos);
#else
    if (why) EXPECT_FALSE(why->empty());
#endif
}

TEST(BenchChunked, DecodesARealZstdChunkedDataset) {
    const fs::path dir = fs::temp_directory_path() / ("dstk_bench_chunked_" + std::to_string(::getpid()));
    fs::remove_all(dir);
    fs::create_directories(dir);
    const std::uint64_t samples = 1000, chunk_samples = 128, sample_bytes = 48;
    std::vector<std::uint8_t> data(samples * sample_bytes);
    for (std::size_t i = 0; i < data.size(); ++i) data[i] = static_cast<std::uint8_t>(i % 13);
    dstk::ThreadPool pool(2);
    dstk::ChunkedWriter w(dir / "train_x.zst", sample_bytes, chunk_samples, 3, pool);
    w.append(data.data(), samples);
    w.finish();
    dstk::FieldInfo x;
    x.name = "x";
    x.shape = dstk::Shape{{48}};
    x.storage = dstk::Storage::zstd_chunked;
    x.file = "train_x.zst";
    x.bytes = w.file_bytes();
    x.chunk_samples = chunk_samples;
    dstk::Manifest m;
    m.splits.push_back(dstk::SplitInfo{"train", samples, {x}});
    std::FILE* f = std::fopen((dir / "dataset.json").c_str(), "w");
    ASSERT_NE(f, nullptr);
    std::fputs(dstk::serialize_manifest(m).c_str(), f);
    std::fclose(f);

    BenchOptions o;
    o.target = dir.string();
    o.cases = "decode.zstd";
    o.out.quiet = true;
    o.settings.repeat = {2, 0.0, 4};
    o.settings.threads = {1, 2};
    const Results r = run_cases(o, builtin_cases());
    fs::remove_all(dir);
    ASSERT_EQ(r.results.size(), 3u);
    EXPECT_EQ(r.results[0].key, "decode.zstd");
    EXPECT_EQ(r.results[0].status, CaseStatus::waived); // already compressed: the chunked case times it
    const CaseResult* c = r.find("decode.zstd.chunked", "threads=2");
    ASSERT_NE(c, nullptr);
    ASSERT_EQ(c->status, CaseStatus::ok) << c->reason;
    EXPECT_EQ(c->params["chunks"].get<std::uint64_t>(), 8u);
    EXPECT_GT(c->metric("rate")->median, 0);
}
