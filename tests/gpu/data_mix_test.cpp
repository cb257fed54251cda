// A mix on the GPU: the cuda mix source (member batches staged by device
// copies, gathered by one kernel per field on the compute stream) delivers
// the same batches as the cpu one, every member placement on cuda (device,
// host, stream), fresh and resumed mid-epoch, and holds the memory it planned;
// dstrain trains on a mix on the GPU within the memory ceiling it printed.
#include <gtest/gtest.h>

#include <cstring>
#include <string>
#include <vector>

#include "dstk/data/mix_source.hpp"
#include "dstk/gpu_info.hpp"
#include "dstk/output.hpp"
#include "dstk/run/train_run.hpp"
#include "dstk/gpu_runtime.hpp"
#include "support/test_dataset.hpp"
#include "support/gpu_missing.hpp"

using namespace dstk;
using namespace dstk::data;
using namespace dstk::test_support;

namespace {

using test_support::gpu_missing;

// Member m's sample i: x = u8[3x16x16] bytes (i * 7 + j + m * 50), y = i32 m * 100,000 + i.
const std::vector<Dataset>& datasets() {
    static const std::vector<Dataset> ds = [] {
        std::vector<Dataset> out;
        const std::vector<std::uint64_t> sizes{3000, 1700, 4100};
        for (std::size_t m = 0; m < sizes.size(); ++m) {
            FieldsDataset d;
            d.fields = {{"x", DType::u8, Shape{{3, 16, 16}}, m == 1 ? 256u : 0u}, {"y", DType::i32, Shape{}}};
            d.splits = {{"train", sizes[m]}};
            d.input_field = "x";
            d.label_field = "y";
            const auto dir = write_fields_dataset(temp_path("gpu_mix", "m" + std::to_string(m)), d,
                                                  [m](std::size_t f, std::uint64_t i, std::span<std::uint8_t> b) {
                                                      if (f == 1) {
                                                          const auto v = static_cast<std::int32_t>(m * 100000 + i);
                                                          std::memcpy(b.data(), &v, 4);
                                                          return;
                                                      }
                                                      for (std::size_t j = 0; j < b.size(); ++j)
                                                          b[j] = static_cast<std::uint8_t>(i * 7 + j + m * 50);
                                                  });
            out.push_back(Dataset::open(dir));
        }
        return out;
    }();
    return ds;
}

std::vector<const Dataset*> members() {
    std::vector<const Dataset*> out;
    for (const Dataset& d : datasets()) out.push_back(&d);
    return out;
}

MixPlan plan_on(Device device, void* stream) {
    MixRequest r;
    r.source.device = device;
    r.source.fields = {"x", "dataset", "y", "index"};
    r.source.batch = 128;
    r.source.chunk_samples = 256;
    r.source.window = 2;
    r.source.prefetch = 3;
    r.source.readers = 2;
    r.source.seed = 4;
    r.source.compute_stream = stream;
    r.weights = {2, 1, 1};
    r.placements = {MixPlacement::device, MixPlacement::host, MixPlacement::stream};
    return plan_mix(members(), r, machine_facts(device));
}

// Every batch's fields as bytes on the host, from `first` to the end.
std::vector<std::vector<std::uint8_t>> batches(MixSource& s, bool cuda, void* stream, std::uint64_t first) {
    s.start_epoch(1, first);
    std::vector<std::vector<std::uint8_t>> out;
    while (const Batch* b = s.next()) {
        std::vector<std::uint8_t> bytes;
        for (const BatchField& f : b->fields) {
            const std::uint64_t n = std::uint64_t{b->size} * f.sample_bytes();
            const std::size_t at = bytes.size();
            bytes.resize(at + n);
            if (cuda) {
                gpu::synchronize(stream);
                gpu::copy_d2h(bytes.data() + at, f.data, n);
            } else {
                std::memcpy(bytes.data() + at, f.data, n);
            }
        }
        out.push_back(std::move(bytes));
        s.release();
    }
    return out;
}

} // namespace

TEST(GpuMix, TheCudaMixDeliversTheCpuMixsBatches) {
    if (const auto why = gpu_missing(); !why.empty()) GTEST_SKIP() << why;
    gpu::Stream stream;
    const MixPlan cpu = plan_on({Backend::cpu, 0}, nullptr);
    const MixPlan gpu_plan = plan_on({Backend::cuda, 0}, stream.get());
    auto c = make_mix_source(members(), cpu);
    auto g = make_mix_source(members(), gpu_plan);
    const auto want = batches(*c, false, nullptr, 0);
    ASSERT_EQ(want.size(), cpu.batches);
    EXPECT_EQ(batches(*g, true, stream.get(), 0), want);
    // Resumed mid-epoch.
    const std::uint64_t k = want.size() / 3;
    const auto rest = batches(*g, true, stream.get(), k);
    ASSERT_EQ(rest.size(), want.size() - k);
    for (std::size_t i = 0; i < rest.size(); ++i) EXPECT_EQ(rest[i], want[k + i]) << "batch " << k + i;
    EXPECT_LE(g->device_bytes(), gpu_plan.device_bytes);
}

TEST(GpuMix, DstrainTrainsOnAMixWithinItsCeiling) {
    if (const auto why = gpu_missing(); !why.empty()) GTEST_SKIP() << why;
    run::TrainOptions e;
    for (std::uint64_t m = 0; m < 3; ++m) {
        const auto dir = temp_path("gpu_mix_train", std::to_string(m));
        write_u8_dataset(dir, Shape{{3, 16, 16}}, {{"train", 3000 + 1000 * m}, {"test", 300}}, 10,
                         [m](std::uint64_t i, std::span<std::uint8_t> b) {
                             for (std::size_t j = 0; j < b.size(); ++j)
                                 b[j] = static_cast<std::uint8_t>(i * 3 + j + m * 17);
                             return static_cast<std::int32_t>(i % 10);
                         });
        e.datasets.push_back(dir);
    }
    e.dataset = e.datasets[0];
    e.model = "conv3x3:16,bn,relu,maxpool2,flatten,heads(cls=fc:10>ce:y, source=fc:3>ce:dataset)";
    e.epochs = 2;
    e.batch = 128;
    e.device = dstk::Device{dstk::Backend::cuda, 0};
    e.files.save = {e.datasets[0] / "model.safetensors"};
    run::DataOptions d;
    d.weights = {2, 1, 1};
    d.placements = {"device", "host", "stream"};
    OutputOptions out;
    out.quiet = true;
    out.json = true;
    const run::RunReport r = run::run_training(e, d, out);
    ASSERT_EQ(r.epochs.size(), 2u);
    EXPECT_LE(r.peak_device_bytes, r.memory_ceiling) << r.memory_method;
    EXPECT_GT(r.data_device_bytes, 0u);
    for (const auto& dir : e.datasets) std::filesystem::remove_all(dir);
}
