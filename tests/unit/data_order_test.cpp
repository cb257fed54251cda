#include <gtest/gtest.h>

#include <algorithm>
#include <vector>

#include "dstk/data/order.hpp"
#include "dstk/error.hpp"

using namespace dstk::data;

namespace {

std::vector<std::uint64_t> visit(const EpochOrder& o) {
    std::vector<std::uint64_t> v(o.size());
    for (std::uint64_t i = 0; i < o.size(); ++i) v[i] = o[i];
    return v;
}

bool is_permutation_of_range(std::vector<std::uint64_t> v) {
    std::sort(v.begin(), v.end());
    for (std::uint64_t i = 0; i < v.size(); ++i)
        if (v[i] != i) return false;
    return true;
}

} // namespace

TEST(Permutation, IsABijectionWithInverseForManySizes) {
    for (const std::uint64_t n : {1ull, 2ull, 3ull, 5ull, 16ull, 17ull, 100ull, 1000ull, 4097ull}) {
        const Permutation p(n, 42);
        std::vector<std::uint64_t> v(n);
        for (std::uint64_t i = 0; i < n; ++i) {
            v[i] = p(i);
            ASSERT_LT(v[i], n);
            EXPECT_EQ(p.inverse(v[i]), i) << "n=" << n;
        }
        EXPECT_TRUE(is_permutation_of_range(v)) << "n=" << n;
    }
}

TEST(Permutation, DependsOnKeyAndMixes) {
    const std::uint64_t n = 10000;
    const Permutation a(n, 1), b(n, 2);
    std::uint64_t same = 0, fixed = 0;
    for (std::uint64_t i = 0; i < n; ++i) {
        same += a(i) == b(i);
        fixed += a(i) == i;
    }
    EXPECT_LT(same, 50u);
    EXPECT_LT(fixed, 50u);
}

TEST(Permutation, HugeDomainsNeedNoMemory) {
    const std::uint64_t n = 10'000'000'000ull;
    const Permutation p(n, 7);
    for (const std::uint64_t i : {std::uint64_t{0}, std::uint64_t{1}, std::uint64_t{123456789}, n - 1}) {
        const std::uint64_t j = p(i);
        ASSERT_LT(j, n);
        EXPECT_EQ(p.inverse(j), i);
    }
}

TEST(EpochOrder, SequentialIsIdentity) {
    const EpochOrder o({Order::sequential, 5, 16, 2}, 100, 3);
    for (std::uint64_t i = 0; i < 100; ++i) EXPECT_EQ(o[i], i);
    EXPECT_TRUE(o.window_chunks(10).empty());
}

TEST(EpochOrder, FullIsAPermutationPerEpochAndPureFunctionOfSeedEpoch) {
    const OrderConfig c{Order::full, 9, 0, 0};
    const auto e0 = visit(EpochOrder(c, 1000, 0));
    const auto e0b = visit(EpochOrder(c, 1000, 0));
    const auto e1 = visit(EpochOrder(c, 1000, 1));
    EXPECT_TRUE(is_permutation_of_range(e0));
    EXPECT_TRUE(is_permutation_of_range(e1));
    EXPECT_EQ(e0, e0b);
    EXPECT_NE(e0, e1);
    OrderConfig other = c;
    other.seed = 10;
    EXPECT_NE(e0, visit(EpochOrder(other, 1000, 0)));
}

TEST(EpochOrder, ChunkIsAPermutationWithPartialLastChunkAnywhere) {
    // 10 chunks of 16 + a tail of 5; windows of 3 chunks. Over many epochs the
    // partial chunk lands in every window position.
    for (std::uint64_t epoch = 0; epoch < 40; ++epoch) {
        for (const std::uint64_t n : {165ull, 160ull, 7ull, 16ull, 17ull}) {
            const EpochOrder o({Order::chunk, 3, 16, 3}, n, epoch);
            const auto v = visit(o);
            ASSERT_TRUE(is_permutation_of_range(v)) << "n=" << n << " epoch=" << epoch;
        }
    }
}

TEST(EpochOrder, ChunkKeepsEachWindowWithinItsChunks) {
    const std::uint64_t n = 1000, c = 32, w = 4;
    const EpochOrder o({Order::chunk, 11, c, w}, n, 2);
    std::uint64_t p = 0, windows = 0;
    while (p < n) {
        const auto chunks = o.window_chunks(p);
        const std::uint64_t end = o.next_window_start(p);
        ASSERT_GT(end, p);
        ASSERT_LE(chunks.size(), w);
        std::uint64_t expected = 0;
        for (const auto ch : chunks) expected += std::min(c, n - ch * c);
        EXPECT_EQ(end - p, expected);
        for (std::uint64_t q = p; q < end; ++q) {
            const std::uint64_t chunk = o[q] / c;
            EXPECT_TRUE(std::binary_search(chunks.begin(), chunks.end(), chunk)) << "position " << q;
        }
        p = end;
        ++windows;
    }
    EXPECT_EQ(windows, (n / c + 1 + w - 1) / w);
    // The chunk order itself is shuffled: the first window is not chunks 0..3.
    bool shuffled = false;
    for (std::uint64_t e = 0; e < 4; ++e)
        shuffled |=
            EpochOrder({Order::chunk, 11, c, w}, n, e).window_chunks(0) != std::vector<std::uint64_t>{0, 1, 2, 3};
    EXPECT_TRUE(shuffled);
}

TEST(EpochOrder, AnyPositionCanBeComputedAlone) {
    // Resuming: position p computed by a fresh object equals the value seen in a full pass.
    for (const Order kind : {Order::chunk, Order::full}) {
        const OrderConfig c{kind, 123, 64, 4};
        const auto all = visit(EpochOrder(c, 5000, 7));
        for (const std::uint64_t p : {0ull, 1ull, 777ull, 4999ull}) EXPECT_EQ(EpochOrder(c, 5000, 7)[p], all[p]);
    }
}

TEST(EpochOrder, ParseNamesAndRejectsUnknown) {
    EXPECT_EQ(parse_order("chunk"), Order::chunk);
    EXPECT_EQ(order_name(parse_order("full")), "full");
    try {
        parse_order("random");
        FAIL();
    } catch (const dstk::Error& e) {
        EXPECT_EQ(e.code(), dstk::ExitCode::usage);
        EXPECT_NE(std::string(e.what()).find("invalid order 'random'"), std::string::npos) << e.what();
    }
    try { // a tool names its flag
        parse_order("random", "--order");
        FAIL();
    } catch (const dstk::Error& e) {
        EXPECT_NE(std::string(e.what()).find("invalid --order 'random'"), std::string::npos) << e.what();
    }
}
