// On a GPU machine: a process that sees no GPU (CUDA_VISIBLE_DEVICES empty)
// says so in words, not with the CUDA runtime's error string.
#include <gtest/gtest.h>

#include <array>
#include <cstdio>
#include <string>

#include "dstk/gpu_info.hpp"

TEST(GpuAbsent, DsbenchNamesTheMissingGpu) {
    if (!dstk::built_with_cuda()) GTEST_SKIP() << "built without CUDA support";
    if (auto why = dstk::no_gpu_reason()) GTEST_SKIP() << *why;
    const std::string cmd =
        std::string("CUDA_VISIBLE_DEVICES= ") + DSTK_BIN_DIR + "/dsbench all --cases h2d.pinned --min-time 0.01 2>&1";
    FILE* p = popen(cmd.c_str(), "r");
    ASSERT_NE(p, nullptr);
    std::string text;
    std::array<char, 4096> buf;
    while (fgets(buf.data(), buf.size(), p)) text += buf.data();
    const int status = pclose(p);
    EXPECT_NE(text.find("no NVIDIA GPU found"), std::string::npos) << text;
    EXPECT_EQ(text.find("insufficient"), std::string::npos) << text;
    EXPECT_EQ(WEXITSTATUS(status), 3) << text; // every selected case waived: nothing could be measured
}
