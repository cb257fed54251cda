// Batch sources deliver every field a caller names (SourceRequest::fields):
// four fields of different dtypes, shapes and storages (support/
// fields_dataset.hpp) in every cpu placement, order and storage (.npy, zstd
// with chunks other than the order's, fields in parts), each field of each
// batch the dataset's values at the order's sample indices; resume mid-epoch;
// a dataset without labels; errors naming the missing field; memory plans
// that count every field and equal what the sources hold.
#include <gtest/gtest.h>

#include <cstring>
#include <filesystem>
#include <string>
#include <vector>

#include "dstk/data/batch_source.hpp"
#include "dstk/data/source_plan.hpp"
#include "dstk/data/window_cache.hpp"
#include "dstk/dataset.hpp"
#include "dstk/error.hpp"
#include "support/error_of.hpp"
#include "support/fields_dataset.hpp"
#include "support/plan_source.hpp"

namespace fs = std::filesystem;
using namespace dstk;
using namespace dstk::data;
using test_support::FieldsStorage;

namespace {

constexpr std::uint64_t samples = 1000;
const std::vector<std::string> all_fields{"target", "image", "result", "label"}; // not in file order

struct Datasets {
    std::vector<fs::path> dirs;
    Datasets() {
        for (const FieldsStorage s : {FieldsStorage::npy, FieldsStorage::zstd, FieldsStorage::parts})
            dirs.push_back(test_support::write_four_fields(
                test_support::temp_path("dstk_fields", test_support::storage_name(s)), samples, s));
    }
    ~Datasets() {
        for (const fs::path& d : dirs) fs::remove_all(d);
    }
};

const Datasets& datasets() {
    static const Datasets d;
    return d;
}

constexpr FieldsStorage storages[] = {FieldsStorage::npy, FieldsStorage::zstd, FieldsStorage::parts};

SourceRequest config(Placement p, Order o, const std::vector<std::string>& fields) {
    SourceRequest r = test_support::request(p, o, 48, 5, 50, 3);
    r.fields = fields;
    r.drop_last = false; // a partial last batch too
    return r;
}

std::string describe(FieldsStorage s, const SourceRequest& c) {
    return std::string(test_support::storage_name(s)) + " " + std::string(placement_name(c.placement)) +
           (c.direct.value_or(false) ? " direct " : " ") + std::string(order_name(c.order));
}

// Runs `epoch` of `src` from `first_batch`, checking every batch against the
// order; returns the batches' bytes, field by field.
std::vector<std::vector<std::uint8_t>> check_epoch(BatchSource& src, FieldsStorage s, const SourceRequest& c,
                                                   std::uint64_t epoch, std::uint64_t first_batch) {
    const auto specs = test_support::four_fields(s);
    OrderConfig oc{c.order, c.seed, c.chunk_samples, c.window};
    oc.chunk_samples = test_support::order_chunk(specs, c.fields, oc.chunk_samples);
    const EpochOrder order(oc, samples, epoch);
    std::vector<std::vector<std::uint8_t>> seen;
    src.start_epoch(epoch, first_batch);
    std::uint64_t position = first_batch * c.batch;
    while (const Batch* b = src.next()) {
        test_support::expect_batch_is(*b, specs, c.fields, order, position, describe(s, c));
        for (const BatchField& f : b->fields) {
            const auto* p = static_cast<const std::uint8_t*>(f.data);
            seen.emplace_back(p, p + b->size * f.sample_bytes());
        }
        position += b->size;
        src.release();
        if (testing::Test::HasFatalFailure()) return seen;
    }
    EXPECT_EQ(position, samples) << describe(s, c);
    return seen;
}

} // namespace

TEST(DataFields, EveryFieldOfEveryBatchIsTheOrdersSampleInEveryPlacementOrderAndStorage) {
    for (std::size_t k = 0; k < 3; ++k) {
        const Dataset ds = Dataset::open(datasets().dirs[k]);
        for (const Order o : {Order::sequential, Order::chunk, Order::full})
            for (const Placement p : {Placement::stream, Placement::device})
                for (const bool direct : {false, true}) {
                    if (direct && p != Placement::stream) continue;
                    SourceRequest c = config(p, o, all_fields);
                    c.direct = direct;
                    c.notice = [](const std::string&) {}; // a filesystem without O_DIRECT reads buffered
                    auto src = test_support::open_source(ds, c);
                    EXPECT_EQ(src->batches_per_epoch(), (samples + 47) / 48);
                    check_epoch(*src, storages[k], c, 3, 0);
                    const StageTimes t = src->take_times();
                    EXPECT_EQ(t.samples, samples) << describe(storages[k], c);
                    EXPECT_EQ(t.bytes, samples * (28 + 36 + 1 + 4)) << "every field's bytes count";
                    if (testing::Test::HasFatalFailure()) return;
                }
    }
}

TEST(DataFields, ResumingMidEpochDeliversTheRestOfTheUninterruptedEpoch) {
    for (std::size_t k = 0; k < 3; ++k) {
        const Dataset ds = Dataset::open(datasets().dirs[k]);
        for (const Order o : {Order::chunk, Order::full})
            for (const Placement p : {Placement::stream, Placement::device}) {
                const SourceRequest c = config(p, o, all_fields);
                auto whole = test_support::open_source(ds, c);
                const auto all = check_epoch(*whole, storages[k], c, 2, 0);
                auto resumed = test_support::open_source(ds, c);
                resumed->start_epoch(0, 4); // an abandoned iteration of another epoch first
                ASSERT_NE(resumed->next(), nullptr);
                resumed->release();
                const auto rest = check_epoch(*resumed, storages[k], c, 2, 7);
                ASSERT_EQ(rest.size(), all.size() - 7 * 4) << describe(storages[k], c);
                EXPECT_TRUE(std::equal(rest.begin(), rest.end(), all.begin() + 7 * 4)) << describe(storages[k], c);
            }
    }
}

TEST(DataFields, TheDefaultFieldsAreTheInputAndLabelRolesAndAnyFieldsMayBeAsked) {
    const Dataset ds = Dataset::open(datasets().dirs[0]);
    for (const std::vector<std::string>& fields :
         std::vector<std::vector<std::string>>{{}, {"result"}, {"label", "target"}}) {
        SourceRequest c = config(Placement::stream, Order::chunk, fields);
        auto src = test_support::open_source(ds, c);
        if (fields.empty()) c.fields = {"image", "label"};
        check_epoch(*src, FieldsStorage::npy, c, 1, 0);
    }
}

TEST(DataFields, ADatasetWithoutLabelsDeliversItsOneField) {
    const std::vector<test_support::FieldSpec> specs{{"stim", DType::u8, Shape{{1, 5, 5}}, 0, {}}};
    const fs::path dir = test_support::write_fields_dataset(
        test_support::temp_path("dstk_fields", "unlabelled"), {specs, {{"train", 300}}, "stim", "", std::nullopt},
        [&](std::size_t f, std::uint64_t i, std::span<std::uint8_t> out) {
            test_support::sample_values(specs[f], f, i, out);
        });
    const Dataset ds = Dataset::open(dir);
    for (const Order o : {Order::sequential, Order::chunk, Order::full})
        for (const Placement p : {Placement::stream, Placement::device}) {
            SourceRequest c = config(p, o, {"stim"});
            auto src = test_support::open_source(ds, c);
            src->start_epoch(1, 0);
            const EpochOrder order(test_support::order_of(ds, c), 300, 1);
            std::uint64_t position = 0;
            while (const Batch* b = src->next()) {
                test_support::expect_batch_is(*b, specs, {"stim"}, order, position, std::string(order_name(o)));
                position += b->size;
                src->release();
            }
            EXPECT_EQ(position, 300u);
        }
    // The default fields need a label role: the error says which setting names the fields instead.
    const std::string e =
        test_support::error_of([&] { test_support::open_source(ds, config(Placement::stream, Order::chunk, {})); });
    EXPECT_NE(e.find("no label field"), std::string::npos) << e;
    EXPECT_NE(e.find("setting fields"), std::string::npos) << e;
    EXPECT_NE(e.find("stim"), std::string::npos) << e;
    fs::remove_all(dir);
}

TEST(DataFields, AFieldTheSplitLacksIsAUsageErrorListingItsFields) {
    const Dataset ds = Dataset::open(datasets().dirs[0]);
    auto usage = [&](const std::vector<std::string>& fields) {
        try {
            test_support::open_source(ds, config(Placement::stream, Order::chunk, fields));
        } catch (const Error& e) {
            EXPECT_EQ(e.code(), ExitCode::usage) << e.what();
            EXPECT_EQ(std::string(e.what()).find("--"), std::string::npos) << "a library message names settings";
            return std::string(e.what());
        }
        ADD_FAILURE() << "no error";
        return std::string();
    };
    std::string e = usage({"image", "moves"});
    EXPECT_NE(e.find("'moves'"), std::string::npos) << e;
    EXPECT_NE(e.find("image, target, result, label"), std::string::npos) << e;
    EXPECT_NE(e.find("fields"), std::string::npos) << e;
    e = usage({"image", "label", "image"});
    EXPECT_NE(e.find("'image' twice"), std::string::npos) << e;
    // The field list of a source configuration is the same rule.
    SourceConfig c = test_support::plan_of(ds, config(Placement::stream, Order::chunk, {"image"})).config;
    c.fields = {"nope"};
    const SplitInfo& split = ds.manifest().split("train");
    EXPECT_NE(test_support::error_of([&] { source_fields(ds.manifest(), split, c); }).find("'nope'"),
              std::string::npos);
}

TEST(DataFields, TheDefaultFieldsTakeALabelRoleOfAnyDtypeAndShape) {
    const fs::path dir = test_support::write_fields_dataset(
        test_support::temp_path("dstk_fields", "floatlabel"),
        {{{"x", DType::u8, Shape{{4}}, 0, {}}, {"y", DType::f32, Shape{{3}}, 0, {}}}, {{"train", 64}}, "x", "y", 2},
        [](std::size_t, std::uint64_t, std::span<std::uint8_t> out) { std::fill(out.begin(), out.end(), 0); });
    const Dataset ds = Dataset::open(dir);
    // A regression target (f32[3]) is delivered like any field, named or by its role.
    for (const std::vector<std::string>& fields : std::vector<std::vector<std::string>>{{}, {"x", "y"}}) {
        auto src = test_support::open_source(ds, config(Placement::stream, Order::chunk, fields));
        src->start_epoch(0, 0);
        const Batch* b = src->next();
        ASSERT_NE(b, nullptr);
        EXPECT_EQ(b->fields.size(), 2u);
        EXPECT_EQ(b->field("y").dtype, DType::f32);
        EXPECT_EQ(b->field("y").sample_bytes(), 12u);
        src->release();
    }
    fs::remove_all(dir);
}

// Through a stream epoch, each field is read chunk by chunk with one large
// read per chunk of the order (the label's 4 bytes a sample too), and what the
// sources hold is what the plans say, every field counted.
TEST(DataFields, TheWindowCacheReadsEveryFieldInWholeChunks) {
    const Dataset ds = Dataset::open(datasets().dirs[0]);
    for (const Order o : {Order::sequential, Order::chunk}) {
        const SourceRequest c = config(Placement::stream, o, all_fields);
        auto src = test_support::open_source(ds, c);
        check_epoch(*src, FieldsStorage::npy, c, 0, 0);
        const std::uint64_t chunks = (samples + 49) / 50;
        // Every field's reads, in batch order (target, image, result, label).
        const StageTimes t = src->take_times();
        ASSERT_EQ(t.fields_io.size(), 4u);
        const std::vector<std::pair<std::size_t, std::uint64_t>> side{{2, 1}, {3, 4}};
        for (const auto& [f, sb] : side) {
            const IoCounters& io = t.fields_io[f];
            EXPECT_EQ(io.reads, chunks) << all_fields[f] << " " << order_name(o);
            EXPECT_EQ(io.largest, 50 * sb) << all_fields[f];
            EXPECT_EQ(io.bytes, samples * sb) << all_fields[f];
        }
        // The zstd target has chunks of 48: its reads are the frames the order's chunks touch.
        EXPECT_GE(t.fields_io[0].reads, chunks) << order_name(o);
        // StageTimes::io: the lead field's (image, 36 bytes a sample).
        EXPECT_EQ(t.io.reads, chunks) << order_name(o);
        EXPECT_EQ(t.io.largest, 50 * 36);
        EXPECT_EQ(t.io.bytes, samples * 36);
    }
}

TEST(DataFields, MemoryPlansCountEveryFieldAndEqualWhatTheSourcesHold) {
    for (std::size_t k = 0; k < 3; ++k) {
        const Dataset ds = Dataset::open(datasets().dirs[k]);
        for (const Order o : {Order::sequential, Order::chunk, Order::full})
            for (const Placement p : {Placement::stream, Placement::device})
                for (const bool direct : {false, true}) {
                    SourceRequest c = config(p, o, all_fields);
                    c.direct = direct;
                    c.notice = [](const std::string&) {};
                    const std::string what = describe(storages[k], c);
                    const SourcePlan plan = test_support::plan_of(ds, c);
                    auto src = make_batch_source(ds, plan);
                    EXPECT_EQ(plan.device_bytes, src->device_bytes()) << what;
                    EXPECT_EQ(plan.host_bytes, src->host_bytes()) << what;
                    if (p == Placement::device) {
                        const std::uint64_t slot = o == Order::sequential ? 0 : 48 * 69;
                        EXPECT_EQ(src->device_bytes(), samples * 69 + slot) << what;
                        continue;
                    }
                    EXPECT_EQ(plan.host.total(), src->host_bytes()) << what;
                    // Three slots of one buffer holding every field at 256-byte boundaries
                    // (target 48 x 28, image 48 x 36, result 48 x 1, label 48 x 4: 3776 bytes,
                    // one page), and two readers' indices.
                    EXPECT_EQ(plan.host.ring, 3 * 4096 + 2 * 48 * 8) << what;
                    check_epoch(*src, storages[k], c, 1, 0);
                    const StageTimes t = src->take_times();
                    EXPECT_LE(t.cache_peak, src->host_bytes()) << what;
                }
    }
}

TEST(DataFields, TheWindowCachesPlanHoldsEveryFieldOfTwoWindows) {
    // .npy fields with a chunk of 50 samples, windows of 3: per chunk one
    // page-aligned buffer per field (the zstd target's 48-sample chunks are
    // read into the order's 50-sample ranges).
    const Dataset ds = Dataset::open(datasets().dirs[0]);
    MachineFacts large;
    large.host_available = 1ull << 40;
    large.hardware_threads = 4;
    const SourcePlan p = plan_source(ds, config(Placement::stream, Order::chunk, all_fields), large);
    const HostPlan& plan = p.host;
    const SourceConfig& c = p.config;
    const std::uint64_t chunk = 4096 /* image 1800 */ + 4096 /* target 1400 */ + 4096 /* result */ + 4096 /* label */;
    EXPECT_EQ(plan.min_cache, 2 * 3 * chunk);
    const std::vector<CachedBytes> bytes{{28, false}, {36, false}, {1, false}, {4, false}};
    EXPECT_EQ(plan.min_cache, min_window_cache_bytes(c.order, bytes));
    // The target's frames and decoded storage chunks beside the cache, per I/O thread.
    EXPECT_EQ(plan.other, io_threads_for(c.order, c.readers, 48) * ((48 * 28 + 3 * 4096) + 48 * 28));
}

TEST(DataFields, TheBatchHashCoversEveryField) {
    const Dataset ds = Dataset::open(datasets().dirs[0]);
    std::vector<std::uint64_t> hashes;
    for (const std::vector<std::string>& fields :
         std::vector<std::vector<std::string>>{{"image", "label"}, {"image", "label", "result"}}) {
        for (const Placement p : {Placement::stream, Placement::device}) {
            SourceRequest c = config(p, Order::chunk, fields);
            c.hash_batches = true;
            auto src = test_support::open_source(ds, c);
            src->start_epoch(0, 0);
            while (src->next()) src->release();
            hashes.push_back(src->take_times().batch_hash.value_or(0));
        }
    }
    EXPECT_EQ(hashes[0], hashes[1]) << "stream and device deliver the same batches";
    EXPECT_EQ(hashes[2], hashes[3]);
    EXPECT_NE(hashes[0], hashes[2]) << "the third field is hashed too";
}
