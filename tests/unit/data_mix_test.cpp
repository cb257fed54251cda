#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <map>
#include <numeric>
#include <vector>

#include "dstk/data/mix.hpp"
#include "dstk/error.hpp"

using namespace dstk;
using namespace dstk::data;

namespace {

std::vector<MixMember> members(const std::vector<std::uint64_t>& sizes, const std::vector<double>& weights = {}) {
    std::vector<MixMember> out;
    for (std::size_t i = 0; i < sizes.size(); ++i)
        out.push_back({"m" + std::to_string(i), 1000 + i, sizes[i],
                       weights.empty() ? static_cast<double>(sizes[i]) : weights[i]});
    return out;
}

// Per member (by key), the local draws in position order over [first, end).
std::map<std::uint64_t, std::vector<std::uint64_t>> draws(const MixOrder& o, std::uint64_t first, std::uint64_t end) {
    std::map<std::uint64_t, std::vector<std::uint64_t>> out;
    for (std::uint64_t p = first; p < end; ++p) {
        const MixDraw d = o[p];
        out[o.keys().at(d.member)].push_back(d.local);
    }
    return out;
}

// Each member's draws are 0, 1, 2, ... in position order: no repeat, no gap.
void expect_contiguous(const std::map<std::uint64_t, std::vector<std::uint64_t>>& d) {
    for (const auto& [key, locals] : d)
        for (std::size_t i = 0; i < locals.size(); ++i) ASSERT_EQ(locals[i], i) << "member key " << key;
}

} // namespace

TEST(MixOrder, QuotasSeeTheMemberWithTheLargestWeightPerSampleOnce) {
    EXPECT_EQ(mix_quotas(members({1000, 300, 50})), (std::vector<std::uint64_t>{1000, 300, 50}));
    EXPECT_EQ(mix_quotas(members({1000, 1000, 1000}, {2, 1, 1})), (std::vector<std::uint64_t>{1000, 500, 500}));
    // Member 1 has the largest weight per sample: it is seen once, the others in proportion.
    EXPECT_EQ(mix_quotas(members({1000, 100, 400}, {1, 1, 1})), (std::vector<std::uint64_t>{100, 100, 100}));
    EXPECT_EQ(mix_quotas(members({10, 7}, {1, 3})), (std::vector<std::uint64_t>{2, 7}));
}

TEST(MixOrder, EveryRunOfPositionsHoldsEachMembersShare) {
    const auto ms = members({5000, 1200, 777, 3001, 64}, {3, 1, 1, 2, 0.5});
    const std::vector<std::uint64_t> k = mix_quotas(ms);
    const MixOrder o(42, 3, ms);
    const std::uint64_t total = o.size();
    ASSERT_EQ(total, std::accumulate(k.begin(), k.end(), std::uint64_t{0}));
    const std::uint64_t batch = 64;
    const double depth = 3; // levels of a tree over 5 members
    for (std::uint64_t b = 0; b + batch <= total; b += batch) {
        std::vector<std::uint64_t> seen(ms.size(), 0);
        for (std::uint64_t p = b; p < b + batch; ++p) ++seen[o[p].member];
        for (std::size_t m = 0; m < ms.size(); ++m) {
            const double share = static_cast<double>(k[m]) * batch / static_cast<double>(total);
            ASSERT_LE(std::abs(static_cast<double>(seen[m]) - share), depth + 1) << "batch at " << b << " member " << m;
        }
    }
    const auto d = draws(o, 0, total);
    expect_contiguous(d);
    for (std::size_t m = 0; m < ms.size(); ++m) EXPECT_EQ(d.at(ms[m].key).size(), k[m]);
}

TEST(MixOrder, IsAPureFunctionOfSeedAndEpoch) {
    // Where a small member's draws fall moves with (seed, epoch); which of its
    // samples they are is its own EpochOrder's business.
    const auto ms = members({3000, 2999, 7});
    const MixOrder a(7, 1, ms), b(7, 1, ms), c(7, 2, ms), d(8, 1, ms);
    std::uint64_t differ_epoch = 0, differ_seed = 0;
    for (std::uint64_t p = 0; p < a.size(); ++p) {
        ASSERT_EQ(a[p].member, b[p].member);
        ASSERT_EQ(a[p].local, b[p].local);
        differ_epoch += a[p].member != c[p].member;
        differ_seed += a[p].member != d[p].member;
    }
    EXPECT_GT(differ_epoch, 0u);
    EXPECT_GT(differ_seed, 0u);
    // Rebuilt from its segments (a checkpoint), the order is the same.
    const MixOrder r(7, 1, a.segments());
    for (std::uint64_t p = 0; p < a.size(); ++p) ASSERT_EQ(r[p].member, a[p].member);
}

TEST(MixOrder, TakenCountsTheDrawsBeforeAPosition) {
    const MixOrder o(5, 0, members({400, 130, 90}, {1, 2, 1}));
    std::vector<std::uint64_t> count(3, 0);
    for (std::uint64_t p = 0; p <= o.size(); ++p) {
        ASSERT_EQ(o.taken(p), count) << "position " << p;
        if (p < o.size()) ++count[o[p].member];
    }
}

TEST(MixOrder, ResumedWithNewWeightsNeitherRepeatsNorSkips) {
    const auto before = members({1000, 1000, 1000}, {1, 1, 1});
    const auto after = members({1000, 1000, 1000}, {4, 1, 2});
    const MixOrder o(11, 2, before);
    for (const std::uint64_t at : {std::uint64_t{0}, std::uint64_t{256}, std::uint64_t{1337}, o.size()}) {
        const MixOrder r = o.resumed(at, after);
        // Before the resume point the order is unchanged.
        for (std::uint64_t p = 0; p < at; ++p) ASSERT_EQ(r[p].member, o[p].member);
        const auto d = draws(r, 0, r.size());
        expect_contiguous(d);
        const std::vector<std::uint64_t> had = o.taken(at), quota = mix_quotas(after);
        for (std::size_t m = 0; m < 3; ++m)
            EXPECT_EQ(d.count(after[m].key) ? d.at(after[m].key).size() : 0, std::max(had[m], quota[m]))
                << "member " << m << " resumed at " << at;
        // Resumed again later with the same members: the same order (exact resume).
        const MixOrder again = r.resumed(std::min<std::uint64_t>(at + 100, r.size()), after);
        EXPECT_EQ(again.segments(), r.segments());
    }
}

TEST(MixOrder, AMemberAddedAtResumeStartsItsOwnDrawsFromZero) {
    auto ms = members({500, 500});
    const MixOrder o(3, 0, ms);
    ms.push_back({"added", 77, 800, 800.0});
    const MixOrder r = o.resumed(300, ms);
    EXPECT_EQ(r.keys().back(), 77u);
    EXPECT_EQ(r.taken(300), (std::vector<std::uint64_t>{o.taken(300)[0], o.taken(300)[1], 0}));
    const auto d = draws(r, 0, r.size());
    expect_contiguous(d);
    EXPECT_EQ(d.at(77).size(), 800u);
    EXPECT_EQ(d.at(ms[0].key).size(), 500u);
    // A member that leaves keeps what it had and is dealt nothing more.
    const MixOrder gone = r.resumed(400, {ms[0], ms[2]});
    const auto g = draws(gone, 400, gone.size());
    EXPECT_EQ(g.count(ms[1].key), 0u);
}

TEST(MixOrder, UnchangedMembersResumeAsTheSameOrder) {
    const auto ms = members({640, 320});
    const MixOrder o(1, 4, ms);
    EXPECT_EQ(o.resumed(128, ms).segments(), o.segments());
}

TEST(MixOrder, RefusesMembersThatCannotMix) {
    EXPECT_THROW(mix_quotas({}), Error);
    EXPECT_THROW(mix_quotas(members({10, 0})), Error);
    EXPECT_THROW(mix_quotas(members({10, 10}, {1, 0})), Error);
    EXPECT_THROW(mix_quotas(members({10, 10}, {1, NAN})), Error);
    auto twice = members({10, 10});
    twice[1].key = twice[0].key;
    EXPECT_THROW(mix_quotas(twice), Error);
    std::vector<MixSegment> bad(1);
    bad[0].start = 5;
    EXPECT_THROW(MixOrder(0, 0, bad), Error);
}
