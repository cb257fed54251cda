// Why a GPU test cannot run here, for GTEST_SKIP; empty where it can.
#pragma once

#include <string>

#include "dstk/gpu_info.hpp"

namespace dstk::test_support {

inline std::string gpu_missing() {
    if (!built_with_cuda()) return "built without CUDA support";
    std::string why;
    if (detect_gpus(&why).empty()) return "no CUDA GPU (" + why + ")";
    return {};
}

} // namespace dstk::test_support
