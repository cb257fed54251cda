#pragma once
// What the GPU is, when there is one and GPU support was built.
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace dstk {

struct GpuInfo {
    int index = 0;
    std::string name;
    int compute_major = 0, compute_minor = 0;
    std::uint64_t total_memory = 0, free_memory = 0;
    int pcie_generation = 0, pcie_width = 0; // 0 where unknown
    int multiprocessors = 0;
    std::string driver_version, runtime_version, cudnn_version;
};

bool built_with_cuda();
// Empty without CUDA support or without a visible GPU; `why` says which.
std::vector<GpuInfo> detect_gpus(std::string* why = nullptr);

} // namespace dstk
