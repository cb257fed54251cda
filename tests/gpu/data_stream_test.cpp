// The data path on the GPU: every placement delivers the same batches as the
// host reads, in device memory, every field a caller names (four fields of
// different dtypes, shapes and storages); stream mode holds the same GPU memory
// whatever the dataset size; a training run's measured peak GPU memory stays
// under the ceiling it printed before the first step, and within 1% of it.
#include <gtest/gtest.h>

#include <unistd.h>

#include <cstdio>
#include <filesystem>
#include <string>
#include <utility>
#include <vector>

#include "dstk/data/batch_source.hpp"
#include "support/plan_source.hpp"
#include "support/source_batch.hpp"
#include "dstk/run/train_run.hpp"
#include "dstk/dataset_writer.hpp"
#include "dstk/gpu_info.hpp"
#include "dstk/gpu_runtime.hpp"
#include "support/fields_dataset.hpp"
#include "support/test_dataset.hpp"
#include "support/gpu_missing.hpp"

namespace fs = std::filesystem;
using namespace dstk;
using namespace dstk::data;

namespace {

constexpr std::uint64_t row_bytes = 3 * 32 * 32;

using test_support::gpu_missing;

// Sample i of a split: byte j is (i * 31 + j) & 0xff; its label is i, or
// i mod 10 with `classes` (a dataset to train on). `test` samples more in a
// test split.
fs::path make_dataset(const std::string& name, std::uint64_t samples, bool classes = false, std::uint64_t test = 0) {
    return test_support::write_u8_dataset(test_support::temp_path("dstk_gpu", name), Shape{{3, 32, 32}},
                                          {{"train", samples}, {"test", test}}, 10,
                                          [classes](std::uint64_t i, std::span<std::uint8_t> b) {
                                              for (std::size_t j = 0; j < b.size(); ++j)
                                                  b[j] = static_cast<std::uint8_t>(i * 31 + j);
                                              return static_cast<std::int32_t>(classes ? i % 10 : i);
                                          });
}

struct Stream {
    dstk::gpu::Stream stream;
    void* s = stream.get();
};

SourceRequest config(Placement p, Order o, void* stream) {
    SourceRequest c = test_support::request(p, o, 256, 3, 512, 4);
    c.device = {dstk::Backend::cuda, 0};
    c.prefetch = 4;
    c.readers = 4;
    c.compute_stream = stream;
    return c;
}

std::uint64_t used_now() {
    std::uint64_t f = 0, t = 0;
    dstk::gpu::mem_info(0, f, t);
    return t - f;
}

} // namespace

TEST(GpuDataPath, EveryPlacementDeliversTheOrderedSamplesInDeviceMemory) {
    if (const auto why = gpu_missing(); !why.empty()) GTEST_SKIP() << why;
    const std::uint64_t n = 5000;
    const fs::path dir = make_dataset("content", n);
    const Dataset ds = Dataset::open(dir);
    Stream stream;
    for (const Placement p : {Placement::stream, Placement::device, Placement::managed})
        for (const Order o : {Order::sequential, Order::chunk, Order::full}) {
            SCOPED_TRACE(std::string(placement_name(p)) + " " + std::string(order_name(o)));
            auto src = test_support::open_source(ds, config(p, o, stream.s));
            const EpochOrder order({o, 3, 512, 4}, n, 1);
            src->start_epoch(1, 2);
            std::vector<std::uint8_t> x(256 * row_bytes);
            std::vector<std::int32_t> y(256);
            test_support::XY b;
            std::uint64_t position = 2 * 256;
            while (test_support::next_xy(*src, b)) {
                dstk::gpu::synchronize(stream.s); // the batch is ready for work on the stream
                dstk::gpu::copy_d2h(x.data(), b.x, b.size * row_bytes);
                dstk::gpu::copy_d2h(y.data(), b.y, b.size * 4);
                src->release();
                for (std::uint32_t i = 0; i < b.size; ++i, ++position) {
                    const std::uint64_t s = order[position];
                    ASSERT_EQ(static_cast<std::uint64_t>(y[i]), s) << "position " << position;
                    ASSERT_EQ(x[i * row_bytes + 7], static_cast<std::uint8_t>(s * 31 + 7));
                }
            }
            EXPECT_EQ(position, n / 256 * 256);
        }
    fs::remove_all(dir);
}

// Every field of every batch in device memory is the dataset's value at the
// order's sample index, in every placement, order and storage (.npy, zstd with
// chunks other than the order's, fields in parts), gathered or, for a
// consumer that reads rows (SourceConfig::rows), as the resident split and
// the batch's rows; the GPU memory held is the plan's.
TEST(GpuDataPath, EveryFieldOfEveryPlacementIsTheOrdersSample) {
    if (const auto why = gpu_missing(); !why.empty()) GTEST_SKIP() << why;
    using test_support::FieldsStorage;
    const std::uint64_t n = 1000;
    const std::vector<std::string> names{"target", "image", "result", "label"};
    Stream stream;
    for (const FieldsStorage st : {FieldsStorage::npy, FieldsStorage::zstd, FieldsStorage::parts}) {
        const fs::path dir = test_support::write_four_fields(
            test_support::temp_path("dstk_gpu_fields", test_support::storage_name(st)), n, st);
        const Dataset ds = Dataset::open(dir);
        const auto specs = test_support::four_fields(st);
        for (const Placement p : {Placement::stream, Placement::device, Placement::managed})
            for (const Order o : {Order::sequential, Order::chunk, Order::full})
                for (const bool rows : {false, true}) {
                    const std::string what = std::string(test_support::storage_name(st)) + " " +
                                             std::string(placement_name(p)) + " " + std::string(order_name(o)) +
                                             (rows ? " rows" : "");
                    SCOPED_TRACE(what);
                    SourceRequest c = config(p, o, stream.s);
                    c.rows = rows;
                    const bool expect_rows = rows && p != Placement::stream && o != Order::sequential;
                    c.fields = names;
                    c.seed = 3;
                    c.chunk_samples = 50;
                    c.window = 3;
                    c.batch = 48;
                    c.drop_last = false;
                    const SourcePlan plan = test_support::plan_of(ds, c);
                    auto src = make_batch_source(ds, plan);
                    EXPECT_EQ(plan.device_bytes, src->device_bytes());
                    OrderConfig oc{c.order, c.seed, c.chunk_samples, c.window};
                    oc.chunk_samples = test_support::order_chunk(specs, names, oc.chunk_samples);
                    const EpochOrder order(oc, n, 1);
                    src->start_epoch(1, 2);
                    std::uint64_t position = 2 * 48;
                    while (const Batch* b = src->next()) {
                        dstk::gpu::synchronize(stream.s); // the batch is ready for work on the stream
                        Batch host = *b;
                        std::vector<std::vector<std::uint8_t>> copies;
                        copies.reserve(host.fields.size());
                        for (BatchField& f : host.fields) {
                            const std::uint64_t sb = f.sample_bytes();
                            copies.emplace_back(b->size * sb);
                            ASSERT_EQ(f.rows != nullptr, expect_rows);
                            if (f.rows) { // sample i: row rows[i] of the resident split
                                std::vector<std::uint64_t> at(b->size);
                                dstk::gpu::copy_d2h(at.data(), f.rows, b->size * 8);
                                for (std::uint32_t i = 0; i < b->size; ++i)
                                    dstk::gpu::copy_d2h(copies.back().data() + i * sb,
                                                        static_cast<const std::uint8_t*>(f.data) + at[i] * sb, sb);
                            } else {
                                dstk::gpu::copy_d2h(copies.back().data(), f.data, copies.back().size());
                            }
                            f.data = copies.back().data();
                            f.rows = nullptr;
                        }
                        src->release();
                        test_support::expect_batch_is(host, specs, names, order, position, what);
                        if (HasFatalFailure()) return;
                        position += host.size;
                    }
                    EXPECT_EQ(position, n);
                }
        fs::remove_all(dir);
    }
}

TEST(GpuDataPath, StreamHoldsTheSameGpuMemoryWhateverTheDatasetSize) {
    if (const auto why = gpu_missing(); !why.empty()) GTEST_SKIP() << why;
    Stream stream;
    std::vector<std::uint64_t> peaks;
    for (const std::uint64_t n : {20'000ull, 160'000ull}) { // 59 MiB and 469 MiB of samples
        const fs::path dir = make_dataset("size" + std::to_string(n), n);
        const Dataset ds = Dataset::open(dir);
        const std::uint64_t before = used_now();
        auto src = test_support::open_source(ds, config(Placement::stream, Order::chunk, stream.s));
        src->start_epoch(0, 0);
        test_support::XY b;
        std::uint64_t peak = 0, batches = 0;
        while (test_support::next_xy(*src, b)) {
            src->release();
            if (++batches % 64 == 0) peak = std::max(peak, used_now() - before);
        }
        dstk::gpu::synchronize(stream.s);
        peak = std::max(peak, used_now() - before);
        EXPECT_LE(peak, src->device_bytes() + (4ull << 20)) << "more than the planned slots";
        peaks.push_back(peak);
        src.reset();
        fs::remove_all(dir);
    }
    const double ratio = static_cast<double>(peaks[1]) / static_cast<double>(std::max<std::uint64_t>(peaks[0], 1));
    EXPECT_NEAR(ratio, 1.0, 0.01) << peaks[0] << " vs " << peaks[1] << " bytes";
}

TEST(GpuDataPath, TrainingPeakStaysUnderTheCeilingPrintedBeforeTheFirstStep) {
    if (const auto why = gpu_missing(); !why.empty()) GTEST_SKIP() << why;
    // ref-cnn, batch 256, 120 steps over two epochs; a test split whose last
    // batch is partial (it runs outside the captured graph).
    struct Case {
        const char* placement;
        std::uint64_t samples;
    };
    std::vector<std::uint64_t> stream_ceilings, stream_peaks;
    for (const Case c : {Case{"stream", 20'000}, Case{"stream", 80'000}, Case{"device", 20'000}}) {
        const std::string label = std::string(c.placement) + " " + std::to_string(c.samples);
        SCOPED_TRACE(label);
        const fs::path dir = make_dataset("ceiling" + std::to_string(c.samples), c.samples, true, 1'000);
        run::TrainOptions e;
        e.dataset = dir;
        e.model = "ref-cnn";
        e.epochs = 2;
        e.batch = 256;
        e.device = dstk::Device{dstk::Backend::cuda, 0};
        e.files.save = {dir / "model.safetensors"}; // every run saves its model: into the dataset, removed below
        run::DataOptions d;
        d.data = c.placement;
        d.order = "chunk";
        d.max_steps = 120;
        OutputOptions out;
        out.quiet = true;
        out.json = true; // epoch lines to stderr, silenced
        const run::RunReport r = run::run_training(e, d, out);
        fs::remove_all(dir);
        ASSERT_GT(r.memory_ceiling, 0u);
        EXPECT_EQ(r.memory_ceiling, r.runtime_overhead + r.planned.total() + r.data_device_bytes);
        EXPECT_GT(r.runtime_overhead, 0u) << "the CUDA context alone holds memory";
        EXPECT_LE(r.peak_device_bytes, r.memory_ceiling) << r.memory_method;
        EXPECT_GE(static_cast<double>(r.peak_device_bytes), 0.99 * static_cast<double>(r.memory_ceiling))
            << r.memory_method;
        std::printf(
            "[ %s ] ceiling %llu = overhead %llu + planned %llu + data %llu; peak %llu (%s)\n", label.c_str(),
            static_cast<unsigned long long>(r.memory_ceiling), static_cast<unsigned long long>(r.runtime_overhead),
            static_cast<unsigned long long>(r.planned.total()), static_cast<unsigned long long>(r.data_device_bytes),
            static_cast<unsigned long long>(r.peak_device_bytes), r.memory_method.c_str());
        if (std::string(c.placement) == "stream") {
            stream_ceilings.push_back(r.memory_ceiling);
            stream_peaks.push_back(r.peak_device_bytes);
        }
    }
    ASSERT_EQ(stream_peaks.size(), 2u);
    // Four times the samples in stream mode: the same memory within 1%.
    EXPECT_NEAR(static_cast<double>(stream_peaks[1]) / static_cast<double>(stream_peaks[0]), 1.0, 0.01);
    EXPECT_NEAR(static_cast<double>(stream_ceilings[1]) / static_cast<double>(stream_ceilings[0]), 1.0, 0.01);
}
