// The one field reader: a run opens each dataset file once (the dataset API
// and the stream source share the reader), and a field stored in parts reads
// as one run of samples in both storages, through every kind of read (ranges,
// gathers, whole chunks for the window cache), with per-part verification and
// errors that name a missing or short part.
#include <gtest/gtest.h>

#include <fcntl.h>
#include <unistd.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <numeric>
#include <string>
#include <vector>

#include "dstk/bench/case.hpp"
#include "dstk/chunked_file.hpp"
#include "dstk/data/batch_source.hpp"
#include "support/source_batch.hpp"
#include "dstk/data/window_cache.hpp"
#include "dstk/dataset.hpp"
#include "dstk/dataset_writer.hpp"
#include "dstk/error.hpp"
#include "dstk/field_reader.hpp"
#include "dstk/thread_pool.hpp"
#include "support/test_dataset.hpp"
#include "support/error_of.hpp"

namespace fs = std::filesystem;
using namespace dstk;
using test_support::error_of;
using namespace dstk::data;

namespace {

std::uint8_t byte_of(std::uint64_t sample, std::uint64_t j) {
    return static_cast<std::uint8_t>(sample * 11 + j * 5 + 3);
}

// Descriptors of this process open on `file`.
int descriptors_of(const fs::path& file) {
    int n = 0;
    const fs::path want = fs::canonical(file);
    for (const auto& e : fs::directory_iterator("/proc/self/fd")) {
        std::error_code ec;
        const fs::path target = fs::read_symlink(e.path(), ec);
        if (!ec && target == want) ++n;
    }
    return n;
}

bool o_direct_works(const fs::path& file) {
    const int fd = ::open(file.c_str(), O_RDONLY | O_DIRECT);
    if (fd < 0) return false;
    ::close(fd);
    return true;
}

// A split whose x (u8, sample_bytes each, byte_of) and y (i32 labels = the
// sample's index) are stored in parts of the given sizes, written by the
// library's own writers into `dir`.
SplitInfo write_parts(const fs::path& dir, Storage storage, const std::vector<std::uint64_t>& sizes, std::uint64_t sb,
                      std::uint64_t chunk_samples) {
    fs::remove_all(dir);
    fs::create_directories(dir);
    SplitInfo split;
    split.name = "train";
    split.samples = std::accumulate(sizes.begin(), sizes.end(), std::uint64_t{0});
    FieldInfo x, y;
    x.name = "x";
    x.dtype = DType::u8;
    x.shape = Shape{{sb}};
    y.name = "y";
    y.dtype = DType::i32;
    y.shape = Shape{};
    ThreadPool pool(2);
    std::uint64_t first = 0;
    for (std::size_t p = 0; p < sizes.size(); ++p) {
        std::vector<std::uint8_t> xs(sizes[p] * sb);
        std::vector<std::int32_t> ys(sizes[p]);
        for (std::uint64_t i = 0; i < sizes[p]; ++i) {
            for (std::uint64_t j = 0; j < sb; ++j) xs[i * sb + j] = byte_of(first + i, j);
            ys[i] = static_cast<std::int32_t>(first + i);
        }
        for (FieldInfo* f : {&x, &y}) {
            const void* data = f == &x ? static_cast<const void*>(xs.data()) : ys.data();
            const std::string name =
                "train_" + f->name + ".part" + std::to_string(p) + (storage == Storage::npy ? ".npy" : ".zst");
            FieldPart part{name, sizes[p], 0, ""};
            if (storage == Storage::npy) {
                NpyFieldWriter w(dir / name, name, f->name, f->dtype, f->shape, sizes[p]);
                w.append(data, sizes[p]);
                const FieldInfo done = w.finish();
                part.bytes = done.bytes;
                part.checksum = done.checksum;
            } else {
                ChunkedWriter w(dir / name, f->sample_bytes(), chunk_samples, 1, pool);
                w.append(data, sizes[p]);
                part.checksum = w.finish();
                part.bytes = w.file_bytes();
            }
            f->parts.push_back(part);
            f->bytes += part.bytes; // the manifest's size of a field in parts: its parts' sum
        }
        first += sizes[p];
    }
    for (FieldInfo* f : {&x, &y}) {
        f->storage = storage;
        f->chunk_samples = storage == Storage::npy ? 0 : chunk_samples;
    }
    split.fields = {x, y};
    return split;
}

void expect_samples(const std::vector<std::uint8_t>& got, std::uint64_t first, std::uint64_t sb,
                    const std::string& what) {
    for (std::uint64_t i = 0; i < got.size() / sb; ++i)
        for (std::uint64_t j = 0; j < sb; ++j)
            if (got[i * sb + j] != byte_of(first + i, j)) {
                ADD_FAILURE() << what << ": sample " << first + i << " byte " << j;
                return;
            }
}

struct Layout {
    Storage storage;
    std::vector<std::uint64_t> sizes;
    const char* name;
};

// Parts cut at whole chunks (what dsconvert --merge makes), and cut anywhere
// (an empty part, a part of one sample, chunks across part boundaries).
const std::vector<Layout> layouts = {
    {Storage::npy, {96, 64, 45}, "npy_chunk_cuts"},
    {Storage::npy, {50, 1, 0, 77, 30}, "npy_any_cuts"},
    {Storage::zstd_chunked, {96, 64, 45}, "zstd_chunk_cuts"},
    {Storage::zstd_chunked, {50, 1, 0, 77, 30}, "zstd_any_cuts"},
};
constexpr std::uint64_t chunk = 32, sb = 20;

} // namespace

TEST(FieldReader, AFieldInPartsReadsAsOneRunOfSamples) {
    for (const Layout& l : layouts) {
        const fs::path dir = test_support::temp_path("dstk_parts", l.name);
        const SplitInfo split = write_parts(dir, l.storage, l.sizes, sb, chunk);
        const auto x = open_field_reader(dir, split, split.fields[0]);
        const std::uint64_t n = split.samples;
        ASSERT_EQ(x->samples(), n) << l.name;
        // Every range that starts or ends near a part boundary, and the whole field.
        std::vector<std::uint8_t> got;
        for (std::uint64_t first = 0; first < n; first += 7)
            for (const std::uint64_t count : {1ull, 13ull, 60ull, 130ull}) {
                const std::uint64_t c = std::min<std::uint64_t>(count, n - first);
                got.assign(c * sb, 0);
                x->read(first, c, got.data());
                expect_samples(got, first, sb, std::string(l.name) + " read");
            }
        // Gathers across parts, decreasing and repeated indices included.
        std::vector<std::uint64_t> idx;
        for (std::uint64_t i = 0; i < n; ++i) idx.push_back((i * 37 + 11) % n);
        idx.push_back(idx.back());
        got.assign(idx.size() * sb, 0);
        x->gather(idx, got.data());
        for (std::size_t i = 0; i < idx.size(); ++i) {
            std::vector<std::uint8_t> one(got.begin() + static_cast<std::ptrdiff_t>(i * sb),
                                          got.begin() + static_cast<std::ptrdiff_t>((i + 1) * sb));
            expect_samples(one, idx[i], sb, std::string(l.name) + " gather");
        }
        // Whole order chunks, as the window cache reads them.
        for (std::uint64_t first = 0; first < n; first += chunk) {
            const std::uint64_t c = std::min(chunk, n - first);
            std::vector<std::uint8_t> buf(x->range_buffer_bytes(c));
            const std::uint64_t off = x->read_range(first, c, buf.data());
            got.assign(buf.begin() + static_cast<std::ptrdiff_t>(off),
                       buf.begin() + static_cast<std::ptrdiff_t>(off + c * sb));
            expect_samples(got, first, sb, std::string(l.name) + " read_range");
        }
        EXPECT_NO_THROW(x->verify()) << l.name;
        // dsconvert's reads: the whole field, zstd chunks decoded on a pool.
        ThreadPool pool(2);
        got.assign(n * sb, 0);
        x->read(0, n, got.data(), &pool);
        expect_samples(got, 0, sb, std::string(l.name) + " read on a pool");
        EXPECT_NO_THROW(x->verify(&pool)) << l.name;
        EXPECT_NE(error_of([&] { x->read(n - 1, 2, got.data()); }).find("outside"), std::string::npos);
        fs::remove_all(dir);
    }
}

TEST(FieldReader, TheWindowCacheReadsAFieldInPartsChunkByChunk) {
    for (const Layout& l : layouts) {
        const fs::path dir = test_support::temp_path("dstk_parts_window", l.name);
        const SplitInfo split = write_parts(dir, l.storage, l.sizes, sb, chunk);
        const auto x = open_field_reader(dir, split, split.fields[0]);
        const auto y = open_field_reader(dir, split, split.fields[1]);
        const bool direct = l.storage == Storage::npy && o_direct_works(dir / split.fields[0].parts[0].file);
        x->set_direct(direct);
        ASSERT_EQ(x->direct(), direct) << l.name;
        const OrderConfig oc{Order::chunk, 5, chunk, 2};
        const std::vector<CachedBytes> bytes{{sb, direct}, {4, false}};
        WindowCache cache({{x.get(), !direct}, {y.get(), false}}, min_window_cache_bytes(oc, bytes), 3);
        const std::uint64_t n = split.samples, batch = 24;
        for (const std::uint64_t epoch : {0ull, 3ull}) {
            const EpochOrder order(oc, n, epoch);
            cache.start(order, 0);
            std::vector<std::uint8_t> xs(batch * sb);
            std::vector<std::int32_t> ys(batch);
            for (std::uint64_t p = 0; p < n; p += batch) {
                const std::uint64_t c = std::min(batch, n - p);
                const std::vector<std::uint8_t*> out{xs.data(), reinterpret_cast<std::uint8_t*>(ys.data())};
                cache.gather(p, c, out);
                for (std::uint64_t i = 0; i < c; ++i) {
                    ASSERT_EQ(static_cast<std::uint64_t>(ys[i]), order[p + i]) << l.name << " position " << p + i;
                    std::vector<std::uint8_t> one(xs.begin() + static_cast<std::ptrdiff_t>(i * sb),
                                                  xs.begin() + static_cast<std::ptrdiff_t>((i + 1) * sb));
                    expect_samples(one, order[p + i], sb, std::string(l.name) + " window");
                }
                cache.consumed(p + c);
            }
            const CacheStats s = cache.take_stats();
            // One read per order chunk where chunks lie inside parts; a chunk
            // across a part boundary is one read per part it touches (O_DIRECT)
            // or one assembled read (buffered, zstd).
            const std::uint64_t chunks = (n + chunk - 1) / chunk;
            if (std::string(l.name).find("chunk_cuts") != std::string::npos) EXPECT_EQ(s.io[0].reads, chunks) << l.name;
            EXPECT_GE(s.io[0].reads, chunks) << l.name;
            if (std::string(l.name).find("zstd") == std::string::npos)
                EXPECT_GE(s.io[0].bytes, n * sb) << l.name;
            else // the compressed frames: what came from the disk
                EXPECT_GT(s.io[0].bytes, 0u) << l.name;
        }
        fs::remove_all(dir);
    }
}

TEST(FieldReader, AMissingOrShortPartIsNamed) {
    for (const Storage storage : {Storage::npy, Storage::zstd_chunked}) {
        const std::string name = storage == Storage::npy ? "npy" : "zstd";
        const fs::path dir = test_support::temp_path("dstk_parts_bad", name);
        SplitInfo split = write_parts(dir, storage, {64, 64, 10}, sb, chunk);
        const FieldInfo& x = split.fields[0];
        const fs::path second = dir / x.parts[1].file;

        // A part that is not there.
        fs::rename(second, dir / "moved");
        std::string e = error_of([&] { open_field_reader(dir, split, x); });
        EXPECT_NE(e.find(x.parts[1].file), std::string::npos) << e;
        EXPECT_NE(e.find("part 2 of 3"), std::string::npos) << e;
        EXPECT_NE(e.find("No such file"), std::string::npos) << e;
        fs::rename(dir / "moved", second);

        // A part cut short.
        const auto full = fs::file_size(second);
        fs::copy_file(second, dir / "whole");
        fs::resize_file(second, full - 100);
        e = error_of([&] { open_field_reader(dir, split, x); });
        EXPECT_NE(e.find("part 2 of 3"), std::string::npos) << e;
        EXPECT_NE(e.find("truncated"), std::string::npos) << e;
        fs::rename(dir / "whole", second);

        // A part that changed after open: verify names it (and the chunk, where there are chunks).
        const auto r = open_field_reader(dir, split, x);
        {
            std::fstream f(second, std::ios::in | std::ios::out | std::ios::binary);
            f.seekp(static_cast<std::streamoff>(full - 200));
            f.put('\x5a');
        }
        e = error_of([&] { r->verify(); });
        EXPECT_NE(e.find(x.parts[1].file), std::string::npos) << e;
        if (storage == Storage::zstd_chunked) EXPECT_NE(e.find("chunk"), std::string::npos) << e;

        // Parts that do not add up to the split.
        split.samples += 1;
        e = error_of([&] { open_field_reader(dir, split, split.fields[0]); });
        EXPECT_NE(e.find("138 samples but the split has 139"), std::string::npos) << e;
        fs::remove_all(dir);
    }
}

// Before the one reader, a stream source opened every file a second time
// beside the dataset's own descriptor.
TEST(FieldReader, AStreamRunOpensEachFileOnce) {
    const std::uint64_t n = 900;
    const fs::path dir =
        test_support::write_u8_dataset(test_support::temp_path("dstk_reader", "once"), Shape{{sb}}, {{"train", n}}, 10,
                                       [](std::uint64_t i, std::span<std::uint8_t> b) {
                                           for (std::size_t j = 0; j < b.size(); ++j) b[j] = byte_of(i, j);
                                           return static_cast<std::int32_t>(i % 10);
                                       });
    const Dataset ds = Dataset::open(dir);
    const fs::path xf = dir / ds.manifest().split("train").field("x").file;
    const fs::path yf = dir / ds.manifest().split("train").field("y").file;
    EXPECT_EQ(descriptors_of(xf), 1);
    for (const Order o : {Order::chunk, Order::full}) {
        SourceConfig c;
        c.placement = Placement::stream;
        c.device = {dstk::Backend::cpu, 0};
        c.order = {o, 3, 64, 2};
        c.batch = 50;
        c.readers = 3;
        auto s = make_batch_source(ds, "train", c);
        s->start_epoch(0, 0);
        test_support::XY b;
        std::uint64_t seen = 0;
        while (test_support::next_xy(*s, b)) {
            seen += b.size;
            s->release();
        }
        EXPECT_EQ(seen, n);
        EXPECT_EQ(descriptors_of(xf), 1) << order_name(o);
        EXPECT_EQ(descriptors_of(yf), 1) << order_name(o);
        const StageTimes t = s->take_times();
        EXPECT_GT(t.io.reads, 0u) << "the stream's reads are counted on the dataset's reader";
    }
    if (o_direct_works(xf)) { // the O_DIRECT descriptor is the one addition, for the input only
        SourceConfig c;
        c.placement = Placement::stream;
        c.device = {dstk::Backend::cpu, 0};
        c.order = {Order::chunk, 3, 64, 2};
        c.batch = 50;
        c.direct = true;
        auto s = make_batch_source(ds, "train", c);
        EXPECT_EQ(descriptors_of(xf), 2);
        EXPECT_EQ(descriptors_of(yf), 1);
    }
    fs::remove_all(dir);
}

// A dataset whose fields are in parts, through its manifest (as dsconvert
// --merge writes it): Dataset::open validates every part, and the stream
// placement (window cache, and the full order's gathers) delivers the batches
// of the device placement.
TEST(FieldReader, ADatasetInPartsStreamsTheDeviceBatches) {
    for (const Layout& l : layouts) {
        const fs::path dir = test_support::temp_path("dstk_parts_dataset", l.name);
        Manifest m;
        m.splits = {write_parts(dir, l.storage, l.sizes, sb, chunk)};
        const std::uint64_t n = m.splits[0].samples;
        m.num_classes = static_cast<std::uint32_t>(n);
        m.provenance.tool = "field_reader_test";
        std::ofstream(dir / manifest_file_name) << serialize_manifest(m);
        const Dataset ds = Dataset::open(dir);
        ASSERT_EQ(ds.manifest().split("train").field("x").parts.size(), l.sizes.size()) << l.name;
        // dsbench's file cases read the first part; its loader cases, the dataset.
        const bench::Target t = bench::open_target(dir, 0);
        EXPECT_EQ(t.file, dir / m.splits[0].fields[0].parts[0].file) << l.name;
        if (l.storage == Storage::npy) EXPECT_EQ(t.samples(), l.sizes[0]) << l.name;
        for (const Order o : {Order::sequential, Order::chunk, Order::full}) {
            std::vector<std::vector<std::int32_t>> labels;
            for (const Placement p : {Placement::stream, Placement::device}) {
                SourceConfig c;
                c.placement = p;
                c.device = {dstk::Backend::cpu, 0};
                c.order = {o, 7, chunk, 2};
                c.batch = 16;
                c.drop_last = false;
                auto s = make_batch_source(ds, "train", c);
                s->start_epoch(1, 0);
                test_support::XY b;
                labels.emplace_back();
                while (test_support::next_xy(*s, b)) {
                    const auto* x = static_cast<const std::uint8_t*>(b.x);
                    for (std::uint32_t i = 0; i < b.size; ++i) {
                        labels.back().push_back(b.y[i]);
                        std::vector<std::uint8_t> one(x + i * sb, x + (i + 1) * sb);
                        expect_samples(one, static_cast<std::uint64_t>(b.y[i]), sb, l.name);
                    }
                    s->release();
                }
            }
            EXPECT_EQ(labels[0].size(), n) << l.name << " " << order_name(o);
            EXPECT_EQ(labels[0], labels[1]) << l.name << " " << order_name(o);
        }
        EXPECT_NO_THROW(verify_dataset(dir)) << l.name;
        fs::remove_all(dir);
    }
}
