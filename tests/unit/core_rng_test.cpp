#include <cstring>
#include <set>

#include <gtest/gtest.h>

#include "dstk/checksum.hpp"
#include "dstk/error.hpp"
#include "dstk/rng.hpp"
#include "dstk/gen/synth.hpp"
#include "dstk/thread_pool.hpp"

using namespace dstk;

// Known-answer vectors of Philox4x32-10 from Random123's kat_vectors.
TEST(Rng, PhiloxKnownAnswers) {
    EXPECT_EQ(philox4x32_10({0, 0, 0, 0}, {0, 0}), (PhiloxBlock{0x6627e8d5, 0xe169c58d, 0xbc57ac4c, 0x9b00dbd8}));
    EXPECT_EQ(philox4x32_10({0xffffffff, 0xffffffff, 0xffffffff, 0xffffffff}, {0xffffffff, 0xffffffff}),
              (PhiloxBlock{0x408f276d, 0x41c83b0e, 0xa20bc7c6, 0x6d5451fd}));
    EXPECT_EQ(philox4x32_10({0x243f6a88, 0x85a308d3, 0x13198a2e, 0x03707344}, {0xa4093822, 0x299f31d0}),
              (PhiloxBlock{0xd16cfe09, 0x94fdcceb, 0x5001e420, 0x24126ea1}));
}

TEST(Rng, CounterRngIsAPureFunctionOfSeedAndStream) {
    CounterRng a(42, 7), b(42, 7), c(43, 7), d(42, 8);
    for (int i = 0; i < 100; ++i) {
        const auto va = a.next_u64();
        EXPECT_EQ(va, b.next_u64());
        EXPECT_NE(va, c.next_u64());
        EXPECT_NE(va, d.next_u64());
    }
    CounterRng r(1, 1);
    double sum = 0;
    for (int i = 0; i < 10000; ++i) {
        const double u = r.uniform();
        ASSERT_GE(u, 0.0);
        ASSERT_LT(u, 1.0);
        sum += u;
        ASSERT_LT(r.below(10), 10u);
    }
    EXPECT_NEAR(sum / 10000, 0.5, 0.02);
}

TEST(Rng, SamplesDoNotDependOnGenerationOrderOrThread) {
    SynthParams p;
    p.shape = Shape{{3, 16, 16}};
    p.seed = 5;
    const SampleGenerator gen(p);
    const std::uint64_t n = 64, sb = gen.sample_bytes();
    std::vector<unsigned char> serial(n * sb), parallel(n * sb);
    for (std::uint64_t i = 0; i < n; ++i) gen.sample(0, i, serial.data() + i * sb);
    ThreadPool pool(3);
    pool.parallel_for(n, [&](std::uint64_t k) {
        const std::uint64_t i = n - 1 - k; // reverse order, any thread
        gen.sample(0, i, parallel.data() + i * sb);
    });
    EXPECT_EQ(serial, parallel);
    // Train and test streams differ; labels stay in range and cover the classes.
    std::vector<unsigned char> other(sb);
    gen.sample(1, 0, other.data());
    EXPECT_NE(0, std::memcmp(other.data(), serial.data(), sb));
    std::set<std::int32_t> labels;
    for (std::uint64_t i = 0; i < 1000; ++i) {
        const auto y = gen.label(0, i);
        ASSERT_GE(y, 0);
        ASSERT_LT(y, 10);
        labels.insert(y);
    }
    EXPECT_EQ(labels.size(), 10u);
}

TEST(Rng, SynthRejectsImpossibleCombinations) {
    SynthParams p;
    p.kind = SynthKind::tabular;
    p.dtype = DType::u8;
    EXPECT_THROW(SampleGenerator{p}, Error);
    p.kind = SynthKind::images;
    p.dtype = DType::u8;
    p.shape = Shape{{784}};
    EXPECT_THROW(SampleGenerator{p}, Error);
    p.shape = Shape{{28, 28}};
    EXPECT_NO_THROW(SampleGenerator{p});
    p.classes = 0;
    EXPECT_THROW(SampleGenerator{p}, Error);
}

TEST(ThreadPool, RunsEveryIndexOnceAndRethrows) {
    ThreadPool pool(4);
    std::vector<int> hits(1000, 0);
    pool.parallel_for(hits.size(), [&](std::uint64_t i) { hits[i]++; });
    for (int h : hits) EXPECT_EQ(h, 1);
    EXPECT_THROW(pool.parallel_for(100,
                                   [&](std::uint64_t i) {
                                       if (i == 37) throw std::runtime_error("boom");
                                   }),
                 std::runtime_error);
    pool.parallel_for(10, [&](std::uint64_t i) { hits[i]++; }); // still usable
    EXPECT_EQ(hits[9], 2);
}

TEST(Checksum, Xxh64KnownValuesAndStreaming) {
    EXPECT_EQ(xxh64("", 0), 0xEF46DB3751D8E999ull);
    std::vector<unsigned char> data(10007);
    for (std::size_t i = 0; i < data.size(); ++i) data[i] = static_cast<unsigned char>(i * 31 + 7);
    const std::uint64_t whole = xxh64(data.data(), data.size());
    for (std::size_t step : {1u, 3u, 31u, 32u, 33u, 4096u}) {
        Xxh64 h;
        for (std::size_t i = 0; i < data.size(); i += step) h.update(data.data() + i, std::min(step, data.size() - i));
        EXPECT_EQ(h.digest(), whole) << step;
    }
}
