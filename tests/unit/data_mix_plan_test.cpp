// plan_mix: each member placed once by the rule of mix_plan.hpp, for given
// budgets on a machine of given facts.
#include <gtest/gtest.h>

#include <numeric>

#include <nlohmann/json.hpp>

#include "dstk/data/mix_plan.hpp"
#include "dstk/error.hpp"
#include "support/error_of.hpp"
#include "support/test_dataset.hpp"

using namespace dstk;
using namespace dstk::data;
using namespace dstk::test_support;

namespace {

// Four members of 1,000, 2,000, 500 and 4,000 samples of u8[1x32x32] + i32
// (1,028 bytes a sample).
struct Members {
    std::vector<Dataset> ds;
    std::vector<const Dataset*> ptrs;
    std::vector<std::uint64_t> bytes;
};

const Members& members() {
    static const Members m = [] {
        Members out;
        const std::vector<std::uint64_t> sizes{1000, 2000, 500, 4000};
        for (std::size_t i = 0; i < sizes.size(); ++i) {
            const auto dir = temp_path("mix_plan", "m" + std::to_string(i));
            write_u8_dataset(dir, Shape{{1, 32, 32}}, {{"train", sizes[i]}}, 10,
                             [i](std::uint64_t k, std::span<std::uint8_t> b) {
                                 for (auto& v : b) v = static_cast<std::uint8_t>(k + i);
                                 return static_cast<std::int32_t>(k % 10);
                             });
            out.ds.push_back(Dataset::open(dir));
            out.bytes.push_back(sizes[i] * 1028);
        }
        for (const Dataset& d : out.ds) out.ptrs.push_back(&d);
        return out;
    }();
    return m;
}

MixRequest request(std::vector<double> weights = {}, std::uint64_t host_mem = 0) {
    MixRequest r;
    r.source.device = {Backend::cpu, 0};
    r.source.fields = {"x", "y"};
    r.source.batch = 32;
    r.source.chunk_samples = 64;
    r.source.window = 3;
    r.source.prefetch = 3;
    r.source.readers = 2;
    r.source.seed = 5;
    r.source.host_mem = host_mem;
    r.weights = std::move(weights);
    return r;
}

MachineFacts machine(std::uint64_t available) {
    MachineFacts m;
    m.host_available = available;
    m.hardware_threads = 4;
    return m;
}

std::vector<MixPlacement> placements(const MixPlan& p) {
    std::vector<MixPlacement> out;
    for (const MixMemberPlan& m : p.members) out.push_back(m.placement);
    return out;
}

constexpr auto D = MixPlacement::device, H = MixPlacement::host, S = MixPlacement::stream;

} // namespace

TEST(MixPlan, EverythingOnTheDeviceWhenItFits) {
    const MixPlan p = plan_mix(members().ptrs, request(), machine(8ull << 30));
    EXPECT_EQ(placements(p), (std::vector<MixPlacement>{D, D, D, D}));
    std::uint64_t host = 0, device = 0;
    for (const MixMemberPlan& m : p.members) {
        EXPECT_EQ(m.source.config.placement, Placement::device);
        host += m.host_bytes, device += m.source.device_bytes;
    }
    // The cpu backend's batches are host memory: the mix's staging and slot count in both.
    EXPECT_GT(p.mix_bytes, 0u);
    EXPECT_EQ(p.host_bytes, host + p.mix_bytes);
    EXPECT_EQ(p.device_bytes, device + p.mix_bytes);
    // Default weights: the sizes, every sample once.
    EXPECT_EQ(p.positions, 7500u);
    EXPECT_EQ(p.batches, 7500u / 32);
    EXPECT_NEAR(p.members[3].share, 4000.0 / 7500, 1e-12);
}

TEST(MixPlan, TheDeviceRoomTakesTheMembersDrawnMostForTheirSize) {
    // Equal weights: rows per byte rank members 2, 0, 1, 3. The cpu device
    // room (half of 1.2 MB) holds member 2 (514,000 B) and nothing more; a
    // large budget keeps the others in the page cache.
    const MixPlan p = plan_mix(members().ptrs, request({1, 1, 1, 1}, 64ull << 20), machine(1200000));
    EXPECT_EQ(placements(p), (std::vector<MixPlacement>{H, H, D, H}));
    for (std::size_t i : {0, 1, 3}) {
        const MixMemberPlan& m = p.members[i];
        EXPECT_EQ(m.source.config.placement, Placement::stream);
        EXPECT_FALSE(m.source.config.direct);
        EXPECT_FALSE(m.source.config.host.drop_pages);
        EXPECT_EQ(m.host_bytes, m.source.host_bytes + members().bytes[i]);
    }
    EXPECT_EQ(p.host_budget, 64ull << 20);
}

TEST(MixPlan, TheHostBudgetKeepsTheMembersDrawnMostForTheirSize) {
    // No device room (half of 1 MB holds no member). With every member
    // streamed the sources take S; a budget of S + members 2 and 0 + half of
    // member 1 keeps 2 and 0 in the page cache and streams 1 and 3.
    const MachineFacts m = machine(1000000);
    MixRequest all_stream = request({1, 1, 1, 1}, 64ull << 20);
    all_stream.placements = {S};
    const MixPlan streamed = plan_mix(members().ptrs, all_stream, m);
    EXPECT_EQ(placements(streamed), (std::vector<MixPlacement>{S, S, S, S}));
    for (const MixMemberPlan& mp : streamed.members) EXPECT_TRUE(mp.source.config.direct);
    const std::uint64_t budget = streamed.host_bytes + members().bytes[2] + members().bytes[0] + members().bytes[1] / 2;
    MixRequest r = request({1, 1, 1, 1}, budget);
    const MixPlan p = plan_mix(members().ptrs, r, m);
    EXPECT_EQ(placements(p), (std::vector<MixPlacement>{H, S, H, S}));
    EXPECT_LE(p.host_bytes, budget);
    EXPECT_EQ(p.host_bytes, p.mix_bytes + std::accumulate(p.members.begin(), p.members.end(), std::uint64_t{0},
                                                          [](std::uint64_t s, const MixMemberPlan& mp) {
                                                              return s + mp.host_bytes;
                                                          }));
    EXPECT_EQ(p.members[1].host_bytes, p.members[1].source.host_bytes);
}

TEST(MixPlan, PlacementsGivenPerMemberWin) {
    MixRequest r = request({}, 64ull << 20);
    r.placements = {S, D, H, MixPlacement::automatic};
    const MixPlan p = plan_mix(members().ptrs, r, machine(8ull << 30));
    EXPECT_EQ(placements(p), (std::vector<MixPlacement>{S, D, H, D}));
    EXPECT_NE(p.members[0].why.find("placement stream"), std::string::npos);
}

TEST(MixPlan, StreamsAboveTheBudgetDoNotFit) {
    MixRequest r = request({}, 256 << 10);
    r.placements = {S};
    EXPECT_EQ(code_of([&] { plan_mix(members().ptrs, r, machine(8ull << 30)); }), ExitCode::no_fit);
}

TEST(MixPlan, TheDatasetFieldIsAnInt32AtItsPlace) {
    MixRequest r = request();
    r.source.fields = {"y", "dataset", "x"};
    const MixPlan p = plan_mix(members().ptrs, r, machine(8ull << 30));
    ASSERT_EQ(p.fields.size(), 3u);
    EXPECT_EQ(p.fields[0].name, "y");
    EXPECT_EQ(p.fields[1].name, "dataset");
    EXPECT_EQ(p.fields[1].dtype, DType::i32);
    EXPECT_EQ(p.fields[2].name, "x");
    // The members' sources deliver the stored fields only.
    EXPECT_EQ(p.members[0].source.fields.size(), 2u);
}

TEST(MixPlan, UsageErrorsNameTheMemberAndTheSetting) {
    const auto other = write_fields_dataset(
        temp_path("mix_plan", "other"),
        {{{"x", DType::u8, Shape{{1, 32, 32}}}, {"z", DType::i32, Shape{}}}, {{"train", 100}}, "x", "z"},
        [](std::size_t, std::uint64_t, std::span<std::uint8_t> b) { std::fill(b.begin(), b.end(), std::uint8_t{1}); });
    const Dataset o = Dataset::open(other);
    std::vector<const Dataset*> mixed{members().ptrs[0], &o};
    const std::string missing = error_of([&] { plan_mix(mixed, request(), machine(8ull << 30)); });
    EXPECT_NE(missing.find("member 1 (" + other.string() + ") has no field 'y'"), std::string::npos) << missing;
    EXPECT_EQ(code_of([&] { plan_mix(mixed, request(), machine(8ull << 30)); }), ExitCode::usage);

    MixRequest x_only = request();
    x_only.source.fields = {"x"};
    const auto small = temp_path("mix_plan", "small");
    write_u8_dataset(small, Shape{{1, 8, 8}}, {{"train", 100}}, 10,
                     [](std::uint64_t, std::span<std::uint8_t>) { return 0; });
    const Dataset sm = Dataset::open(small);
    const std::string shape = error_of([&] { plan_mix({members().ptrs[0], &sm}, x_only, machine(8ull << 30)); });
    EXPECT_NE(shape.find("holds field 'x' as u8[1x8x8] but member 0"), std::string::npos) << shape;

    const std::string weights = error_of([&] { plan_mix(members().ptrs, request({1, 2}), machine(8ull << 30)); });
    EXPECT_NE(weights.find("weights lists 2 weights for 4 datasets"), std::string::npos) << weights;

    MixRequest bad = request();
    bad.placements = {D, S};
    EXPECT_EQ(code_of([&] { plan_mix(members().ptrs, bad, machine(8ull << 30)); }), ExitCode::usage);
    EXPECT_EQ(code_of([&] { plan_mix({}, request(), machine(8ull << 30)); }), ExitCode::usage);
    EXPECT_EQ(code_of([&] { plan_mix(members().ptrs, request({1, 0, 1, 1}), machine(8ull << 30)); }), ExitCode::usage);
    MixRequest names = request({1, 2});
    names.source.names = [](std::string_view s) { return "--" + std::string(s); };
    EXPECT_NE(error_of([&] { plan_mix(members().ptrs, names, machine(8ull << 30)); }).find("--weights"),
              std::string::npos);
}

TEST(MixPlan, AMemberWithItsOwnDatasetFieldCannotAskForTheMixs) {
    const auto own = write_fields_dataset(
        temp_path("mix_plan", "own"),
        {{{"x", DType::u8, Shape{{1, 32, 32}}}, {"y", DType::i32, Shape{}}, {"dataset", DType::i32, Shape{}}},
         {{"train", 100}},
         "x",
         "y"},
        [](std::size_t, std::uint64_t, std::span<std::uint8_t> b) { std::fill(b.begin(), b.end(), std::uint8_t{0}); });
    const Dataset o = Dataset::open(own);
    MixRequest r = request();
    r.source.fields = {"x", "dataset"};
    const std::string e = error_of([&] { plan_mix({members().ptrs[0], &o}, r, machine(8ull << 30)); });
    EXPECT_NE(e.find("has its own field 'dataset'"), std::string::npos) << e;
    r.source.fields = {"x", "y"};
    EXPECT_NO_THROW(plan_mix({members().ptrs[0], &o}, r, machine(8ull << 30)));
}

TEST(MixPlan, DescribedOneLinePerMemberAndAsJson) {
    MixRequest r = request({2, 1, 1, 1}, 64ull << 20);
    r.placements = {D, H, S, MixPlacement::automatic};
    const MixPlan p = plan_mix(members().ptrs, r, machine(8ull << 30));
    const std::vector<std::string> lines = describe_mix(p);
    ASSERT_EQ(lines.size(), 5u);
    EXPECT_NE(lines[0].find(": device,"), std::string::npos) << lines[0];
    EXPECT_NE(lines[1].find(": host,"), std::string::npos) << lines[1];
    EXPECT_NE(lines[2].find(": stream,"), std::string::npos) << lines[2];
    EXPECT_NE(lines[4].find("host ceiling"), std::string::npos) << lines[4];
    const nlohmann::json j = mix_plan_json(p);
    EXPECT_EQ(j["members"].size(), 4u);
    EXPECT_EQ(j["members"][1]["placement"], "host");
    EXPECT_EQ(j["host_bytes"], p.host_bytes);
    EXPECT_EQ(j["members"][0]["weight"], 2.0);
}

TEST(MixPlan, MemberKeysFollowTheContentsNotThePath) {
    const Members& m = members();
    EXPECT_NE(mix_member_key(m.ds[0]), mix_member_key(m.ds[1]));
    const auto copy = temp_path("mix_plan", "copy");
    std::filesystem::copy(m.ds[0].dir(), copy);
    EXPECT_EQ(mix_member_key(Dataset::open(copy)), mix_member_key(m.ds[0]));
}

TEST(MixPlan, MembersWithTheSameTestSplitMixTheirTestSplits) {
    // dsgen with one seed writes the same test split beside different train
    // splits: the members are still two datasets.
    std::vector<Dataset> ds;
    for (std::uint64_t n : {200u, 300u}) {
        const auto dir = temp_path("mix_plan", "same_test" + std::to_string(n));
        write_u8_dataset(dir, Shape{{1, 32, 32}}, {{"train", n}, {"test", 50}}, 10,
                         [](std::uint64_t k, std::span<std::uint8_t> b) {
                             std::fill(b.begin(), b.end(), static_cast<std::uint8_t>(k));
                             return 0;
                         });
        ds.push_back(Dataset::open(dir));
    }
    EXPECT_NE(mix_member_key(ds[0]), mix_member_key(ds[1]));
    MixRequest r = request();
    r.source.split = "test";
    r.source.drop_last = false;
    const MixPlan p = plan_mix({&ds[0], &ds[1]}, r, machine(8ull << 30));
    EXPECT_EQ(p.positions, 100u);
}
