// dstrain --bench: ring depth and reader count from dsbench's figures.
#include <gtest/gtest.h>

#include "dstk/data/tuning.hpp"

using namespace dstk;
using namespace dstk::data;

namespace {

bench::CaseResult rand_read(const std::string& grain, unsigned threads, double rate, double p99_us) {
    bench::CaseResult c;
    c.key = "io.rand." + grain + ".pread.cold";
    c.variant = "threads=" + std::to_string(threads);
    c.params = {{"threads", threads}};
    c.metrics["rate"] = {"B/s", rate, rate, rate};
    c.metrics["latency_p99"] = {"us", p99_us, p99_us, p99_us};
    return c;
}

bench::CaseResult h2d(std::uint64_t size, double rate) {
    bench::CaseResult c;
    c.key = "h2d.pinned";
    c.params = {{"transfer_bytes", size}};
    c.metrics["rate"] = {"B/s", rate, rate, rate};
    return c;
}

bench::Results figures() {
    bench::Results r;
    r.results = {rand_read("chunk", 1, 1e9, 4000),
                 rand_read("chunk", 8, 5e9, 8000),
                 rand_read("chunk", 16, 4e9, 9000),
                 rand_read("sample", 16, 2e8, 300),
                 rand_read("sample", 64, 4e8, 500),
                 h2d(64 << 10, 5e9),
                 h2d(256ull << 20, 25e9)};
    bench::CaseResult seq;
    seq.key = "io.seq.pread.cold";
    seq.metrics["rate"] = {"B/s", 3e9, 3e9, 3e9};
    r.results.push_back(seq);
    return r;
}

std::string joined(const LoaderTuning& t) {
    std::string s;
    for (const auto& l : t.why) s += l + "\n";
    return s;
}

} // namespace

TEST(LoaderTuning, ReadersFromTheBestRandomReadsOfTheOrdersGranularity) {
    const auto r = figures();
    // 256 x 3072-byte samples: 787,456 bytes per batch.
    const auto chunk = tune_loader(r, Order::chunk, 3072, 256, 16, std::nullopt, std::nullopt, 4, 2);
    EXPECT_EQ(chunk.readers, 8u) << joined(chunk);
    // p99 8 ms at 25 GB/s = 200 MB = 254 batches: capped at 32 slots.
    EXPECT_EQ(chunk.prefetch, 32u) << joined(chunk);
    EXPECT_NE(joined(chunk).find("8 threads"), std::string::npos) << joined(chunk);
    EXPECT_NE(joined(chunk).find("capped"), std::string::npos) << joined(chunk);

    // Full order reads samples: 64 threads were best, capped at 16 hardware threads here.
    const auto full = tune_loader(r, Order::full, 3072, 256, 16, std::nullopt, std::nullopt, 4, 2);
    EXPECT_EQ(full.readers, 16u) << joined(full);
    EXPECT_NE(joined(full).find("capped at 16 hardware threads"), std::string::npos) << joined(full);
    // p99 0.5 ms at 25 GB/s = 12.5 MB = 16 batches; 16 + 2 + 16 = 34 -> 32.
    EXPECT_EQ(full.prefetch, 32u) << joined(full);
}

TEST(LoaderTuning, SlotsCoverOneSlowReadAndStayWithinMemory) {
    bench::Results r;
    r.results = {rand_read("chunk", 2, 1e9, 1000), h2d(1 << 20, 10e9)};
    // 1 ms at 10 GB/s = 10 MB; batch 64 x 40,000 B = 2.56 MB -> 4 batches; 2 + 2 + 4 = 8.
    const auto t = tune_loader(r, Order::chunk, 40000, 64, 16, std::nullopt, std::nullopt, 4, 2);
    EXPECT_EQ(t.readers, 2u);
    EXPECT_EQ(t.prefetch, 8u) << joined(t);
    // 600 MB batches: at most 1 GiB of slots, and never fewer than 2.
    const auto big = tune_loader(r, Order::chunk, 600'000'000, 1, 16, std::nullopt, std::nullopt, 4, 2);
    EXPECT_EQ(big.prefetch, 2u) << joined(big);
    // Tiny batches and a fast device still keep at least 4 slots.
    bench::Results quick;
    quick.results = {rand_read("chunk", 1, 1e9, 0), h2d(1 << 20, 1e9)};
    EXPECT_EQ(tune_loader(quick, Order::chunk, 12, 4, 16, std::nullopt, std::nullopt, 4, 2).prefetch, 4u);
}

TEST(LoaderTuning, ExplicitOptionsWin) {
    const auto r = figures();
    const auto t = tune_loader(r, Order::chunk, 3072, 256, 16, 6u, 3u, 4, 2);
    EXPECT_EQ(t.prefetch, 6u);
    EXPECT_EQ(t.readers, 3u);
    EXPECT_NE(joined(t).find("(prefetch given)"), std::string::npos) << joined(t);
    EXPECT_NE(joined(t).find("(readers given)"), std::string::npos) << joined(t);
    // A tool spells the settings as its flags.
    const SettingNames flags = [](std::string_view s) { return "--" + std::string(s); };
    const auto f = tune_loader(r, Order::chunk, 3072, 256, 16, 6u, 3u, 4, 2, flags);
    EXPECT_NE(joined(f).find("(--prefetch given)"), std::string::npos) << joined(f);
    // Only --readers given: the slots follow the given readers.
    const auto k = tune_loader(r, Order::chunk, 3072, 256, 16, std::nullopt, 3u, 4, 2);
    EXPECT_EQ(k.readers, 3u);
    EXPECT_GE(k.prefetch, 5u);
}

TEST(LoaderTuning, FileWithoutTheFiguresKeepsTheDefaults) {
    bench::Results empty;
    const auto t = tune_loader(empty, Order::sequential, 3072, 256, 16, std::nullopt, std::nullopt, 4, 2);
    EXPECT_EQ(t.prefetch, 4u);
    EXPECT_EQ(t.readers, 2u);
    EXPECT_NE(joined(t).find("default"), std::string::npos);
    // A waived case is not a figure.
    bench::Results waived;
    auto c = rand_read("batch", 12, 1e9, 100);
    c.status = bench::CaseStatus::waived;
    waived.results = {c};
    EXPECT_EQ(tune_loader(waived, Order::sequential, 3072, 256, 16, std::nullopt, std::nullopt, 4, 2).readers, 2u);
}
