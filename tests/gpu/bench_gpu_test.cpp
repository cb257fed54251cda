// dsbench's GPU side on a real GPU: transfers move data at plausible rates,
// managed cases stay inside their memory limit, conversion kernels agree with
// the CPU conversion bit for bit.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>

#include "dstk/bench/gpu.hpp"
#include "dstk/bench/measure.hpp"
#include "dstk/dtype.hpp"
#include "dstk/error.hpp"

using namespace dstk::bench;

#define SKIP_WITHOUT_GPU()                                                                                             \
    if (auto why = gpu_unavailable()) GTEST_SKIP() << "dsbench GPU cases: " << *why

TEST(BenchGpu, PinnedBeatsPageableAndIsPlausible) {
    SKIP_WITHOUT_GPU();
    const RepeatPolicy policy{3, 0.0, 10};
    auto rate = [&](Transfer kind) {
        TransferBench b(kind, 64ull << 20);
        const auto s = time_repetitions(
            policy, [&] { b.prepare(); }, [&] { return b.run(); });
        return rate_metric(double(64ull << 20) * double(b.ops_per_run()), s, "B/s").median;
    };
    const double pinned = rate(Transfer::pinned), pageable = rate(Transfer::pageable);
    std::printf("pinned %.2f GB/s, pageable %.2f GB/s\n", pinned / 1e9, pageable / 1e9);
    EXPECT_GT(pinned, 2e9);  // any PCIe Gen3 x8 link or better
    EXPECT_LT(pinned, 1e12); // not a timing artefact
    EXPECT_GT(pinned, pageable * 0.9);
}

TEST(BenchGpu, ManagedAndZeroCopyCasesRun) {
    SKIP_WITHOUT_GPU();
    for (Transfer kind :
         {Transfer::managed_fault, Transfer::managed_prefetch, Transfer::managed_accessed_by, Transfer::zero_copy}) {
        SCOPED_TRACE(std::string(transfer_name(kind)));
        try {
            TransferBench b(kind, 16ull << 20);
            b.prepare();
            const double s = b.run();
            EXPECT_GT(s, 0);
            EXPECT_LT(s, 10);
        } catch (const dstk::Error& e) {
            // Waived (no concurrent managed access) is acceptable; a failure is not.
            EXPECT_EQ(e.code(), dstk::ExitCode::no_fit) << e.what();
        }
    }
}

TEST(BenchGpu, ManagedAllocationsStayUnderAQuarterOfFreeMemory) {
    SKIP_WITHOUT_GPU();
    try {
        TransferBench b(Transfer::managed_prefetch, 1ull << 50); // 1 PiB: must be refused before allocating
        FAIL() << "a 1 PiB managed allocation was accepted";
    } catch (const dstk::Error& e) {
        EXPECT_EQ(e.code(), dstk::ExitCode::no_fit);
        EXPECT_NE(std::string(e.what()).find("quarter"), std::string::npos) << e.what();
    }
}

TEST(BenchGpu, ConversionKernelsMatchTheCpu) {
    SKIP_WITHOUT_GPU();
    const std::uint64_t n = 1 << 16;
    for (dstk::DType from : {dstk::DType::u8, dstk::DType::bf16, dstk::DType::f16}) {
        SCOPED_TRACE(std::string(dstk::dtype_name(from)));
        std::vector<std::uint8_t> in(n * dstk::dtype_size(from));
        for (std::size_t i = 0; i < in.size(); ++i) in[i] = static_cast<std::uint8_t>(i * 131 + 7);
        GpuConvertBench b(from, n);
        b.upload(in.data(), n);
        EXPECT_GT(b.run(), 0);
        const auto got = b.results(n);
        for (std::uint64_t i = 0; i < n; ++i) {
            float want;
            if (from == dstk::DType::u8)
                want = float(in[i]);
            else {
                const std::uint16_t h = std::uint16_t(in[2 * i] | (in[2 * i + 1] << 8));
                want = from == dstk::DType::bf16 ? dstk::bf16_to_float(h) : dstk::f16_to_float(h);
            }
            if (std::isnan(want))
                ASSERT_TRUE(std::isnan(got[i])) << i;
            else
                ASSERT_EQ(got[i], want) << i;
        }
    }
}
