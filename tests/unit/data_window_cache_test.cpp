// The stream placement's window cache: it gathers exactly the samples of the
// order functions (every order that reads chunks, every seed and epoch, from
// any resume point), reads each chunk once per epoch with one whole-chunk read,
// stays within its capacity, frees what was consumed, and reports read errors
// and files that shrink, naming the file.
#include <gtest/gtest.h>

#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstring>
#include <filesystem>
#include <map>
#include <mutex>
#include <string>
#include <vector>

#include "dstk/data/batch_source.hpp"
#include "support/plan_source.hpp"
#include "support/source_batch.hpp"
#include "dstk/data/stream_reader.hpp"
#include "dstk/data/window_cache.hpp"
#include "dstk/error.hpp"
#include "support/test_dataset.hpp"

namespace fs = std::filesystem;
using namespace dstk;
using namespace dstk::data;

namespace {

std::uint8_t byte_of(std::uint64_t sample, std::uint64_t j) {
    return static_cast<std::uint8_t>(sample * 13 + j * 7 + 1);
}

FieldInfo memory_field_info(std::uint64_t sample_bytes) {
    FieldInfo f;
    f.name = "memory";
    f.shape = Shape{{sample_bytes}};
    return f;
}

// A field in memory: x bytes byte_of(i, j), labels i; counts whole-range
// reads per first sample; throws for one chosen chunk.
class MemoryField final : public StreamReader {
  public:
    MemoryField(std::uint64_t samples, std::uint64_t sample_bytes, bool labels)
        : StreamReader("memory", memory_field_info(labels ? 4 : sample_bytes), samples), labels_(labels) {}
    void gather(std::span<const std::uint64_t>, std::uint8_t*) override { FAIL() << "sample gather in a cached order"; }
    std::uint64_t read_range(std::uint64_t first, std::uint64_t count, std::uint8_t* buf) override {
        if (first == fail_first_)
            throw runtime_error("cannot read 'memory' (injected error at sample " + std::to_string(first) + ")");
        if (first + count > samples()) throw runtime_error("read past the end");
        for (std::uint64_t i = 0; i < count; ++i) {
            if (labels_) {
                const auto label = static_cast<std::int32_t>(first + i);
                std::memcpy(buf + i * 4, &label, 4);
            } else {
                for (std::uint64_t j = 0; j < sample_bytes(); ++j) buf[i * sample_bytes() + j] = byte_of(first + i, j);
            }
        }
        count_read(count * sample_bytes());
        std::lock_guard lock(mutex_);
        ++reads_[first];
        return 0;
    }
    std::map<std::uint64_t, int> take_reads() {
        std::lock_guard lock(mutex_);
        return std::exchange(reads_, {});
    }
    std::uint64_t fail_first_ = ~std::uint64_t{0};

  private:
    bool labels_;
    std::mutex mutex_;
    std::map<std::uint64_t, int> reads_;
};

// The cache's fields: bytes x_i and labels y_i, pages kept.
std::vector<CachedField> cached(MemoryField& x, MemoryField& y) {
    return {{&x, false}, {&y, false}};
}

std::vector<CachedBytes> bytes_of(std::uint64_t sb) {
    return {{sb, false}, {4, false}};
}

// x and y of a batch as the cache's outputs.
std::vector<std::uint8_t*> outputs(std::vector<std::uint8_t>& x, std::vector<std::int32_t>& y) {
    return {x.data(), reinterpret_cast<std::uint8_t*>(y.data())};
}

// Gathers positions [first, n) in batches of `batch`, releasing each after
// checking it against the order; returns the samples in visiting order.
std::vector<std::uint64_t> run(WindowCache& cache, const EpochOrder& order, std::uint64_t sb, std::uint64_t batch,
                               std::uint64_t first = 0, CacheChain chain = {}) {
    std::vector<std::uint64_t> seen;
    std::vector<std::uint8_t> x(batch * sb);
    std::vector<std::int32_t> y(batch);
    cache.start(order, first, chain);
    const std::uint64_t end = std::min(order.size(), chain.end);
    for (std::uint64_t p = first; p < end; p += batch) {
        const std::uint64_t n = std::min(batch, end - p);
        cache.gather(p, n, outputs(x, y));
        for (std::uint64_t i = 0; i < n; ++i) {
            const std::uint64_t s = order[p + i];
            EXPECT_EQ(y[i], static_cast<std::int32_t>(s)) << "position " << p + i;
            for (std::uint64_t j = 0; j < sb; ++j)
                if (x[i * sb + j] != byte_of(s, j)) {
                    ADD_FAILURE() << "bytes of sample " << s << " at position " << p + i;
                    break;
                }
            seen.push_back(static_cast<std::uint64_t>(y[i]));
        }
        cache.consumed(p + n);
    }
    return seen;
}

} // namespace

TEST(WindowCache, GathersExactlyTheOrderFunctionsSamplesFromAnyResumePoint) {
    const std::uint64_t sb = 24;
    for (const std::uint64_t n : {1000ull, 1024ull, 97ull}) {
        MemoryField x(n, sb, false), y(n, sb, true);
        for (const Order kind : {Order::sequential, Order::chunk}) {
            for (const std::uint64_t window : {1ull, 3ull, 8ull}) {
                const OrderConfig oc{kind, 1234 + window, 64, window};
                WindowCache cache(cached(x, y), min_window_cache_bytes(oc, bytes_of(sb)), 3);
                for (const std::uint64_t epoch : {0ull, 1ull, 7ull}) {
                    const EpochOrder order(oc, n, epoch);
                    const auto seen = run(cache, order, sb, 50);
                    ASSERT_EQ(seen.size(), n);
                    for (std::uint64_t p = 0; p < n; ++p) ASSERT_EQ(seen[p], order[p]) << "position " << p;
                    const auto resumed = run(cache, order, sb, 50, 450 % n);
                    ASSERT_EQ(resumed.size(), n - 450 % n);
                    for (std::uint64_t p = 450 % n; p < n; ++p) ASSERT_EQ(resumed[p - 450 % n], order[p]);
                }
            }
        }
    }
}

// Two fields of 5000 samples (100-byte rows, labels) in chunks of 128 and
// windows of 4, behind a window cache of the least capacity that reads ahead.
class SmallChunkCache : public ::testing::Test {
  protected:
    static constexpr std::uint64_t n = 5000, sb = 100, cs = 128, window = 4;
    MemoryField x{n, sb, false}, y{n, sb, true};
    const OrderConfig oc{Order::chunk, 5, cs, window};
    const std::uint64_t capacity = min_window_cache_bytes(oc, bytes_of(sb));
    WindowCache cache{cached(x, y), capacity, 4};
};

TEST_F(SmallChunkCache, ReadsEachChunkOnceWholeAndStaysWithinItsCapacity) {
    for (std::uint64_t epoch = 0; epoch < 3; ++epoch) {
        const EpochOrder order(oc, n, epoch);
        run(cache, order, sb, 64);
        const auto reads = x.take_reads();
        const std::uint64_t chunks = (n + cs - 1) / cs;
        ASSERT_EQ(reads.size(), chunks) << "epoch " << epoch;
        for (const auto& [first, times] : reads) {
            EXPECT_EQ(first % cs, 0u);
            EXPECT_EQ(times, 1) << "chunk at sample " << first << " read again within epoch " << epoch;
        }
        const CacheStats st = cache.take_stats();
        EXPECT_EQ(st.io[0].reads, chunks);
        EXPECT_EQ(st.io[0].bytes, n * sb);
        EXPECT_EQ(st.io[0].largest, cs * sb);
        EXPECT_EQ(st.io[0].smallest, (n % cs) * sb); // the partial last chunk
        EXPECT_LE(st.peak, capacity);
        EXPECT_GT(st.peak, capacity / 2) << "the cache did not read ahead";
        // Every buffer mapped was read into (none in flight at the epoch's end).
        EXPECT_GT(cache.resident_bytes(), 0u);
        EXPECT_EQ(cache.resident_bytes(), cache.allocated_bytes());
    }
}

// The partial last chunk wherever the order puts it: its buffer is a pooled
// full-size one, so the memory mapped (pooled buffers included) never passes
// the capacity. A fresh buffer of its own size, beside a full one left idle
// in the pool, did: by the tail chunk's bytes, once an epoch.
TEST_F(SmallChunkCache, TheTailChunkTakesAPooledBufferAndMappedMemoryStaysWithinCapacity) {
    std::vector<std::uint8_t> xb(64 * sb);
    std::vector<std::int32_t> yb(64);
    std::uint64_t most = 0;
    for (std::uint64_t epoch = 0; epoch < 4; ++epoch) {
        const EpochOrder order(oc, n, epoch);
        cache.start(order, 0);
        for (std::uint64_t p = 0; p < n; p += 64) {
            const std::uint64_t k = std::min<std::uint64_t>(64, n - p);
            cache.gather(p, k, outputs(xb, yb));
            most = std::max(most, cache.allocated_bytes());
            cache.consumed(p + k);
        }
    }
    EXPECT_LE(most, capacity);
    EXPECT_GT(most, capacity / 2) << "the cache did not read ahead";
}

TEST_F(SmallChunkCache, AChainedEpochIsReadAheadOnceAndKeptByTheNextStart) {
    const EpochOrder e0(oc, n, 0), e1(oc, n, 1), e2(oc, n, 2);
    // Epoch 0 ends at position 2000 (a mix's member, partly taken) and is
    // followed by epoch 1: the cache holds the window of position 1999 (not
    // consumed whole) and epoch 1's first window.
    EXPECT_EQ(run(cache, e0, sb, 64, 0, {2000, &e1}).size(), 2000u);
    EXPECT_GT(cache.held_bytes(), window_group_bytes(oc, bytes_of(sb)));
    EXPECT_LE(cache.held_bytes(), capacity);
    // Epoch 1 keeps that window (its samples exactly the order's: run checks
    // every row), then epoch 2 from a resume point past it does not.
    const auto seen = run(cache, e1, sb, 64, 0, {UINT64_MAX, &e2});
    ASSERT_EQ(seen.size(), n);
    run(cache, e2, sb, 64, 3000);
    // Reads: epoch 0's chunks up to position 2000, every chunk of epoch 1
    // once (its first window ahead of its start), epoch 2's from 3000 on; the
    // window read ahead for epoch 2 was dropped at its resume.
    std::map<std::uint64_t, int> want;
    const auto count = [&](const EpochOrder& o, std::uint64_t from, std::uint64_t to) {
        for (std::uint64_t p = from; p < to; p = o.next_window_start(p))
            for (const std::uint64_t c : o.window_chunks(p)) ++want[c * cs];
    };
    count(e0, 0, 2000);
    count(e1, 0, n);
    count(e2, 3000, n);
    std::map<std::uint64_t, int> got = x.take_reads();
    for (const std::uint64_t c : e2.window_chunks(0)) // read ahead, maybe before the resume dropped it
        if (got[c * cs] > want[c * cs]) --got[c * cs];
    std::erase_if(got, [](const auto& kv) { return kv.second == 0; });
    EXPECT_EQ(got, want);
    EXPECT_LE(cache.take_stats().peak, capacity);
}

TEST(WindowCache, FreesConsumedWindowsAndReadsAheadOnlyWhatFits) {
    const std::uint64_t n = 4096, sb = 64, cs = 64, window = 2;
    MemoryField x(n, sb, false), y(n, sb, true);
    const OrderConfig oc{Order::chunk, 9, cs, window};
    const std::uint64_t group = window_group_bytes(oc, bytes_of(sb));
    WindowCache cache(cached(x, y), 3 * group, 2);
    const EpochOrder order(oc, n, 0);
    cache.start(order, 0);
    std::vector<std::uint8_t> xb(cs * sb);
    std::vector<std::int32_t> yb(cs);
    cache.gather(0, cs, outputs(xb, yb));
    EXPECT_EQ(cache.held_bytes(), 3 * group); // three windows admitted, no fourth
    cache.consumed(window * cs);              // the first window is done
    EXPECT_EQ(cache.held_bytes(), 3 * group); // ... freed, and the fourth admitted
    cache.consumed(n);
    EXPECT_EQ(cache.held_bytes(), 0u);
}

TEST(WindowCache, AGatherNeverWaitsForMemoryItsOwnBatchHolds) {
    // A batch spanning more windows than the capacity holds: admitted anyway.
    const std::uint64_t n = 2000, sb = 16;
    MemoryField x(n, sb, false), y(n, sb, true);
    const OrderConfig oc{Order::chunk, 3, 16, 2};
    WindowCache cache(cached(x, y), window_group_bytes(oc, bytes_of(sb)), 2);
    const EpochOrder order(oc, n, 4);
    EXPECT_EQ(run(cache, order, sb, 500).size(), n);
}

TEST(WindowCache, ReadErrorsReachTheGatherThatNeedsTheChunk) {
    const std::uint64_t n = 1000, sb = 8;
    MemoryField x(n, sb, false), y(n, sb, true);
    x.fail_first_ = 320;
    const OrderConfig oc{Order::sequential, 0, 64, 1};
    WindowCache cache(cached(x, y), min_window_cache_bytes(oc, bytes_of(sb)), 2);
    const EpochOrder order(oc, n, 0);
    cache.start(order, 0);
    std::vector<std::uint8_t> xb(64 * sb);
    std::vector<std::int32_t> yb(64);
    for (std::uint64_t p = 0; p < 320; p += 64) {
        cache.gather(p, 64, outputs(xb, yb)); // chunks before the bad one read fine
        cache.consumed(p + 64);
    }
    try {
        cache.gather(320, 64, outputs(xb, yb));
        FAIL() << "the read error was lost";
    } catch (const Error& e) {
        EXPECT_NE(std::string(e.what()).find("injected error at sample 320"), std::string::npos) << e.what();
    }
    x.fail_first_ = ~std::uint64_t{0};
    EXPECT_EQ(run(cache, order, sb, 64).size(), n) << "a new epoch reads again";
}

TEST(WindowCache, AFileThatShrinksIsAnErrorNamingIt) {
    // A real .npy dataset through the stream source; the file is cut short after open.
    const std::uint64_t n = 3000, sb = 40;
    const fs::path dir =
        test_support::write_u8_dataset(test_support::temp_path("dstk_window", "shrink"), Shape{{sb}}, {{"train", n}},
                                       10, [](std::uint64_t i, std::span<std::uint8_t> b) {
                                           for (std::size_t j = 0; j < b.size(); ++j) b[j] = byte_of(i, j);
                                           return static_cast<std::int32_t>(i % 10);
                                       });
    const Dataset ds = Dataset::open(dir);
    for (const bool direct : {false, true}) {
        SourceRequest c = test_support::request(Placement::stream, Order::chunk, 100, 3, 256, 2);
        c.direct = direct;
        auto s = test_support::open_source(ds, c);
        const fs::path x_file = dir / ds.manifest().split("train").field("x").file;
        const auto full = fs::file_size(x_file);
        fs::resize_file(x_file, full / 2);
        std::string what;
        try {
            s->start_epoch(0, 0);
            test_support::XY b;
            while (test_support::next_xy(*s, b)) s->release();
        } catch (const Error& e) {
            what = e.what();
        }
        EXPECT_NE(what.find(x_file.filename().string()), std::string::npos) << "direct " << direct << ": " << what;
        fs::resize_file(x_file, full);
    }
    fs::remove_all(dir);
}

TEST(WindowCache, StreamSourceReadsWholeChunksAndDeliversTheDeviceBatches) {
    const std::uint64_t n = 2500, sb = 30;
    const fs::path dir =
        test_support::write_u8_dataset(test_support::temp_path("dstk_window", "source"), Shape{{sb}}, {{"train", n}},
                                       10, [](std::uint64_t i, std::span<std::uint8_t> b) {
                                           for (std::size_t j = 0; j < b.size(); ++j) b[j] = byte_of(i, j);
                                           return static_cast<std::int32_t>(i % 10);
                                       });
    const Dataset ds = Dataset::open(dir);
    for (const Order o : {Order::sequential, Order::chunk}) {
        SourceRequest c = test_support::request(Placement::stream, o, 64, 11, 128, 3);
        auto stream = test_support::open_source(ds, c);
        c.placement = Placement::device;
        auto device = test_support::open_source(ds, c);
        for (const std::uint64_t epoch : {0ull, 2ull}) {
            stream->start_epoch(epoch, 0);
            device->start_epoch(epoch, 0);
            test_support::XY a, b;
            while (test_support::next_xy(*device, b)) {
                ASSERT_TRUE(test_support::next_xy(*stream, a));
                ASSERT_EQ(a.size, b.size);
                EXPECT_EQ(std::memcmp(a.x, b.x, a.size * sb), 0);
                EXPECT_EQ(std::memcmp(a.y, b.y, a.size * 4), 0);
                stream->release();
                device->release();
            }
            EXPECT_FALSE(test_support::next_xy(*stream, a));
            const StageTimes t = stream->take_times();
            EXPECT_EQ(t.io.reads, (n + 127) / 128) << order_name(o);
            EXPECT_EQ(t.io.largest, 128 * sb);
            EXPECT_LE(t.cache_peak, stream->host_bytes());
        }
    }
    fs::remove_all(dir);
}
