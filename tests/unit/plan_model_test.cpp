// dsplan's sizing model: exact numbers (man/dsplan.1, FORMULAS).
#include <gtest/gtest.h>

#include "dstk/error.hpp"
#include "dstk/plan/plan.hpp"
#include "dstk/units.hpp"

using namespace dstk;
using namespace dstk::plan;

namespace {

constexpr std::uint64_t GiB = std::uint64_t{1} << 30;

DataSpec cifar(DType t, std::uint64_t train, std::optional<DType> label = DType::i32) {
    DataSpec d = input_and_label(parse_shape("3x32x32"), t, label);
    d.train = train;
    return d;
}

Budgets budgets(std::optional<std::uint64_t> ram, std::optional<std::uint64_t> disk, std::optional<std::uint64_t> gpu,
                Assumptions a = {}) {
    Machine m;
    if (ram) m.ram = {*ram, Source::given};
    if (disk) m.disk = {*disk, Source::given};
    if (gpu) m.gpu = {*gpu, Source::given};
    return compute_budgets(m, a);
}

} // namespace

TEST(PlanModel, TenMillionCifarF32Is114GiB) {
    const DataSpec d = cifar(DType::f32, 10'000'000, std::nullopt);
    EXPECT_EQ(input_bytes_per_sample(d), 12'288u);
    EXPECT_EQ(input_bytes(d), 122'880'000'000u);
    EXPECT_EQ(dataset_bytes(d), 122'880'000'000u);
    EXPECT_EQ(format_bytes(input_bytes(d)), "114.4 GiB");
}

TEST(PlanModel, LabelsAddTheirBytes) {
    const DataSpec d = cifar(DType::f32, 10'000'000);
    EXPECT_EQ(label_bytes_per_sample(d), 4u);
    EXPECT_EQ(bytes_per_sample(d), 12'292u);
    EXPECT_EQ(input_bytes(d), 122'880'000'000u);
    EXPECT_EQ(dataset_bytes(d), 122'920'000'000u);
    // Two npy files of one split, 128-byte headers each (data 64-byte aligned).
    EXPECT_EQ(npy_overhead(d), 256u);
    EXPECT_EQ(disk_bytes(d), 122'920'000'256u);
}

TEST(PlanModel, StoredBytesOverrideTheNpyLayout) {
    DataSpec d = cifar(DType::u8, 1000);
    d.stored_bytes = 1'234'567;
    EXPECT_EQ(disk_bytes(d), 1'234'567u);
}

TEST(PlanModel, RamBudgetIsTotalMinusReserveMinusHeadroom) {
    // (128 GiB - 10 GiB) = 126,701,535,232; 20% of it rounded up = 25,340,307,047.
    EXPECT_EQ(usable_bytes(128 * GiB, 10 * GiB, 200'000), 101'361'228'185u);
    EXPECT_EQ(usable_bytes(128 * GiB, 0, 0), 128 * GiB);
    EXPECT_EQ(usable_bytes(8 * GiB, 10 * GiB, 200'000), 0u);
    const Budgets b = budgets(128 * GiB, 1000 * GiB, 8 * GiB);
    EXPECT_EQ(b.ram.bytes, 101'361'228'185u);
    EXPECT_EQ(b.disk.bytes, 800 * GiB);
    EXPECT_EQ(b.gpu.bytes, usable_bytes(8 * GiB, 0, 200'000));
    EXPECT_EQ(b.gpu.source, Source::given);
}

TEST(PlanModel, CapacityNeededInvertsUsable) {
    for (const std::uint64_t need : {std::uint64_t{1}, std::uint64_t{12'345'678'901}, 94 * GiB}) {
        for (const std::uint32_t ppm : {0u, 200'000u, 333'333u}) {
            const std::uint64_t c = capacity_needed(need, 10 * GiB, ppm);
            EXPECT_GE(usable_bytes(c, 10 * GiB, ppm), need);
            EXPECT_LT(usable_bytes(c - 1, 10 * GiB, ppm), need) << need << " " << ppm;
        }
    }
}

TEST(PlanModel, MaxSamplesIn128GiB) {
    EXPECT_EQ(max_samples(101'361'228'185u, 12'292), 8'246'113u);
    // The pinned ring (4 x 256 x 12,292 B = 12,587,008 B) comes off the top.
    const DataSpec d = cifar(DType::f32, 0);
    const Job j;
    EXPECT_EQ(ring_bytes(d, j), 12'587'008u);
    const auto caps = capacity_by_dtype(d, j, budgets(128 * GiB, std::nullopt, std::nullopt));
    ASSERT_EQ(caps.size(), 3u); // f32 first, then u8 and bf16
    EXPECT_EQ(caps[0].dtype, DType::f32);
    EXPECT_EQ(caps[0].ram_samples, 8'245'089u);
    EXPECT_EQ(caps[1].dtype, DType::u8);
    EXPECT_EQ(caps[1].bytes_per_sample, 3'076u);
    EXPECT_EQ(caps[2].dtype, DType::bf16);
    EXPECT_EQ(caps[2].bytes_per_sample, 6'148u);
    EXPECT_FALSE(caps[0].disk_samples.has_value());
    EXPECT_FALSE(caps[0].fit.has_value());
}

TEST(PlanModel, F16ComparesWithU8AndF32) {
    const auto caps = capacity_by_dtype(cifar(DType::f16, 0), Job{}, budgets(16 * GiB, std::nullopt, std::nullopt));
    ASSERT_EQ(caps.size(), 3u); // f16, u8, f32: bf16 is f16's size
    EXPECT_EQ(caps[0].dtype, DType::f16);
    EXPECT_EQ(caps[1].dtype, DType::u8);
    EXPECT_EQ(caps[2].dtype, DType::f32);
}

TEST(PlanModel, SeedsBf16VersusF32) {
    // 226 GB of u8 becomes 452 GB as bf16, which fits 504 GB of RAM; 904 GB as f32 does not
    // (the seeds' arithmetic: no reserve, no headroom).
    const Assumptions none{0, 0};
    const Budgets b = budgets(504'000'000'000u, 10'000'000'000'000u, std::nullopt, none);
    DataSpec d = cifar(DType::u8, 73'567'708, std::nullopt);
    EXPECT_EQ(dataset_bytes(d), 225'999'998'976u);
    Job j;
    j.prefetch = 1;
    j.batch = 1;
    const auto caps = capacity_by_dtype(d, j, b);
    ASSERT_EQ(caps.size(), 3u);
    EXPECT_EQ(caps[0].fit, Fit::ram);
    EXPECT_EQ(caps[1].dtype, DType::bf16);
    EXPECT_EQ(caps[1].dataset_bytes, 451'999'997'952u);
    EXPECT_EQ(caps[1].fit, Fit::ram);
    EXPECT_EQ(caps[2].dtype, DType::f32);
    EXPECT_EQ(caps[2].dataset_bytes, 903'999'995'904u);
    EXPECT_EQ(caps[2].fit, Fit::disk);
}

TEST(PlanModel, PlacementDevice) {
    const Verdict v = plan_placement(cifar(DType::u8, 50'000), Job{}, budgets(16 * GiB, 100 * GiB, 8 * GiB));
    EXPECT_EQ(v.fit, Fit::device);
    EXPECT_EQ(v.gpu_device, 50'000u * 3'076u);
    EXPECT_TRUE(v.gpu_checked);
    EXPECT_TRUE(v.reasons.empty());
}

TEST(PlanModel, PlacementRamWithoutGpu) {
    const Verdict v = plan_placement(cifar(DType::f32, 1'000'000), Job{}, budgets(128 * GiB, 100 * GiB, std::nullopt));
    EXPECT_EQ(v.fit, Fit::ram);
    EXPECT_FALSE(v.gpu_checked);
    ASSERT_EQ(v.reasons.size(), 1u);
    EXPECT_NE(v.reasons[0].find("GPU memory unknown"), std::string::npos);
}

TEST(PlanModel, PlacementDisk) {
    const Verdict v = plan_placement(cifar(DType::f32, 10'000'000), Job{}, budgets(128 * GiB, 2048 * GiB, 8 * GiB));
    EXPECT_EQ(v.fit, Fit::disk);
    EXPECT_EQ(v.ram, 122'920'000'000u + 12'587'008u);
    EXPECT_EQ(v.disk, 122'920'000'256u);
    EXPECT_EQ(v.reasons.size(), 2u);
    EXPECT_TRUE(v.fixes.empty());
}

TEST(PlanModel, NewDataMustFitOnDiskEvenWhenItFitsRam) {
    const Verdict v = plan_placement(cifar(DType::u8, 1'000'000), Job{}, budgets(128 * GiB, 1 * GiB, 8 * GiB));
    EXPECT_EQ(v.fit, Fit::none);
    ASSERT_FALSE(v.fixes.empty());
    // u8 is already the smallest; 3.0 GB on 0.8 GiB needs 3.58:1: fewer samples first.
    EXPECT_NE(v.fixes[0].find("at most 279,"), std::string::npos) << v.fixes[0];
    EXPECT_NE(v.fixes[1].find("ratio of at least 3.58:1"), std::string::npos) << v.fixes[1];
}

TEST(PlanModel, ExistingDatasetIsAlreadyOnDisk) {
    DataSpec d = cifar(DType::f32, 10'000'000);
    d.on_disk = true;
    d.stored_bytes = 60 * GiB;
    const Verdict v = plan_placement(d, Job{}, budgets(16 * GiB, 1 * GiB, std::nullopt));
    EXPECT_EQ(v.fit, Fit::disk);
    EXPECT_EQ(v.disk, 0u);
}

TEST(PlanModel, PlacementNoneSuggestsTheCheapestFixFirst) {
    // 114 GiB of f32 on 64 GiB of free disk (51.2 GiB usable): bf16 halves it to 57.3 GiB, still too big; u8 fits.
    const Verdict v = plan_placement(cifar(DType::f32, 10'000'000), Job{}, budgets(16 * GiB, 64 * GiB, std::nullopt));
    EXPECT_EQ(v.fit, Fit::none);
    ASSERT_EQ(v.reasons.size(), 1u);
    EXPECT_NE(v.reasons[0].find("exceeds the disk budget"), std::string::npos);
    ASSERT_EQ(v.fixes.size(), 4u);
    EXPECT_NE(v.fixes[0].find("store the input as u8"), std::string::npos) << v.fixes[0];
    // 51.2 GiB usable = 54,975,581,388 B; minus 256 B of headers, / 12,292 B.
    EXPECT_NE(v.fixes[1].find("at most 4,472,468 fit"), std::string::npos) << v.fixes[1];
    // Past 2:1, compression comes after fewer samples.
    EXPECT_NE(v.fixes[2].find("ratio of at least 2.24:1"), std::string::npos) << v.fixes[2];
    EXPECT_NE(v.fixes[3].find("more disk"), std::string::npos);
}

TEST(PlanModel, PlausibleCompressionComesBeforeFewerSamples) {
    // 3.08 GB of u8 on 2 GiB of free disk (1.6 GiB usable): 1.79:1.
    const Verdict v = plan_placement(cifar(DType::u8, 1'000'000), Job{}, budgets(128 * GiB, 2 * GiB, std::nullopt));
    EXPECT_EQ(v.fit, Fit::none);
    ASSERT_EQ(v.fixes.size(), 3u);
    EXPECT_NE(v.fixes[0].find("ratio of at least 1.79:1"), std::string::npos) << v.fixes[0];
    EXPECT_NE(v.fixes[1].find("fewer samples"), std::string::npos) << v.fixes[1];
}

TEST(PlanModel, BigBatchDoesNotFitTheGpu) {
    Job j;
    j.batch = 65'536; // 4 x 65,536 x 12,292 B = 3.0 GiB of ring on a 2 GiB GPU
    const Verdict v = plan_placement(cifar(DType::f32, 1'000), j, budgets(128 * GiB, 100 * GiB, 2 * GiB));
    EXPECT_EQ(v.fit, Fit::none);
    ASSERT_FALSE(v.fixes.empty());
    // (1.6 GiB usable) / (4 x 12,292 B) = 34,941 samples per batch.
    EXPECT_NE(v.fixes[0].find("--batch 34941 or less"), std::string::npos) << v.fixes[0];
}

TEST(PlanModel, AtLeastOrdersPlacements) {
    EXPECT_TRUE(at_least(Fit::device, Fit::ram));
    EXPECT_TRUE(at_least(Fit::ram, Fit::ram));
    EXPECT_FALSE(at_least(Fit::disk, Fit::ram));
    EXPECT_EQ(parse_fit("ram"), Fit::ram);
    EXPECT_THROW(parse_fit("none"), Error);
}

TEST(PlanModel, Headroom) {
    EXPECT_EQ(parse_headroom("20%"), 200'000u);
    EXPECT_EQ(parse_headroom("20"), 200'000u);
    EXPECT_EQ(parse_headroom("12.5%"), 125'000u);
    EXPECT_EQ(parse_headroom("0"), 0u);
    EXPECT_EQ(format_headroom(125'000), "12.5%");
    for (const char* bad : {"100", "99.999999", "-5", "abc", "", "%", "20%%", "1e1", "1.2.3"}) {
        try {
            parse_headroom(bad);
            ADD_FAILURE() << bad;
        } catch (const Error& e) {
            EXPECT_EQ(e.code(), ExitCode::usage) << bad;
        }
    }
}

TEST(PlanModel, OverflowIsAUsageError) {
    DataSpec d = cifar(DType::f64, 0);
    try {
        d.fields[0].shape = parse_shape("4294967296x4294967296");
        (void)input_bytes_per_sample(d);
        ADD_FAILURE();
    } catch (const Error& e) {
        EXPECT_EQ(e.code(), ExitCode::usage);
    }
    DataSpec big = cifar(DType::f32, std::uint64_t{1} << 62);
    EXPECT_THROW((void)dataset_bytes(big), Error);
}

TEST(PlanModel, QuickReferenceRows) {
    const std::vector<std::optional<DType>> cols{DType::f32, DType::u8};
    const auto rows = quick_reference(cifar(DType::f32, 0), Job{}, cols, Assumptions{});
    ASSERT_EQ(rows.size(), 7u);
    EXPECT_EQ(rows.front().ram, 16 * GiB);
    EXPECT_EQ(rows.back().ram, 1024 * GiB);
    EXPECT_EQ(rows[3].ram, 128 * GiB);
    EXPECT_EQ(rows[3].usable, 101'361'228'185u);
    EXPECT_EQ(rows[3].max_samples[0], 8'245'089u);
    EXPECT_EQ(rows[3].max_samples[1], (101'361'228'185u - 4u * 256 * 3076) / 3076);
}

TEST(PlanModel, EpochFromDiskIsIoBound) {
    const DataSpec d = cifar(DType::u8, 1'000'000);
    Rates r;
    r.seq_read = 1e9;
    r.h2d_pinned = 50e9;
    const EpochEstimate e = estimate_epoch(d, Job{}, Fit::disk, r, 500'000, false);
    EXPECT_EQ(e.read_bytes, 3'076'000'000u);
    ASSERT_TRUE(e.read_seconds && e.compute_seconds && e.epoch_seconds && e.transfer_seconds);
    EXPECT_DOUBLE_EQ(*e.read_seconds, 3.076);
    EXPECT_DOUBLE_EQ(*e.transfer_seconds, 3.076 / 50);
    EXPECT_DOUBLE_EQ(*e.compute_seconds, 2.0);
    EXPECT_DOUBLE_EQ(*e.epoch_seconds, 3.076);
    EXPECT_EQ(e.limited_by, data::Stage::read);
    EXPECT_TRUE(e.io_bound);
    EXPECT_EQ(e.prefetch, 3u); // 2 + floor(3.076 / 2)
    // 256 x 3,072 B = 768 KiB per batch: 6 batches reach 4 MiB.
    EXPECT_EQ(e.chunk_samples, 1'536u);
}

TEST(PlanModel, EpochFromRamIsComputeBound) {
    const DataSpec d = cifar(DType::f32, 1'000'000);
    Rates r;
    r.h2d_pinned = 50e9;
    const EpochEstimate e = estimate_epoch(d, Job{}, Fit::ram, r, 50'000, false);
    EXPECT_EQ(e.read_bytes, 0u);
    EXPECT_FALSE(e.read_seconds);
    EXPECT_EQ(e.limited_by, data::Stage::compute);
    EXPECT_FALSE(e.io_bound);
    EXPECT_EQ(e.prefetch, 2u);
    EXPECT_EQ(e.chunk_samples, 512u); // 3 MiB per batch: 2 batches
}

TEST(PlanModel, EpochRandomOrderNeedsTheRandomRate) {
    const DataSpec d = cifar(DType::u8, 1'000);
    Rates r;
    r.seq_read = 1e9;
    const EpochEstimate e = estimate_epoch(d, Job{}, Fit::disk, r, 0, true);
    EXPECT_FALSE(e.read_seconds);
    EXPECT_FALSE(e.epoch_seconds);
    EXPECT_FALSE(e.prefetch);
}

TEST(PlanModel, EpochFromDiskInChunkOrderReadsAtTheRandomChunkRate) {
    // dstrain's stream reads whole chunks at random offsets: the chunk figure
    // wins over the sequential one where dsbench measured it.
    const DataSpec d = cifar(DType::u8, 1'000'000);
    Rates r;
    r.seq_read = 1.57e9;
    r.chunk_read = 1.0e9;
    const EpochEstimate e = estimate_epoch(d, Job{}, Fit::disk, r, 0, false);
    ASSERT_TRUE(e.read_seconds);
    EXPECT_DOUBLE_EQ(*e.read_seconds, 3.076);
    r.chunk_read.reset();
    EXPECT_DOUBLE_EQ(*estimate_epoch(d, Job{}, Fit::disk, r, 0, false).read_seconds, 3.076 / 1.57);
}

TEST(PlanModel, EpochFromDiskOfZstdDataIsLimitedByTheSlowestStage) {
    // 1M u8 samples stored at 2:1: the disk reads half the bytes, the decoder
    // writes all of them (the labels' too); the stages overlap, so the slowest
    // one is the epoch.
    DataSpec d = cifar(DType::u8, 1'000'000);
    d.stored_bytes = 1'538'000'000;
    d.on_disk = true;
    d.compressed = true;
    Rates r;
    r.chunk_read = 1e9;
    r.decode = 0.5e9;
    r.h2d_pinned = 50e9;
    EpochEstimate e = estimate_epoch(d, Job{}, Fit::disk, r, 500'000, false);
    ASSERT_TRUE(e.read_seconds && e.decode_seconds && e.epoch_seconds);
    EXPECT_DOUBLE_EQ(*e.read_seconds, 1.538);
    EXPECT_DOUBLE_EQ(*e.decode_seconds, 3.076e9 / 0.5e9);
    EXPECT_DOUBLE_EQ(*e.epoch_seconds, *e.decode_seconds);
    EXPECT_EQ(e.limited_by, data::Stage::decode);
    EXPECT_TRUE(e.io_bound);
    // A decoder that keeps up leaves the GPU the limit; ties go to compute.
    r.decode = 3.076e9 / 2.0;
    e = estimate_epoch(d, Job{}, Fit::disk, r, 500'000, false);
    EXPECT_EQ(e.limited_by, data::Stage::compute);
    EXPECT_FALSE(e.io_bound);
    // From host memory nothing is read or decoded.
    e = estimate_epoch(d, Job{}, Fit::ram, r, 500'000, false);
    EXPECT_FALSE(e.read_seconds || e.decode_seconds);
}

TEST(PlanModel, StageNamesAreDstrainsEpochLineNames) {
    EXPECT_EQ(data::stage_name(data::Stage::compute), "compute");
    EXPECT_EQ(data::stage_name(data::Stage::read), "read (disk)");
    EXPECT_EQ(data::stage_name(data::Stage::decode), "decode (zstd)");
    EXPECT_EQ(data::stage_name(data::Stage::h2d), "h2d (host to device)");
}

namespace {

// The neuroscience recording of issue 24: stim u8[1x36x36], robs f32[120], behavior f32[4].
DataSpec neuro(std::uint64_t train) {
    DataSpec d;
    d.fields = {parse_field_spec("stim:1x36x36:u8"), parse_field_spec("robs:120:f32"),
                parse_field_spec("behavior:4:f32")};
    d.input = 0;
    d.train = train;
    return d;
}

} // namespace

TEST(PlanFields, FieldSpecsParse) {
    const FieldSpec robs = parse_field_spec("robs:120:f32");
    EXPECT_EQ(robs.name, "robs");
    EXPECT_EQ(robs.shape, parse_shape("120"));
    EXPECT_EQ(robs.dtype, DType::f32);
    EXPECT_EQ(robs.bytes(), 480u);
    const FieldSpec moves = parse_field_spec("moves::i32");
    EXPECT_TRUE(moves.shape.dims.empty());
    EXPECT_EQ(moves.bytes(), 4u);
    for (const char* bad : {"robs", "robs:120", ":120:f32", "robs:120:f99", "robs:12x:f32", "a:1:u8:x", "a:0:u8"}) {
        try {
            (void)parse_field_spec(bad);
            ADD_FAILURE() << "accepted " << bad;
        } catch (const Error& e) {
            EXPECT_EQ(e.code(), ExitCode::usage) << bad;
            EXPECT_NE(std::string(e.what()).find("--field"), std::string::npos) << e.what();
        }
    }
}

TEST(PlanFields, EveryFieldCounts) {
    const DataSpec d = neuro(1000);
    EXPECT_EQ(bytes_per_sample(d), 1296u + 480 + 16);
    EXPECT_EQ(input_bytes_per_sample(d), 1296u);
    EXPECT_EQ(label_bytes_per_sample(d), 0u);
    EXPECT_EQ(widest_field_bytes(d), 1296u);
    EXPECT_EQ(dataset_bytes(d), 1'792'000u);
    // One .npy header per field (128 bytes each here).
    EXPECT_EQ(npy_overhead(d), 3u * 128);
    EXPECT_EQ(disk_bytes(d), 1'792'000u + 384);
    EXPECT_EQ(ring_bytes(d, Job{}), 4u * 256 * 1792);
}

TEST(PlanFields, CapacityVariesTheInputField) {
    const auto caps = capacity_by_dtype(neuro(1000), Job{}, budgets(64 * GiB, std::nullopt, std::nullopt));
    ASSERT_EQ(caps.size(), 3u); // u8 (as stored), bf16, f32
    EXPECT_EQ(caps[0].dtype, DType::u8);
    EXPECT_EQ(caps[0].bytes_per_sample, 1792u);
    EXPECT_EQ(caps[1].dtype, DType::bf16);
    EXPECT_EQ(caps[1].bytes_per_sample, 2u * 1296 + 496);
    EXPECT_EQ(caps[2].dtype, DType::f32);
    EXPECT_EQ(caps[2].bytes_per_sample, 4u * 1296 + 496);
    // Without an input field: the fields as they are, one row.
    DataSpec none = neuro(1000);
    none.input.reset();
    const auto one = capacity_by_dtype(none, Job{}, budgets(64 * GiB, std::nullopt, std::nullopt));
    ASSERT_EQ(one.size(), 1u);
    EXPECT_FALSE(one[0].dtype.has_value());
    EXPECT_EQ(one[0].bytes_per_sample, 1792u);
    EXPECT_EQ(input_bytes(none), 0u);
}

TEST(PlanFields, DatasetsAddUp) {
    DataSpec a = neuro(1000), b = neuro(500);
    a.test = 100;
    a.stored_bytes = 2'000'000;
    b.stored_bytes = 900'000;
    a.on_disk = b.on_disk = true;
    const DataSpec all = combine_data({{"a/", a}, {"b/", b}});
    EXPECT_EQ(all.train, 1500u);
    EXPECT_EQ(all.test, 100u);
    EXPECT_EQ(disk_bytes(all), 2'900'000u);
    EXPECT_EQ(dataset_bytes(all), 1600u * 1792);
    EXPECT_TRUE(all.on_disk);
    // The same fields in another order are the same fields.
    DataSpec c = neuro(10);
    std::swap(c.fields[1], c.fields[2]);
    EXPECT_EQ(combine_data({{"a/", a}, {"c/", c}}).train, 1010u);
    // A field missing, or of another dtype: named, usage error.
    DataSpec d = neuro(10);
    d.fields[1].dtype = DType::bf16;
    DataSpec e = neuro(10);
    e.fields.pop_back();
    for (const DataSpec& bad : {d, e}) {
        try {
            (void)combine_data({{"a/", a}, {"bad/", bad}});
            ADD_FAILURE();
        } catch (const Error& err) {
            EXPECT_EQ(err.code(), ExitCode::usage);
            EXPECT_NE(std::string(err.what()).find("'bad/' has fields"), std::string::npos) << err.what();
        }
    }
}

TEST(PlanFields, NoRamLeftSaysWhy) {
    const Budgets b = budgets(8 * GiB, 1024 * GiB, std::nullopt);
    EXPECT_EQ(b.ram.bytes, 0u);
    const Verdict v = plan_placement(neuro(1000), Job{}, b);
    EXPECT_EQ(v.fit, Fit::disk);
    bool said = false;
    for (const std::string& r : v.reasons) said |= r.find("--os-reserve) leaves no RAM budget") != std::string::npos;
    EXPECT_TRUE(said);
}
