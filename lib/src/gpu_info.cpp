// GPU facts in builds without CUDA; lib/cuda/gpu_info_cuda.cpp replaces this.
#ifndef DSTK_HAVE_CUDA
#include "dstk/gpu_info.hpp"

namespace dstk {

bool built_with_cuda() {
    return false;
}

std::vector<GpuInfo> detect_gpus(std::string* why) {
    if (why) *why = "built without CUDA support";
    return {};
}

} // namespace dstk
#endif
