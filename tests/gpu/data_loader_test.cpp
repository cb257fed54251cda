// The converted-batch engine (data::Loader) on the GPU: every field of every
// batch, converted in one launch on the loader's stream, equals the cpu
// backend's conversion of the same batch in every placement; a batch the
// consumer holds (the newest and `keep` before it) stays intact while the
// feeder converts ahead; a resume mid-epoch and an abandoned iteration give
// the uninterrupted epoch's batches. Skips without a GPU.
#include <gtest/gtest.h>

#include <cstring>
#include <filesystem>
#include <string>
#include <vector>

#include "dstk/data/loader.hpp"
#include "dstk/gpu_info.hpp"
#include "dstk/gpu_runtime.hpp"
#include "support/fields_dataset.hpp"
#include "support/gpu_missing.hpp"

namespace fs = std::filesystem;
using namespace dstk;
using namespace dstk::data;
using test_support::FieldsStorage;

namespace {

constexpr std::uint64_t samples = 700;
const std::vector<std::string> all_fields{"target", "image", "result", "label"};

using test_support::gpu_missing;

LoaderRequest request(Placement p, Backend b) {
    LoaderRequest r;
    r.source.fields = all_fields;
    r.source.placement = p;
    r.source.device = {b, 0};
    r.source.order = Order::chunk;
    r.source.seed = 4;
    r.source.chunk_samples = 50;
    r.source.window = 3;
    r.source.batch = 64;
    r.source.drop_last = false;
    r.labels64 = true;
    return r;
}

using HostBatch = std::vector<std::vector<std::uint8_t>>; // per field

std::vector<HostBatch> host_epoch(const fs::path& dir, std::uint64_t epoch) {
    Loader l(dir, request(Placement::stream, Backend::cpu));
    l.start_epoch(epoch, 0);
    std::vector<HostBatch> all;
    for (;;) {
        HostBatch b;
        std::vector<void*> out;
        for (const FieldOutput& o : l.outputs()) {
            b.emplace_back(l.batch() * o.sample_bytes());
            out.push_back(b.back().data());
        }
        const std::uint32_t n = l.next_host(out);
        if (n == 0) return all;
        for (std::size_t f = 0; f < b.size(); ++f) b[f].resize(n * l.outputs()[f].sample_bytes());
        all.push_back(std::move(b));
    }
}

// A device batch copied to the host after `stream` waited for it.
HostBatch to_host(Loader& l, const DeviceBatch& b, void* stream) {
    l.wait_ready(b.slot, reinterpret_cast<std::uintptr_t>(stream));
    gpu::synchronize(stream);
    HostBatch out;
    for (std::size_t f = 0; f < b.data.size(); ++f) {
        out.emplace_back(b.size * l.outputs()[f].sample_bytes());
        gpu::copy_d2h(out.back().data(), b.data[f], out.back().size());
    }
    return out;
}

struct Data {
    fs::path dir = test_support::write_four_fields(test_support::temp_path("dstk_gpu_loader", "zstd"), samples,
                                                   FieldsStorage::zstd);
    ~Data() { fs::remove_all(dir); }
};

} // namespace

TEST(GpuLoader, EveryFieldEqualsTheCpuConversionInEveryPlacement) {
    if (const auto why = gpu_missing(); !why.empty()) GTEST_SKIP() << why;
    const Data d;
    const auto expect = host_epoch(d.dir, 1);
    gpu::Stream consumer;
    for (const Placement p : {Placement::stream, Placement::device, Placement::managed}) {
        Loader l(d.dir, request(p, Backend::cuda));
        ASSERT_TRUE(l.on_gpu());
        l.start_epoch(1, 0);
        std::size_t k = 0;
        for (DeviceBatch b; l.next_device(b); ++k) {
            ASSERT_LT(k, expect.size());
            const HostBatch got = to_host(l, b, consumer.get());
            for (std::size_t f = 0; f < got.size(); ++f) {
                ASSERT_EQ(got[f].size(), expect[k][f].size()) << placement_name(p) << " " << all_fields[f];
                if (l.outputs()[f].kind == FieldKind::normalised) { // float arithmetic: within rounding
                    const auto* a = reinterpret_cast<const float*>(got[f].data());
                    const auto* e = reinterpret_cast<const float*>(expect[k][f].data());
                    for (std::size_t i = 0; i < got[f].size() / 4; ++i) ASSERT_NEAR(a[i], e[i], 1e-5);
                } else {
                    EXPECT_EQ(got[f], expect[k][f]) << placement_name(p) << " " << all_fields[f] << " batch " << k;
                }
            }
        }
        EXPECT_EQ(k, expect.size()) << placement_name(p);
    }
}

TEST(GpuLoader, HeldBatchesStayIntactWhileTheFeederConvertsAhead) {
    if (const auto why = gpu_missing(); !why.empty()) GTEST_SKIP() << why;
    const Data d;
    const auto expect = host_epoch(d.dir, 0);
    LoaderRequest r = request(Placement::stream, Backend::cuda);
    r.keep = 2;
    Loader l(d.dir, r);
    gpu::Stream consumer;
    l.start_epoch(0, 0);
    std::vector<DeviceBatch> held(3);
    for (DeviceBatch& b : held) ASSERT_TRUE(l.next_device(b)); // batch 0 and keep = 2 after it
    for (std::size_t k = 0; k < held.size(); ++k) {
        const HostBatch got = to_host(l, held[k], consumer.get());
        EXPECT_EQ(got[3], expect[k][3]) << "held batch " << k << " was overwritten";
        EXPECT_EQ(got[0], expect[k][0]) << "held batch " << k << " was overwritten";
    }
}

TEST(GpuLoader, ResumeAndAnAbandonedIterationGiveTheUninterruptedBatches) {
    if (const auto why = gpu_missing(); !why.empty()) GTEST_SKIP() << why;
    const Data d;
    const auto expect = host_epoch(d.dir, 2);
    Loader l(d.dir, request(Placement::stream, Backend::cuda));
    gpu::Stream consumer;
    l.start_epoch(0, 3); // abandoned after one batch, with batches converted ahead
    DeviceBatch b;
    ASSERT_TRUE(l.next_device(b));
    l.start_epoch(2, 5);
    std::size_t k = 5;
    for (; l.next_device(b); ++k) EXPECT_EQ(to_host(l, b, consumer.get())[3], expect[k][3]) << "batch " << k;
    EXPECT_EQ(k, expect.size());
    EXPECT_EQ(l.take_times().batches, expect.size() - 5) << "the abandoned iteration's batches are not counted";
}
