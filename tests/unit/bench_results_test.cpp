// The dsbench results file: round trip, strict reading, the figures other tools use.
#include <gtest/gtest.h>

#include "dstk/bench/bench.hpp"
#include "dstk/bench/measure.hpp"
#include "dstk/bench/results.hpp"
#include "dstk/error.hpp"

using namespace dstk::bench;

namespace {

CaseResult ok_result(std::string key, std::string variant, double rate,
                     nlohmann::json params = nlohmann::json::object()) {
    CaseResult r;
    r.key = std::move(key);
    r.variant = std::move(variant);
    r.params = std::move(params);
    r.repetitions = 3;
    r.metrics["rate"] = Metric{"B/s", rate, rate * 0.9, rate * 1.1};
    return r;
}

Results sample_results() {
    Results r;
    r.context.dstk_version = "0.1.0";
    r.context.host = "box";
    r.context.gpu_name = "NVIDIA H100";
    r.context.pcie_generation = 5;
    r.context.settings = {{"repetitions", 3}};
    r.results.push_back(ok_result("io.seq.pread.warm", "", 3e9));
    r.results.push_back(ok_result("io.seq.pread.cold", "", 1.5e9));
    r.results.push_back(ok_result("h2d.pinned", "size=64KiB", 20e9, {{"transfer_bytes", 65536}}));
    r.results.push_back(ok_result("h2d.pinned", "size=256MiB", 54e9, {{"transfer_bytes", 268435456}}));
    r.results.push_back(ok_result("h2d.pinned", "size=1MiB", 40e9, {{"transfer_bytes", 1048576}}));
    auto rand1 = ok_result("io.rand.batch.pread.cold", "threads=1", 1e8, {{"threads", 1}});
    auto rand4 = ok_result("io.rand.batch.pread.cold", "threads=4", 3e8, {{"threads", 4}});
    rand4.metrics["latency_p99"] = Metric{"us", 900, 800, 1000};
    r.results.push_back(rand1);
    r.results.push_back(rand4);
    CaseResult waived;
    waived.key = "h2d.managed.fault";
    waived.status = CaseStatus::waived;
    waived.reason = "no GPU";
    r.results.push_back(waived);
    return r;
}

} // namespace

TEST(BenchResults, RoundTrip) {
    const Results a = sample_results();
    const Results b = parse_results(serialize_results(a), "test");
    ASSERT_EQ(b.results.size(), a.results.size());
    EXPECT_EQ(b.context.gpu_name, "NVIDIA H100");
    EXPECT_EQ(b.context.pcie_generation, 5);
    EXPECT_EQ(b.results.back().status, CaseStatus::waived);
    EXPECT_EQ(b.results.back().reason, "no GPU");
    const Metric* m = b.find("io.seq.pread.cold")->metric("rate");
    ASSERT_NE(m, nullptr);
    EXPECT_DOUBLE_EQ(m->median, 1.5e9);
    EXPECT_EQ(m->unit, "B/s");
    EXPECT_NEAR(m->spread_pct(), 20.0, 1e-9);
}

TEST(BenchResults, PlanningFigures) {
    Results r = sample_results();
    EXPECT_DOUBLE_EQ(*sequential_read_rate(r), 1.5e9); // cold before warm
    EXPECT_DOUBLE_EQ(*pinned_h2d_rate(r), 54e9);       // the largest transfer, not the first
    const auto best = best_random_read(r, "batch");
    ASSERT_TRUE(best);
    EXPECT_EQ(best->threads, 4u);
    EXPECT_DOUBLE_EQ(best->latency_p99_us, 900);
    EXPECT_FALSE(best_random_read(r, "sample"));
    r.results.erase(r.results.begin() + 1); // no cold figure: fall back to warm
    EXPECT_DOUBLE_EQ(*sequential_read_rate(r), 3e9);
    r.results[0].status = CaseStatus::failed;
    EXPECT_FALSE(sequential_read_rate(r));
}

TEST(BenchResults, RejectsBadFiles) {
    const auto rejects = [](const std::string& text, const std::string& needle) {
        try {
            parse_results(text, "f.json");
            ADD_FAILURE() << "accepted: " << text;
        } catch (const dstk::Error& e) {
            EXPECT_EQ(e.code(), dstk::ExitCode::failure);
            EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
        }
    };
    rejects("not json", "f.json");
    rejects("[]", "not a JSON object");
    rejects(R"({"context":{},"results":[]})", "schema_version");
    rejects(R"({"schema_version":99,"context":{"dstk_version":"x"},"results":[]})", "newer");
    rejects(R"({"schema_version":1,"context":{"dstk_version":"x"},"results":{}})", "results is not an array");
    rejects(R"({"schema_version":1,"context":{"dstk_version":"x"},"results":[{"case":"a","status":"great"}]})",
            "status");
    rejects(R"({"schema_version":1,"context":{"dstk_version":"x"},"results":[{"case":"a","status":"ok",
              "metrics":{"rate":{"unit":"B/s","median":"fast"}}}]})",
            "median");
}

TEST(BenchCases, KeyMatching) {
    EXPECT_TRUE(key_matches("io.seq.pread.cold", "io"));
    EXPECT_TRUE(key_matches("io.seq.pread.cold", "io.seq"));
    EXPECT_FALSE(key_matches("io.seq.pread.cold", "io.se")); // prefixes end at a dot
    EXPECT_TRUE(key_matches("io.rand.batch.mmap.cold", "io.rand.*.cold"));
    EXPECT_FALSE(key_matches("io.rand.batch.mmap.warm", "io.rand.*.cold"));
    EXPECT_TRUE(key_matches("h2d.pinned", "decode,h2d.pinned"));
    EXPECT_FALSE(key_matches("h2d.pinned", ""));
}

TEST(BenchMeasure, Statistics) {
    const Metric m = summarize({5, 1, 3, 2, 4}, "x");
    EXPECT_EQ(m.median, 3);
    EXPECT_EQ(m.min, 1);
    EXPECT_EQ(m.max, 5);
    EXPECT_EQ(summarize({1, 2, 3, 10}, "x").median, 2.5);
    std::vector<double> v;
    for (int i = 1; i <= 100; ++i) v.push_back(i);
    EXPECT_EQ(percentile(v, 50), 50);
    EXPECT_EQ(percentile(v, 99), 99);
    EXPECT_EQ(percentile(v, 100), 100);
    const Metric r = rate_metric(100, {1.0, 2.0, 4.0}, "B/s");
    EXPECT_EQ(r.median, 50);
    EXPECT_EQ(r.min, 25);
    EXPECT_EQ(r.max, 100);
}

TEST(BenchMeasure, RepetitionPolicy) {
    int prepared = 0, runs = 0;
    const auto s = time_repetitions(
        {3, 0.0, 50}, [&] { ++prepared; },
        [&] {
            ++runs;
            return 0.01;
        });
    EXPECT_EQ(s.size(), 3u);
    EXPECT_EQ(runs, 4); // one warm-up
    EXPECT_EQ(prepared, 4);
    // min_time extends the repetitions, up to the maximum.
    EXPECT_EQ(time_repetitions({2, 1.0, 10}, {}, [] { return 0.3; }).size(), 4u);
    EXPECT_EQ(time_repetitions({2, 100.0, 10}, {}, [] { return 0.3; }).size(), 10u);
}

TEST(BenchOptionsParsing, Lists) {
    EXPECT_EQ(parse_thread_list("4,1,4,16"), (std::vector<unsigned>{1, 4, 16}));
    EXPECT_EQ(parse_size_list("1M,64K"), (std::vector<std::uint64_t>{65536, 1048576}));
    EXPECT_THROW(parse_thread_list("0"), dstk::Error);
    EXPECT_THROW(parse_thread_list("1,,2"), dstk::Error);
    EXPECT_THROW(parse_size_list("1M,0"), dstk::Error);
}

TEST(BenchResults, RateAtThreadsTakesTheSweepPointAReaderRuns) {
    Results r;
    for (const auto& [threads, rate] : {std::pair{1u, 1.28e9}, std::pair{4u, 1.77e9}, std::pair{16u, 1.67e9}}) {
        CaseResult c;
        c.key = "io.rand.chunk.pread.cold";
        c.params = {{"threads", threads}};
        c.metrics["rate"] = Metric{"B/s", rate, rate, rate};
        r.results.push_back(c);
    }
    // Not the best of the sweep (4 threads): the count the reader keeps in flight.
    EXPECT_DOUBLE_EQ(rate_at_threads(r, "io.rand.chunk.pread.cold", 16)->rate, 1.67e9);
    EXPECT_EQ(rate_at_threads(r, "io.rand.chunk.pread.cold", 8)->threads, 4u); // at most 8: 4
    EXPECT_EQ(rate_at_threads(r, "io.rand.chunk.pread.cold", 64)->threads, 16u);
    r.results.erase(r.results.begin()); // below every count measured: the smallest
    EXPECT_EQ(rate_at_threads(r, "io.rand.chunk.pread.cold", 2)->threads, 4u);
    r.results[0].status = CaseStatus::failed;
    EXPECT_EQ(rate_at_threads(r, "io.rand.chunk.pread.cold", 8)->threads, 16u);
    EXPECT_FALSE(rate_at_threads(r, "decode.zstd", 8));
}
