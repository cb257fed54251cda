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
    std::string driver_version, runtime_version;
};

bool built_with_cuda();
// Empty without CUDA support or without a visible GPU; `why` says which
// (no_gpu_reason's words).
std::vector<GpuInfo> detect_gpus(std::string* why = nullptr);

// cuDNN's version ("9.14.0"); empty in builds without CUDA. Apart from
// detect_gpus so that code that only moves data (the Python package) does
// not load cuDNN: PyTorch bundles its own under the same soname, and a
// process that loaded ours first would hand PyTorch that one (import torch
// after import dstk aborted in free()).
std::string cudnn_version();

// Why this process has no usable GPU, in words a user acts on; nothing when
// it has one. Cheaper than detect_gpus (no device properties).
std::optional<std::string> no_gpu_reason();

// What the CUDA runtime's answer means. driver_missing: cudaDriverGetVersion
// gave 0 (no driver installed); driver_too_old: a driver older than the
// runtime dstk was built with; no_device: a driver that sees no GPU.
enum class GpuAbsence : std::uint8_t { driver_missing, driver_too_old, no_device, other };
std::string describe_no_gpu(GpuAbsence a, int driver_version, int runtime_version, const std::string& detail);
std::string cuda_version_string(int v); // 12040 -> "12.4"

} // namespace dstk
