// The words for a machine without a usable GPU: a user acts on them
// ("no NVIDIA driver or GPU found" rather than the CUDA runtime's "driver
// version is insufficient" where no driver exists at all).
#include <gtest/gtest.h>

#include "dstk/gpu_info.hpp"

using namespace dstk;

TEST(GpuInfo, NoGpuWords) {
    EXPECT_EQ(describe_no_gpu(GpuAbsence::driver_missing, 0, 13000, "CUDA driver version is insufficient"),
              "no NVIDIA driver or GPU found");
    EXPECT_EQ(describe_no_gpu(GpuAbsence::driver_too_old, 12020, 13000, "x"),
              "the NVIDIA driver supports CUDA 12.2, older than the CUDA 13.0 runtime dstk was built with; update the "
              "driver");
    EXPECT_NE(describe_no_gpu(GpuAbsence::no_device, 13000, 13000, "").find("no NVIDIA GPU found"), std::string::npos);
    EXPECT_EQ(describe_no_gpu(GpuAbsence::other, 13000, 13000, "launch failure"), "no usable GPU (launch failure)");
    EXPECT_EQ(cuda_version_string(12040), "12.4");
}

TEST(GpuInfo, ReasonAgreesWithDetection) {
    std::string why;
    const auto gpus = detect_gpus(&why);
    const auto reason = no_gpu_reason();
    EXPECT_EQ(gpus.empty(), reason.has_value());
    if (reason) EXPECT_EQ(why, *reason);
    if (!built_with_cuda()) EXPECT_EQ(reason.value_or(""), "built without CUDA support");
}
