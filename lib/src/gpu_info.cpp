// GPU facts: the words for a missing GPU (every build), and in builds without
// CUDA the facts themselves (lib/cuda/gpu_info_cuda.cpp replaces those).
#include "dstk/gpu_info.hpp"

namespace dstk {

std::string cuda_version_string(int v) {
    return std::to_string(v / 1000) + "." + std::to_string((v % 1000) / 10);
}

std::string describe_no_gpu(GpuAbsence a, int driver_version, int runtime_version, const std::string& detail) {
    switch (a) {
    case GpuAbsence::driver_missing:
        return "no NVIDIA driver or GPU found";
    case GpuAbsence::driver_too_old:
        return "the NVIDIA driver supports CUDA " + cuda_version_string(driver_version) + ", older than the CUDA " +
               cuda_version_string(runtime_version) + " runtime dstk was built with; update the driver";
    case GpuAbsence::no_device:
        return "no NVIDIA GPU found (the driver sees none; CUDA_VISIBLE_DEVICES?)";
    case GpuAbsence::other:
        break;
    }
    return "no usable GPU (" + detail + ")";
}

#ifndef DSTK_HAVE_CUDA
bool built_with_cuda() {
    return false;
}

std::optional<std::string> no_gpu_reason() {
    return "built without CUDA support";
}

std::vector<GpuInfo> detect_gpus(std::string* why) {
    if (why) *why = *no_gpu_reason();
    return {};
}

std::string cudnn_version() {
    return {};
}
#endif

} // namespace dstk
