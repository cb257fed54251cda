// The mix's batch source on the cpu backend: the members' arrays at each
// row's (dataset, index), the quotas' shares, no sample twice, exact resume
// (also with changed weights and an added member), rank slices, and the same
// batches whatever the placements and readers.
#include <gtest/gtest.h>

#include <cstring>
#include <set>

#include "dstk/data/mix_source.hpp"
#include "support/test_dataset.hpp"

using namespace dstk;
using namespace dstk::data;
using namespace dstk::test_support;

namespace {

// Member m's sample i: v = m * 100,000 + i (i32); x = u8[3] {i, i >> 8, m}.
// Sizes 300, 170, 410, 90; x stored zstd-chunked in member 1.
std::int32_t value(std::size_t m, std::uint64_t i) {
    return static_cast<std::int32_t>(m * 100000 + i);
}

const std::vector<Dataset>& datasets() {
    static const std::vector<Dataset> ds = [] {
        std::vector<Dataset> out;
        const std::vector<std::uint64_t> sizes{300, 170, 410, 90};
        for (std::size_t m = 0; m < sizes.size(); ++m) {
            FieldsDataset d;
            d.fields = {{"v", DType::i32, Shape{}}, {"x", DType::u8, Shape{{3}}, m == 1 ? 32u : 0u}};
            d.splits = {{"train", sizes[m]}};
            d.input_field = "x";
            const auto dir = write_fields_dataset(temp_path("mix_source", "m" + std::to_string(m)), d,
                                                  [m](std::size_t f, std::uint64_t i, std::span<std::uint8_t> b) {
                                                      if (f == 0) {
                                                          const std::int32_t v = value(m, i);
                                                          std::memcpy(b.data(), &v, 4);
                                                      } else {
                                                          b[0] = static_cast<std::uint8_t>(i),
                                                          b[1] = static_cast<std::uint8_t>(i >> 8);
                                                          b[2] = static_cast<std::uint8_t>(m);
                                                      }
                                                  });
            out.push_back(Dataset::open(dir));
        }
        return out;
    }();
    return ds;
}

std::vector<const Dataset*> members(std::size_t n = 4) {
    std::vector<const Dataset*> out;
    for (std::size_t i = 0; i < n; ++i) out.push_back(&datasets()[i]);
    return out;
}

struct MixSetup {
    std::vector<double> weights;
    std::vector<MixPlacement> placements{MixPlacement::device, MixPlacement::host, MixPlacement::stream,
                                         MixPlacement::stream};
    std::uint32_t batch = 16;
    bool drop_last = true;
    unsigned readers = 2;
    RankSlice slice;
    std::size_t members = 4;
    Order order = Order::chunk;
};

MixPlan plan_of(const MixSetup& s) {
    MixRequest r;
    r.source.device = {Backend::cpu, 0};
    r.source.fields = {"v", "dataset", "x", "index"};
    r.source.batch = s.batch;
    r.source.chunk_samples = 24;
    r.source.window = 2;
    r.source.prefetch = 2;
    r.source.readers = s.readers;
    r.source.seed = 9;
    r.source.order = s.order;
    r.source.drop_last = s.drop_last;
    r.source.slice = s.slice;
    r.source.hash_batches = true;
    r.weights = s.weights;
    r.placements = std::vector<MixPlacement>(s.placements.begin(), s.placements.begin() + s.members);
    MachineFacts m;
    m.host_available = 8ull << 30;
    m.hardware_threads = 4;
    return plan_mix(members(s.members), r, m);
}

struct Row {
    std::int32_t dataset = 0;
    std::int64_t index = 0;
    bool operator<(const Row& o) const { return std::tie(dataset, index) < std::tie(o.dataset, o.index); }
    bool operator==(const Row&) const = default;
};

// The rows of one batch, checked against the members' arrays.
std::vector<Row> rows_of(const Batch& b) {
    std::vector<Row> out;
    const auto* v = static_cast<const std::int32_t*>(b.field("v").data);
    const auto* d = static_cast<const std::int32_t*>(b.field("dataset").data);
    const auto* x = static_cast<const std::uint8_t*>(b.field("x").data);
    const auto* ix = static_cast<const std::int64_t*>(b.field("index").data);
    for (std::uint32_t j = 0; j < b.size; ++j) {
        EXPECT_EQ(v[j], value(static_cast<std::size_t>(d[j]), static_cast<std::uint64_t>(ix[j]))) << "row " << j;
        EXPECT_EQ(x[3 * j], static_cast<std::uint8_t>(ix[j]));
        EXPECT_EQ(x[3 * j + 1], static_cast<std::uint8_t>(ix[j] >> 8));
        EXPECT_EQ(x[3 * j + 2], static_cast<std::uint8_t>(d[j]));
        out.push_back({d[j], ix[j]});
    }
    return out;
}

// Every batch from `first` to the end of the epoch.
std::vector<std::vector<Row>> rest_of_epoch(MixSource& s) {
    std::vector<std::vector<Row>> out;
    while (const Batch* b = s.next()) {
        out.push_back(rows_of(*b));
        s.release();
    }
    return out;
}

std::vector<std::vector<Row>> run(MixSource& s, std::uint64_t epoch, std::uint64_t first = 0) {
    s.start_epoch(epoch, first);
    return rest_of_epoch(s);
}

} // namespace

TEST(MixSource, EveryRowIsItsMembersSampleAndTheSharesAreTheQuotas) {
    MixSetup s;
    s.weights = {3, 1, 1, 2};
    s.drop_last = false;
    const MixPlan plan = plan_of(s);
    auto src = make_mix_source(members(), plan);
    for (std::uint64_t epoch : {0, 1}) {
        const auto batches = run(*src, epoch);
        EXPECT_EQ(batches.size(), plan.batches);
        std::set<Row> seen;
        std::vector<std::uint64_t> counts(4, 0);
        for (const auto& b : batches)
            for (const Row& r : b) {
                EXPECT_TRUE(seen.insert(r).second) << "member " << r.dataset << " row " << r.index << " twice";
                counts[static_cast<std::size_t>(r.dataset)] += 1;
            }
        for (std::size_t m = 0; m < 4; ++m) EXPECT_EQ(counts[m], plan.members[m].quota) << "member " << m;
        EXPECT_EQ(src->delivered(), counts);
        // Each batch holds each member's share to within a sample per tree level.
        for (const auto& b : batches) {
            if (b.size() < s.batch) continue;
            std::vector<double> in(4, 0);
            for (const Row& r : b) in[static_cast<std::size_t>(r.dataset)] += 1;
            for (std::size_t m = 0; m < 4; ++m) EXPECT_NEAR(in[m], plan.members[m].share * s.batch, 2.0);
        }
    }
}

TEST(MixSource, TheEpochsDiffer) {
    const MixPlan plan = plan_of({});
    auto src = make_mix_source(members(), plan);
    EXPECT_NE(run(*src, 0), run(*src, 1));
}

TEST(MixSource, ResumingAtEveryBatchEqualsTheUninterruptedRun) {
    const MixPlan plan = plan_of({});
    auto src = make_mix_source(members(), plan);
    const auto whole = run(*src, 2);
    ASSERT_EQ(whole.size(), plan.batches);
    for (std::uint64_t k = 0; k < whole.size(); ++k) {
        auto fresh = make_mix_source(members(), plan);
        const auto rest = run(*fresh, 2, k);
        ASSERT_EQ(rest.size(), whole.size() - k) << "from batch " << k;
        for (std::size_t i = 0; i < rest.size(); ++i) ASSERT_EQ(rest[i], whole[k + i]) << "from batch " << k;
    }
}

TEST(MixSource, TheBatchesDoNotDependOnPlacementsOrReaders) {
    MixSetup a;
    MixSetup b;
    b.placements = {MixPlacement::stream, MixPlacement::device, MixPlacement::device, MixPlacement::host};
    b.readers = 1;
    auto sa = make_mix_source(members(), plan_of(a));
    auto sb = make_mix_source(members(), plan_of(b));
    sa->start_epoch(1, 0);
    sb->start_epoch(1, 0);
    EXPECT_EQ(rest_of_epoch(*sa), rest_of_epoch(*sb));
    const auto ha = sa->take_times().batch_hash, hb = sb->take_times().batch_hash;
    ASSERT_TRUE(ha.has_value());
    EXPECT_EQ(ha, hb);
    // Another epoch, other batches: another hash.
    sa->start_epoch(2, 0);
    (void)rest_of_epoch(*sa);
    EXPECT_NE(sa->take_times().batch_hash, ha);
}

TEST(MixSource, RankSlicesTakeTheirGlobalBatches) {
    const auto whole = run(*make_mix_source(members(), plan_of({})), 0);
    for (std::uint32_t rank : {0u, 1u}) {
        MixSetup s;
        s.slice = {rank, 2};
        const auto mine = run(*make_mix_source(members(), plan_of(s)), 0);
        ASSERT_EQ(mine.size(), whole.size() / 2);
        for (std::size_t k = 0; k < mine.size(); ++k) EXPECT_EQ(mine[k], whole[2 * k + rank]) << "rank " << rank;
    }
}

// A run stopped at batch k and resumed with `after` (other weights or more
// members) takes no sample twice, and each member's total is its new quota.
void expect_resumed_without_repeats(const MixSetup& before, const MixSetup& after, std::uint64_t k) {
    const MixPlan p1 = plan_of(before);
    auto s1 = make_mix_source(members(before.members), p1);
    s1->start_epoch(3, 0);
    std::set<Row> seen;
    std::vector<std::uint64_t> counts(after.members, 0);
    for (std::uint64_t i = 0; i < k; ++i) {
        const Batch* b = s1->next();
        ASSERT_NE(b, nullptr);
        for (const Row& r : rows_of(*b)) {
            seen.insert(r);
            counts[static_cast<std::size_t>(r.dataset)] += 1;
        }
        s1->release();
    }
    const MixPlan p2 = plan_of(after);
    const MixOrder order = s1->order().resumed(k * before.batch, p2.order_members());
    auto s2 = make_mix_source(members(after.members), p2);
    s2->resume_epoch(order, 3, k);
    for (const auto& b : rest_of_epoch(*s2))
        for (const Row& r : b) {
            EXPECT_TRUE(seen.insert(r).second) << "member " << r.dataset << " row " << r.index << " twice";
            counts[static_cast<std::size_t>(r.dataset)] += 1;
        }
    const std::vector<std::uint64_t> total = order.taken(order.size());
    std::uint64_t sum = 0;
    for (std::size_t m = 0; m < after.members; ++m) sum += counts[m];
    // drop_last leaves at most a partial batch's draws out.
    EXPECT_GT(sum + after.batch, order.size());
    for (std::size_t m = 0; m < after.members; ++m) EXPECT_LE(counts[m], total[m]) << "member " << m;
}

TEST(MixSource, ResumingWithOtherWeightsTakesNoSampleTwice) {
    MixSetup before, after;
    before.weights = {1, 1, 1, 1};
    after.weights = {1, 4, 1, 2};
    for (std::uint64_t k : {1u, 7u, 15u}) expect_resumed_without_repeats(before, after, k);
}

TEST(MixSource, ResumingWithAnAddedMemberTakesNoSampleTwice) {
    MixSetup before, after;
    before.members = 3;
    after.members = 4;
    for (std::uint64_t k : {0u, 5u, 20u}) expect_resumed_without_repeats(before, after, k);
}

TEST(MixSource, TheFullOrderAndPartialLastBatchesToo) {
    MixSetup s;
    s.order = Order::full;
    s.drop_last = false;
    s.batch = 23;
    const MixPlan plan = plan_of(s);
    auto src = make_mix_source(members(), plan);
    const auto whole = run(*src, 4);
    std::uint64_t n = 0;
    for (const auto& b : whole) n += b.size();
    EXPECT_EQ(n, plan.positions);
    const auto rest = run(*make_mix_source(members(), plan), 4, whole.size() - 1);
    ASSERT_EQ(rest.size(), 1u);
    EXPECT_EQ(rest[0], whole.back());
}
