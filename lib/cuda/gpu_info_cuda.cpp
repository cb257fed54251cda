// GPU facts through the CUDA runtime (host code: compiled by the C++ compiler).
#include <cuda_runtime_api.h>
#ifdef DSTK_HAVE_NVML
#include <nvml.h>
#endif

#include "dstk/gpu_info.hpp"

namespace dstk {

bool built_with_cuda() {
    return true;
}

std::optional<std::string> no_gpu_reason() {
    int count = 0;
    const cudaError_t err = cudaGetDeviceCount(&count);
    if (err == cudaSuccess && count > 0) return std::nullopt;
    cudaGetLastError(); // clear the error state
    int driver = 0, runtime = 0;
    cudaDriverGetVersion(&driver); // 0 where no driver is installed
    cudaRuntimeGetVersion(&runtime);
    const GpuAbsence a = driver == 0                                      ? GpuAbsence::driver_missing
                         : err == cudaSuccess || err == cudaErrorNoDevice ? GpuAbsence::no_device
                         : err == cudaErrorInsufficientDriver             ? GpuAbsence::driver_too_old
                                                                          : GpuAbsence::other;
    return describe_no_gpu(a, driver, runtime, err == cudaSuccess ? "" : cudaGetErrorString(err));
}

std::vector<GpuInfo> detect_gpus(std::string* why) {
    std::vector<GpuInfo> gpus;
    if (const auto reason = no_gpu_reason()) {
        if (why) *why = *reason;
        return gpus;
    }
    int count = 0;
    cudaGetDeviceCount(&count);
    int driver = 0, runtime = 0;
    cudaDriverGetVersion(&driver);
    cudaRuntimeGetVersion(&runtime);
#ifdef DSTK_HAVE_NVML
    const bool nvml_ok = nvmlInit_v2() == NVML_SUCCESS;
#endif
    int current = 0;
    cudaGetDevice(&current);
    for (int i = 0; i < count; ++i) {
        cudaDeviceProp prop{};
        if (cudaGetDeviceProperties(&prop, i) != cudaSuccess) continue;
        GpuInfo g;
        g.index = i;
        g.name = prop.name;
        g.compute_major = prop.major;
        g.compute_minor = prop.minor;
        g.total_memory = prop.totalGlobalMem;
        g.multiprocessors = prop.multiProcessorCount;
        g.driver_version = cuda_version_string(driver);
        g.runtime_version = cuda_version_string(runtime);
        std::size_t free_b = 0, total_b = 0;
        if (cudaSetDevice(i) == cudaSuccess && cudaMemGetInfo(&free_b, &total_b) == cudaSuccess) g.free_memory = free_b;
#ifdef DSTK_HAVE_NVML
        // PCIe link through NVML: the maximum link, since idle links train down.
        char bus_id[32] = {};
        nvmlDevice_t dev;
        unsigned gen = 0, width = 0;
        if (nvml_ok && cudaDeviceGetPCIBusId(bus_id, sizeof bus_id, i) == cudaSuccess &&
            nvmlDeviceGetHandleByPciBusId_v2(bus_id, &dev) == NVML_SUCCESS) {
            if (nvmlDeviceGetMaxPcieLinkGeneration(dev, &gen) == NVML_SUCCESS) g.pcie_generation = int(gen);
            if (nvmlDeviceGetMaxPcieLinkWidth(dev, &width) == NVML_SUCCESS) g.pcie_width = int(width);
        }
#endif
        gpus.push_back(std::move(g));
    }
    cudaSetDevice(current);
#ifdef DSTK_HAVE_NVML
    if (nvml_ok) nvmlShutdown();
#endif
    return gpus;
}

} // namespace dstk
