#include <gtest/gtest.h>

#include <fcntl.h>
#include <sys/resource.h>
#include <unistd.h>

#include <algorithm>
#include <filesystem>
#include <set>
#include <vector>

#include "dstk/data/batch_source.hpp"
#include "support/source_batch.hpp"
#include "dstk/dataset_writer.hpp"
#include "dstk/error.hpp"
#include "dstk/output.hpp"
#include "dstk/convert/convert.hpp"
#include "support/test_dataset.hpp"

namespace fs = std::filesystem;
using namespace dstk;
using namespace dstk::data;

namespace {

// Sample i: every byte is (i * 7 + j) & 0xff, its label i.
fs::path make_dataset(const std::string& name, std::uint64_t samples, std::uint64_t sample_bytes) {
    return test_support::write_u8_dataset(test_support::temp_path("dstk_data", name), Shape{{sample_bytes}},
                                          {{"train", samples}}, static_cast<std::uint32_t>(samples),
                                          [](std::uint64_t i, std::span<std::uint8_t> b) {
                                              for (std::size_t j = 0; j < b.size(); ++j)
                                                  b[j] = static_cast<std::uint8_t>(i * 7 + j);
                                              return static_cast<std::int32_t>(i);
                                          });
}

// A zstd-chunked copy of `plain` (chunks of 100 samples) under `name`.
fs::path zstd_copy(const fs::path& plain, const std::string& name) {
    const fs::path packed = test_support::temp_path("dstk_data", name);
    ConvertOptions c;
    c.input = plain;
    c.output = packed;
    c.compress = "zstd:1";
    c.chunk_samples = 100;
    c.out.quiet = true;
    run_convert(c);
    return packed;
}

SourceConfig cpu_config(Placement p, Order o, std::uint32_t batch) {
    SourceConfig c;
    c.placement = p;
    c.device = {dstk::Backend::cpu, 0};
    c.order = {o, 17, 64, 3};
    c.batch = batch;
    c.prefetch = 3;
    c.readers = 2;
    return c;
}

// Labels seen in one epoch from `first_batch`, checking every sample's bytes.
std::vector<std::int32_t> run_epoch(BatchSource& s, std::uint64_t epoch, std::uint64_t first_batch,
                                    std::uint64_t sample_bytes) {
    std::vector<std::int32_t> seen;
    s.start_epoch(epoch, first_batch);
    test_support::XY b;
    while (test_support::next_xy(s, b)) {
        const auto* x = static_cast<const std::uint8_t*>(b.x);
        for (std::uint32_t i = 0; i < b.size; ++i) {
            const std::int32_t label = b.y[i];
            for (std::uint64_t j = 0; j < sample_bytes; ++j)
                EXPECT_EQ(x[i * sample_bytes + j], static_cast<std::uint8_t>(label * 7 + j)) << "sample " << label;
            seen.push_back(label);
        }
        s.release();
    }
    return seen;
}

} // namespace

TEST(DataSource, StreamAndDeviceDeliverTheSameBatchesInEveryOrder) {
    const std::uint64_t n = 1000, sb = 48;
    const fs::path dir = make_dataset("same", n, sb);
    const Dataset ds = Dataset::open(dir);
    for (const Order o : {Order::sequential, Order::chunk, Order::full}) {
        auto stream = make_batch_source(ds, "train", cpu_config(Placement::stream, o, 32));
        auto device = make_batch_source(ds, "train", cpu_config(Placement::device, o, 32));
        EXPECT_EQ(stream->batches_per_epoch(), n / 32);
        const auto a = run_epoch(*stream, 2, 0, sb);
        const auto b = run_epoch(*device, 2, 0, sb);
        ASSERT_EQ(a.size(), n / 32 * 32);
        EXPECT_EQ(a, b) << order_name(o);
        const std::set<std::int32_t> distinct(a.begin(), a.end());
        EXPECT_EQ(distinct.size(), a.size()) << "a sample repeated within an epoch";
        const EpochOrder order({o, 17, 64, 3}, n, 2);
        for (std::uint64_t p = 0; p < a.size(); ++p) ASSERT_EQ(static_cast<std::uint64_t>(a[p]), order[p]);
    }
    fs::remove_all(dir);
}

TEST(DataSource, ZstdChunkedStorageDeliversTheSameBatchesAndTimesItsDecoding) {
    const std::uint64_t n = 1000, sb = 48;
    const fs::path plain = make_dataset("plain", n, sb), packed = zstd_copy(plain, "zstd");
    const Dataset a = Dataset::open(plain), b = Dataset::open(packed);
    ASSERT_EQ(b.manifest().splits[0].fields[0].storage, Storage::zstd_chunked);
    // Sequential: the chunk order's windows follow the storage chunks, which differ.
    auto npy = make_batch_source(a, "train", cpu_config(Placement::stream, Order::sequential, 32));
    auto zst = make_batch_source(b, "train", cpu_config(Placement::stream, Order::sequential, 32));
    EXPECT_EQ(run_epoch(*zst, 1, 0, sb), run_epoch(*npy, 1, 0, sb));
    const StageTimes tz = zst->take_times(), tn = npy->take_times();
    EXPECT_GT(tz.decode, 0.0) << "decoding zstd chunks is its own stage";
    EXPECT_EQ(tn.decode, 0.0) << ".npy storage has nothing to decode";
    EXPECT_EQ(tz.samples, n / 32 * 32);
    fs::remove_all(plain);
    fs::remove_all(packed);
}

TEST(DataSource, ResumesAtAnyBatch) {
    const std::uint64_t n = 500, sb = 16;
    const fs::path dir = make_dataset("resume", n, sb);
    const Dataset ds = Dataset::open(dir);
    auto s = make_batch_source(ds, "train", cpu_config(Placement::stream, Order::full, 20));
    const auto all = run_epoch(*s, 5, 0, sb);
    const auto tail = run_epoch(*s, 5, 13, sb);
    ASSERT_EQ(tail.size(), all.size() - 13 * 20);
    EXPECT_TRUE(std::equal(tail.begin(), tail.end(), all.begin() + 13 * 20));
    // Starting a new epoch in the middle of one (the ring is drained and reset).
    s->start_epoch(1, 0);
    test_support::XY b;
    ASSERT_TRUE(test_support::next_xy(*s, b));
    s->release();
    EXPECT_EQ(run_epoch(*s, 5, 0, sb), all);
    fs::remove_all(dir);
}

// start_epoch drops what an abandoned iteration counted, in every placement
// and order: the stage times after it are the new iteration's alone (the
// readers of the old one are stopped first, so none of theirs leaks in).
TEST(DataSource, StartEpochDropsAnAbandonedIterationsTimes) {
    const std::uint64_t n = 600, sb = 48;
    const fs::path plain = make_dataset("restart", n, sb), packed = zstd_copy(plain, "restartz");
    for (const fs::path& dir : {plain, packed}) {
        const Dataset ds = Dataset::open(dir);
        for (const Placement p : {Placement::stream, Placement::device})
            for (const Order o : {Order::sequential, Order::chunk, Order::full}) {
                auto s = make_batch_source(ds, "train", cpu_config(p, o, 20));
                s->start_epoch(0, 0);
                test_support::XY b;
                for (int i = 0; i < 5; ++i) {
                    ASSERT_TRUE(test_support::next_xy(*s, b));
                    s->release();
                }
                const std::vector<std::int32_t> seen = run_epoch(*s, 1, 0, sb);
                const StageTimes t = s->take_times();
                const std::string what =
                    dir.filename().string() + " " + std::string(placement_name(p)) + " " + std::string(order_name(o));
                EXPECT_EQ(t.batches, s->batches_per_epoch()) << what;
                EXPECT_EQ(t.samples, seen.size()) << what;
                if (p == Placement::stream && o != Order::full && dir == packed)
                    EXPECT_LE(t.io.reads, n / 100 * 2)
                        << what << ": the new epoch's chunk reads (x and labels at most)";
            }
    }
    fs::remove_all(plain);
    fs::remove_all(packed);
}

TEST(DataSource, EvaluationKeepsThePartialLastBatch) {
    const std::uint64_t n = 100, sb = 8;
    const fs::path dir = make_dataset("partial", n, sb);
    const Dataset ds = Dataset::open(dir);
    auto c = cpu_config(Placement::stream, Order::sequential, 30);
    c.drop_last = false;
    auto s = make_batch_source(ds, "train", c);
    EXPECT_EQ(s->batches_per_epoch(), 4u);
    EXPECT_EQ(run_epoch(*s, 0, 0, sb).size(), n);
    fs::remove_all(dir);
}

TEST(DataSource, UsageErrorsForBadBatchAndPlacement) {
    const fs::path dir = make_dataset("usage", 10, 4);
    const Dataset ds = Dataset::open(dir);
    auto expect_usage = [&](const SourceConfig& c, const char* what) {
        try {
            make_batch_source(ds, "train", c);
            ADD_FAILURE() << "no error for " << what;
        } catch (const Error& e) {
            EXPECT_EQ(e.code(), ExitCode::usage) << what << ": " << e.what();
        }
    };
    expect_usage(cpu_config(Placement::stream, Order::chunk, 11), "batch > split");
    expect_usage(cpu_config(Placement::managed, Order::chunk, 2), "managed on cpu");
    auto c = cpu_config(Placement::stream, Order::chunk, 2);
    c.prefetch = 0;
    expect_usage(c, "prefetch 0");
    fs::remove_all(dir);
}

TEST(DataSource, FileThatShrinksMidRunIsAnErrorNamingIt) {
    const std::uint64_t n = 2000, sb = 64;
    const fs::path dir = make_dataset("shrink", n, sb);
    const Dataset ds = Dataset::open(dir);
    auto s = make_batch_source(ds, "train", cpu_config(Placement::stream, Order::sequential, 100));
    s->start_epoch(0, 0);
    test_support::XY b;
    ASSERT_TRUE(test_support::next_xy(*s, b));
    s->release();
    fs::resize_file(dir / ds.manifest().split("train").field("x").file, 1000);
    try {
        while (test_support::next_xy(*s, b)) s->release();
        FAIL() << "no error after the file shrank";
    } catch (const Error& e) {
        EXPECT_EQ(e.code(), ExitCode::failure);
        EXPECT_NE(std::string(e.what()).find("train_x"), std::string::npos) << e.what();
    }
    fs::remove_all(dir);
}

TEST(DataSource, StreamHostMemoryIsTheRingAndWindowCacheWhateverTheSplitSize) {
    // 64 MiB split, 16 KiB samples, batch 64 x 4 slots = 4 MiB ring, two
    // windows of 3 chunks of 64 samples = 6 MiB: --host-mem 12 MiB holds them;
    // peak RSS may not grow by anything near the split.
    const std::uint64_t n = 4096, sb = 16384;
    const fs::path dir = make_dataset("rss", n, sb);
    const Dataset ds = Dataset::open(dir);
    const std::uint64_t before = peak_rss_bytes();
    auto c = cpu_config(Placement::stream, Order::chunk, 64);
    c.prefetch = 4;
    c.host_mem = 12u << 20;
    auto s = make_batch_source(ds, "train", c);
    EXPECT_LE(s->host_bytes(), 12u << 20);
    c.host_mem = 8u << 20; // below ring + two windows
    try {
        make_batch_source(ds, "train", c);
        ADD_FAILURE() << "--host-mem below ring + two windows was accepted";
    } catch (const Error& e) {
        EXPECT_EQ(e.code(), ExitCode::no_fit) << e.what();
        EXPECT_NE(std::string(e.what()).find("--host-mem"), std::string::npos) << e.what();
    }
    std::uint64_t samples = 0;
    s->start_epoch(0, 0);
    test_support::XY b;
    while (test_support::next_xy(*s, b)) {
        samples += b.size;
        s->release();
    }
    EXPECT_EQ(samples, n);
    EXPECT_LT(peak_rss_bytes() - before, 24u << 20) << "stream mode held more than its ring";
    fs::remove_all(dir);
}

TEST(DataSource, DirectReadsDeliverTheSameBatchesInEveryOrder) {
    // 48-byte samples: no run of samples starts or ends on a 4 KiB boundary.
    const std::uint64_t n = 3000, sb = 48;
    const fs::path dir = make_dataset("direct", n, sb);
    const Dataset ds = Dataset::open(dir);
    for (const Order o : {Order::sequential, Order::chunk, Order::full}) {
        SourceConfig c = cpu_config(Placement::stream, o, 200);
        c.drop_last = false;
        auto plain = make_batch_source(ds, "train", c);
        std::vector<std::string> notices;
        c.direct = true;
        c.notice = [&](const std::string& s) { notices.push_back(s); };
        auto direct = make_batch_source(ds, "train", c);
        const auto a = run_epoch(*plain, 1, 0, sb);
        const auto b = run_epoch(*direct, 1, 0, sb);
        ASSERT_EQ(a.size(), n);
        EXPECT_EQ(a, b) << order_name(o);
        // Where the filesystem has O_DIRECT, bounce buffers are part of host memory.
        if (notices.empty()) EXPECT_GT(direct->host_bytes(), plain->host_bytes()) << order_name(o);
    }
    fs::remove_all(dir);
}

TEST(DataSource, DirectFallsBackWithANoticeWhereTheFilesystemRefusesIt) {
    const fs::path shm = "/dev/shm";
    if (!fs::is_directory(shm)) GTEST_SKIP() << "no /dev/shm (a tmpfs, which refuses O_DIRECT)";
    const std::uint64_t n = 500, sb = 40;
    const fs::path made = make_dataset("direct_tmpfs", n, sb);
    const fs::path dir = shm / made.filename();
    fs::remove_all(dir);
    fs::copy(made, dir, fs::copy_options::recursive);
    fs::remove_all(made);
    const int probe = ::open((dir / "train_x.npy").c_str(), O_RDONLY | O_DIRECT);
    if (probe >= 0) {
        ::close(probe);
        fs::remove_all(dir);
        GTEST_SKIP() << "this kernel's tmpfs accepts O_DIRECT (Linux 6.6 and later): no filesystem here refuses it";
    }
    const Dataset ds = Dataset::open(dir);
    SourceConfig c = cpu_config(Placement::stream, Order::chunk, 50);
    std::vector<std::string> notices;
    c.direct = true;
    c.notice = [&](const std::string& s) { notices.push_back(s); };
    auto s = make_batch_source(ds, "train", c);
    EXPECT_EQ(run_epoch(*s, 0, 0, sb).size(), n);
    fs::remove_all(dir);
    ASSERT_EQ(notices.size(), 1u) << "tmpfs should refuse O_DIRECT once, for the inputs only";
    EXPECT_NE(notices[0].find("O_DIRECT"), std::string::npos) << notices[0];
    EXPECT_NE(notices[0].find("train_x"), std::string::npos) << notices[0];
    EXPECT_NE(notices[0].find("page cache"), std::string::npos) << notices[0];
}

TEST(DataSource, DirectReadOfAShrunkFileIsAnErrorNamingIt) {
    const std::uint64_t n = 2000, sb = 64;
    const fs::path dir = make_dataset("direct_shrink", n, sb);
    const Dataset ds = Dataset::open(dir);
    SourceConfig c = cpu_config(Placement::stream, Order::sequential, 100);
    c.direct = true;
    auto s = make_batch_source(ds, "train", c);
    fs::resize_file(dir / ds.manifest().split("train").field("x").file, 70000);
    s->start_epoch(0, 0);
    test_support::XY b;
    try {
        while (test_support::next_xy(*s, b)) s->release();
        FAIL() << "no error after the file shrank";
    } catch (const Error& e) {
        EXPECT_EQ(e.code(), ExitCode::failure);
        EXPECT_NE(std::string(e.what()).find("train_x"), std::string::npos) << e.what();
    }
    fs::remove_all(dir);
}

TEST(DataSource, LimitingStageComesFromTheStageTimes) {
    StageTimes t;
    EXPECT_EQ(limiting_stage(t), "compute"); // nothing measured
    t.compute = 10;
    t.read_wait = 0.5; // under a tenth of the loop: the loop hardly waited
    t.read = 30;
    EXPECT_EQ(limiting_stage(t), "compute");
    t.read_wait = 5;
    EXPECT_EQ(limiting_stage(t), "read (disk)");
    t.decode = 31; // zstd: the reader threads spent longer decoding than reading
    EXPECT_EQ(limiting_stage(t), "decode (zstd)");
    t.decode = 0;
    t.h2d = 40;
    EXPECT_EQ(limiting_stage(t), "h2d (host to device)");
}
