// The converted-batch engine (data::Loader) on the cpu backend: every field
// converted by its kind (the input normalised, an integer label as classes,
// other fields as float values, any of them kept as stored) equals the
// dataset's values at the order's sample indices, in every placement, order
// and storage; a resume mid-epoch and an abandoned iteration deliver the
// batches of an uninterrupted epoch; statistics follow the one rule; errors
// name the settings.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <string>
#include <vector>

#include "dstk/data/loader.hpp"
#include "dstk/error.hpp"
#include "dstk/widen.hpp"
#include "support/error_of.hpp"
#include "support/fields_dataset.hpp"

namespace fs = std::filesystem;
using namespace dstk;
using namespace dstk::data;
using test_support::FieldsStorage;

namespace {

constexpr std::uint64_t samples = 600;
const std::vector<std::string> all_fields{"target", "image", "result", "label"};

struct Datasets {
    std::vector<fs::path> dirs;
    Datasets() {
        for (const FieldsStorage s : {FieldsStorage::npy, FieldsStorage::zstd, FieldsStorage::parts})
            dirs.push_back(test_support::write_four_fields(
                test_support::temp_path("dstk_loader", test_support::storage_name(s)), samples, s));
    }
    ~Datasets() {
        for (const fs::path& d : dirs) fs::remove_all(d);
    }
};

const Datasets& datasets() {
    static const Datasets d;
    return d;
}

LoaderRequest request(Placement p, Order o, const std::vector<std::string>& fields) {
    LoaderRequest r;
    r.source.fields = fields;
    r.source.placement = p;
    r.source.device = {Backend::cpu, 0};
    r.source.order = o;
    r.source.seed = 9;
    r.source.chunk_samples = 50;
    r.source.window = 3;
    r.source.batch = 40;
    r.source.drop_last = false;
    return r;
}

// One converted batch: a buffer per output field.
struct HostBatch {
    std::vector<std::vector<std::uint8_t>> data;
    std::uint32_t size = 0;
};

HostBatch next(Loader& l) {
    HostBatch b;
    std::vector<void*> out;
    for (const FieldOutput& o : l.outputs()) {
        b.data.emplace_back(l.batch() * o.sample_bytes());
        out.push_back(b.data.back().data());
    }
    b.size = l.next_host(out);
    return b;
}

std::vector<HostBatch> epoch(Loader& l, std::uint64_t e, std::uint64_t first = 0) {
    l.start_epoch(e, first);
    std::vector<HostBatch> all;
    for (HostBatch b = next(l); b.size; b = next(l)) all.push_back(std::move(b));
    return all;
}

// Sample `sample`'s value j of field `spec` (index f of the four), converted as `o` says.
double expected(const test_support::FieldSpec& spec, std::size_t f, std::uint64_t sample, std::uint64_t j,
                const FieldOutput& o) {
    std::vector<std::uint8_t> raw(spec.sample_bytes());
    test_support::sample_values(spec, f, sample, raw);
    const double v = widen_float(raw.data(), spec.dtype, j);
    if (o.kind != FieldKind::normalised) return v;
    const std::uint64_t c = j / o.norm.per_channel;
    return (v - o.norm.mean[c]) * static_cast<double>(1.0f / o.norm.std[c]);
}

// Every value of every field of `b`, against the samples of positions [first, first + size).
void expect_converted(const Loader& l, const HostBatch& b, FieldsStorage s, const EpochOrder& order,
                      std::uint64_t first, const std::string& what) {
    const auto specs = test_support::four_fields(s);
    for (std::size_t k = 0; k < l.outputs().size(); ++k) {
        const FieldOutput& o = l.outputs()[k];
        std::size_t f = 0;
        while (specs[f].name != o.name) ++f;
        const std::uint64_t per = o.shape.numel();
        for (std::uint32_t row = 0; row < b.size; ++row)
            for (std::uint64_t j = 0; j < per; ++j) {
                const std::uint64_t sample = order[first + row];
                const void* got = b.data[k].data();
                const double want = expected(specs[f], f, sample, j, o);
                const double have = o.dtype == DType::i64 ? static_cast<double>(widen_int(got, o.dtype, row * per + j))
                                    : o.dtype == DType::i32
                                        ? static_cast<double>(widen_int(got, o.dtype, row * per + j))
                                        : widen_float(got, o.dtype, row * per + j);
                ASSERT_NEAR(have, want, 1e-4 * std::max(1.0, std::abs(want)))
                    << what << ": " << o.name << " position " << first + row << " value " << j;
            }
    }
}

} // namespace

TEST(DataLoader, EveryFieldIsConvertedByItsKindInEveryPlacementOrderAndStorage) {
    const FieldsStorage storages[] = {FieldsStorage::npy, FieldsStorage::zstd, FieldsStorage::parts};
    for (std::size_t k = 0; k < 3; ++k)
        for (const Order o : {Order::sequential, Order::chunk, Order::full})
            for (const Placement p : {Placement::stream, Placement::device}) {
                const std::string what = std::string(test_support::storage_name(storages[k])) + " " +
                                         std::string(placement_name(p)) + " " + std::string(order_name(o));
                LoaderRequest r = request(p, o, all_fields);
                r.labels64 = k == 1; // int64 classes once
                Loader l(datasets().dirs[k], r);
                ASSERT_EQ(l.outputs().size(), 4u);
                EXPECT_EQ(l.outputs()[0].kind, FieldKind::values) << what;     // target f32[7]
                EXPECT_EQ(l.outputs()[1].kind, FieldKind::normalised) << what; // image: the input role
                EXPECT_EQ(l.outputs()[1].dtype, DType::f32);
                EXPECT_EQ(l.outputs()[2].kind, FieldKind::values) << what; // result i8: another integer
                EXPECT_EQ(l.outputs()[3].kind, k == 1 ? FieldKind::classes64 : FieldKind::classes32) << what;
                const EpochOrder order(l.plan().config.order, samples, 2);
                std::uint64_t position = 0;
                for (const HostBatch& b : epoch(l, 2)) {
                    expect_converted(l, b, storages[k], order, position, what);
                    position += b.size;
                    if (testing::Test::HasFatalFailure()) return;
                }
                EXPECT_EQ(position, samples) << what;
            }
}

TEST(DataLoader, AnyFieldMayBeKeptAsStoredOrGivenAKind) {
    LoaderRequest r = request(Placement::stream, Order::chunk, {"image", "result", "label"});
    r.kinds = {{"image", FieldKind::stored}, {"result", FieldKind::classes64}};
    Loader l(datasets().dirs[0], r);
    EXPECT_EQ(l.outputs()[0].dtype, DType::u8);
    EXPECT_EQ(l.outputs()[1].dtype, DType::i64);
    EXPECT_EQ(l.outputs()[2].dtype, DType::i32);
    const EpochOrder order(l.plan().config.order, samples, 0);
    const auto specs = test_support::four_fields(FieldsStorage::npy);
    std::uint64_t position = 0;
    for (const HostBatch& b : epoch(l, 0)) {
        for (std::uint32_t row = 0; row < b.size; ++row) {
            std::vector<std::uint8_t> want(36);
            test_support::sample_values(specs[0], 0, order[position + row], want);
            ASSERT_EQ(std::memcmp(b.data[0].data() + row * 36, want.data(), 36), 0);
            std::vector<std::uint8_t> result(specs[2].sample_bytes());
            test_support::sample_values(specs[2], 2, order[position + row], result);
            ASSERT_EQ(reinterpret_cast<const std::int64_t*>(b.data[1].data())[row],
                      static_cast<std::int8_t>(result[0]));
        }
        position += b.size;
    }
    EXPECT_EQ(position, samples);
    // convert off: every field as stored.
    LoaderRequest raw = request(Placement::device, Order::full, {"target", "label"});
    raw.convert = false;
    Loader lr(datasets().dirs[0], raw);
    EXPECT_EQ(lr.outputs()[0].dtype, DType::f32);
    EXPECT_EQ(lr.outputs()[0].kind, FieldKind::stored);
    EXPECT_EQ(lr.outputs()[1].dtype, DType::i32);
}

TEST(DataLoader, ResumesMidEpochAndDropsAnAbandonedIteration) {
    for (const Placement p : {Placement::stream, Placement::device}) {
        Loader whole(datasets().dirs[1], request(p, Order::chunk, all_fields));
        const auto all = epoch(whole, 3);
        Loader resumed(datasets().dirs[1], request(p, Order::chunk, all_fields));
        resumed.start_epoch(0, 2); // an abandoned iteration of another epoch
        ASSERT_GT(next(resumed).size, 0u);
        const auto rest = epoch(resumed, 3, 6);
        ASSERT_EQ(rest.size(), all.size() - 6);
        for (std::size_t i = 0; i < rest.size(); ++i)
            for (std::size_t f = 0; f < 4; ++f) EXPECT_EQ(rest[i].data[f], all[i + 6].data[f]) << i << " " << f;
        const StageTimes t = resumed.take_times();
        EXPECT_EQ(t.batches, rest.size()) << "the abandoned iteration's batches are not counted";
    }
}

TEST(DataLoader, StatisticsFollowTheOneRule) {
    // No statistics in the manifest: a scan of the training split, as field_norm computes it.
    Loader l(datasets().dirs[0], request(Placement::stream, Order::chunk, {"image"}));
    const ChannelNorm scan = field_norm(Dataset::open(datasets().dirs[0]), "image");
    EXPECT_EQ(l.outputs()[0].norm.mean, scan.mean);
    EXPECT_EQ(l.outputs()[0].norm.std, scan.std);
    EXPECT_NE(scan.source.find("scan"), std::string::npos) << scan.source;
    // Given statistics win; normalize off gives plain values.
    LoaderRequest r = request(Placement::stream, Order::chunk, {"image"});
    r.mean = {10};
    r.std = {4};
    Loader given(datasets().dirs[0], r);
    EXPECT_EQ(given.outputs()[0].norm.mean, std::vector<float>{10});
    r.mean.clear();
    r.std.clear();
    r.normalize = false;
    Loader plain(datasets().dirs[0], r);
    EXPECT_EQ(plain.outputs()[0].kind, FieldKind::values);
}

TEST(DataLoader, ErrorsNameTheSettings) {
    const fs::path& dir = datasets().dirs[0];
    auto error = [&](LoaderRequest r) { return test_support::error_of([&] { Loader l(dir, r); }); };
    LoaderRequest r = request(Placement::stream, Order::chunk, {"image"});
    r.keep = 0;
    EXPECT_NE(error(r).find("invalid keep 0"), std::string::npos) << error(r);
    r = request(Placement::stream, Order::chunk, {"image"});
    r.kinds = {{"label", FieldKind::values}};
    EXPECT_NE(error(r).find("convert names 'label'"), std::string::npos) << error(r);
    r = request(Placement::stream, Order::chunk, {"target"});
    r.kinds = {{"target", FieldKind::classes64}};
    EXPECT_NE(error(r).find("not integer classes"), std::string::npos) << error(r);
    r = request(Placement::stream, Order::chunk, {"image"});
    r.mean = {1, 2};
    r.std = {1, 2};
    EXPECT_NE(error(r).find("1 channels"), std::string::npos) << error(r);
    r = request(Placement::stream, Order::chunk, {"image"});
    r.source.prefetch = 0;
    r.source.names = [](std::string_view s) { return std::string(s) + "="; };
    EXPECT_NE(error(r).find("invalid prefetch= 0"), std::string::npos) << error(r);
}
