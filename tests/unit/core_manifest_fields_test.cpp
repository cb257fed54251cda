// The manifest's fields beyond x and y: per-field statistics (written, read,
// checked, found by Manifest::stats_of), roles that are optional, and the
// channel rule and sums the statistics are made of (channel_stats.hpp).
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>

#include "dstk/channel_stats.hpp"
#include "dstk/error.hpp"
#include "dstk/manifest.hpp"
#include "dstk/shard.hpp"

using namespace dstk;

namespace {

FieldInfo field(const std::string& name, DType t, Shape s, std::uint64_t samples) {
    FieldInfo f;
    f.name = name;
    f.dtype = t;
    f.shape = std::move(s);
    f.file = "train_" + name + ".npy";
    f.bytes = 128 + f.sample_bytes() * samples;
    return f;
}

// The chess set of issue 24 with the roles set, statistics on positions.
Manifest chess() {
    Manifest m;
    m.input_field = "positions";
    m.label_field = "moves";
    m.num_classes = 4672;
    FieldInfo pos = field("positions", DType::i8, Shape{{12, 8, 8}}, 10);
    pos.stats = ChannelStats{std::vector<double>(12, 0.25), std::vector<double>(12, 0.5)};
    m.splits.push_back(
        {"train", 10, {pos, field("moves", DType::i32, Shape{}, 10), field("results", DType::i8, Shape{}, 10)}});
    return m;
}

std::string error_of(const std::string& text) {
    try {
        parse_manifest(text, "m.json");
    } catch (const Error& e) {
        EXPECT_EQ(e.code(), ExitCode::failure);
        return e.what();
    }
    return "";
}

} // namespace

TEST(ManifestFields, PerFieldStatsRoundTrip) {
    Manifest m = chess();
    FieldInfo robs = field("robs", DType::f32, Shape{{120}}, 10);
    robs.stats = ChannelStats{std::vector<double>(120, 0.1), std::vector<double>(120, 1.0 / 3)};
    m.splits[0].fields.push_back(robs);
    const std::string text = serialize_manifest(m);
    const Manifest back = parse_manifest(text, "dataset.json");
    const FieldInfo& r = back.splits[0].field("robs");
    ASSERT_TRUE(r.stats);
    EXPECT_EQ(r.stats->mean, robs.stats->mean);
    EXPECT_EQ(r.stats->std, robs.stats->std); // doubles exact
    EXPECT_FALSE(back.splits[0].field("moves").stats);
    EXPECT_EQ(serialize_manifest(back), text);
    // Only the two fields with statistics write a "stats" key (no top-level one was set).
    std::size_t keys = 0;
    for (auto at = text.find("\"stats\""); at != std::string::npos; at = text.find("\"stats\"", at + 1)) ++keys;
    EXPECT_EQ(keys, 2u);
}

TEST(ManifestFields, StatsOfPrefersTheFieldsOwn) {
    Manifest m = chess();
    EXPECT_EQ(m.stats_of("positions")->mean.size(), 12u);
    EXPECT_EQ(m.stats_of("moves"), nullptr);
    EXPECT_EQ(m.stats_of("nothing"), nullptr);
    // An old manifest: top-level statistics only, for the input field.
    m.splits[0].fields[0].stats.reset();
    m.stats = ChannelStats{std::vector<double>(12, 1), std::vector<double>(12, 2)};
    ASSERT_NE(m.stats_of("positions"), nullptr);
    EXPECT_EQ(m.stats_of("positions")->std[0], 2);
    EXPECT_EQ(m.stats_of("results"), nullptr);
    // A split named otherwise: the first split's statistics.
    m.splits[0].name = "fit";
    m.splits[0].fields[2].stats = ChannelStats{{3}, {4}};
    EXPECT_EQ(m.stats_of("results")->mean[0], 3);
}

TEST(ManifestFields, UnusableStatsAreRejected) {
    const auto with_stats = [](const std::string& stats) {
        Manifest m = chess();
        m.splits[0].fields[0].stats.reset();
        std::string text = serialize_manifest(m);
        const std::string at = "\"name\": \"results\",";
        text.insert(text.find(at) + at.size(), "\"stats\": " + stats + ",");
        return text;
    };
    EXPECT_EQ(error_of(with_stats(R"({"mean": [0.5], "std": [1]})")), "");
    EXPECT_NE(error_of(with_stats(R"({"mean": [0.5], "std": [0]})")).find("std must be positive"), std::string::npos);
    EXPECT_NE(error_of(with_stats(R"({"mean": [0.5], "std": [-1]})")).find("channel 0"), std::string::npos);
    EXPECT_NE(error_of(with_stats(R"({"mean": [0.5, 1], "std": [1, 1]})")).find("expected 1 channels"),
              std::string::npos);
    EXPECT_NE(error_of(with_stats(R"({"mean": [0.5]})")).find("missing \"std\""), std::string::npos);
    EXPECT_NE(error_of(with_stats(R"({"mean": ["a"], "std": [1]})")).find("expected numbers"), std::string::npos);
}

TEST(ManifestFields, RolesAreOptional) {
    Manifest m = chess();
    m.input_field.clear();
    m.label_field.clear();
    const std::string text = serialize_manifest(m);
    EXPECT_NE(text.find("\"input_field\": \"\""), std::string::npos);
    const Manifest back = parse_manifest(text, "dataset.json");
    EXPECT_EQ(back.input_field, "");
    EXPECT_EQ(back.label_field, "");
    // A tool asking for a role the dataset does not give: a usage error naming the fields.
    try {
        (void)back.splits[0].field(back.input_field);
        ADD_FAILURE();
    } catch (const Error& e) {
        EXPECT_EQ(e.code(), ExitCode::usage);
        EXPECT_NE(std::string(e.what()).find("it has: positions, moves, results"), std::string::npos) << e.what();
    }
    // A role named in the file must exist; an unnamed default "x" is dropped.
    std::string bad = text;
    bad.replace(bad.find("\"input_field\": \"\""), 17, "\"input_field\": \"board\"");
    EXPECT_NE(error_of(bad).find("names field 'board'"), std::string::npos);
    std::string old = text;
    old.erase(old.find("\"input_field\": \"\","), 19);
    EXPECT_EQ(parse_manifest(old, "old.json").input_field, "");
}

TEST(ChannelStats, ChannelsFollowTheModelsShapes) {
    EXPECT_EQ(stats_channels(Shape{}), 1u);
    EXPECT_EQ(stats_channels(Shape{{120}}), 120u);
    EXPECT_EQ(stats_channels(Shape{{28, 28}}), 1u);
    EXPECT_EQ(stats_channels(Shape{{12, 8, 8}}), 12u);
    EXPECT_EQ(stats_channels(Shape{{2, 3, 4, 5}}), 2u);
}

TEST(ChannelStats, SumsOfEveryDtype) {
    // Two samples of 2 channels x 2 values: channel 0 holds 1, 2 / 5, 6; channel 1 holds 3, 4 / 7, 8.
    const Shape s{{2, 1, 2}};
    const double want[] = {1 + 2 + 5 + 6, 3 + 4 + 7 + 8, 1 + 4 + 25 + 36, 9 + 16 + 49 + 64};
    const auto check = [&](DType t, const void* data) {
        const std::vector<double> row = channel_sums_row(data, 2, t, s);
        ASSERT_EQ(row.size(), 4u);
        for (int i = 0; i < 4; ++i) EXPECT_EQ(row[i], want[i]) << dtype_name(t);
    };
    const std::uint8_t u8[] = {1, 2, 3, 4, 5, 6, 7, 8};
    const std::int16_t i16[] = {1, 2, 3, 4, 5, 6, 7, 8};
    const float f32[] = {1, 2, 3, 4, 5, 6, 7, 8};
    const double f64[] = {1, 2, 3, 4, 5, 6, 7, 8};
    std::uint16_t bf[8], h[8];
    for (int i = 0; i < 8; ++i) {
        bf[i] = float_to_bf16(f32[i]);
        h[i] = float_to_f16(f32[i]);
    }
    check(DType::u8, u8);
    check(DType::i16, i16);
    check(DType::f32, f32);
    check(DType::f64, f64);
    check(DType::bf16, bf);
    check(DType::f16, h);
    // A row filled in pieces equals one filled at once.
    std::vector<double> row(4, 0.0);
    add_channel_sums(row, f32, 1, DType::f32, s);
    add_channel_sums(row, f32 + 4, 1, DType::f32, s);
    EXPECT_EQ(row, channel_sums_row(f32, 2, DType::f32, s));
}

TEST(ChannelStats, UsableAndCombined) {
    std::string why;
    EXPECT_TRUE(usable_stats(ChannelStats{{1, 2}, {1, 1}}, why));
    EXPECT_FALSE(usable_stats(ChannelStats{{1, 2}, {1, 0}}, why));
    EXPECT_EQ(why, "channel 1 is constant (std 0)");
    EXPECT_FALSE(usable_stats(ChannelStats{{NAN}, {1}}, why));
    EXPECT_EQ(why, "channel 0 holds NaN or Inf values");
    // Members {0, 2} (mean 1, std 1) and {4, 4, 4, 4} (mean 4, std 0): the six values 0 2 4 4 4 4.
    const ChannelStats c = combine_stats({ChannelStats{{1}, {1}}, ChannelStats{{4}, {0}}}, {2, 4});
    EXPECT_DOUBLE_EQ(c.mean[0], 3.0);
    EXPECT_DOUBLE_EQ(c.std[0], std::sqrt((9.0 + 1 + 4 * 1) / 6));
    // The same as the sums of the whole.
    ChannelSums whole(1);
    whole.add({0 + 2 + 4 * 4, 0 + 4 + 4 * 16});
    const ChannelStats w = whole.stats(6);
    EXPECT_DOUBLE_EQ(c.mean[0], w.mean[0]);
    EXPECT_NEAR(c.std[0], w.std[0], 1e-12);
}
