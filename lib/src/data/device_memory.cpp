#include "device_memory.hpp"

#include <dlfcn.h>
#include <unistd.h>

#include <algorithm>
#include <map>
#include <type_traits>
#include <vector>

#include "dstk/gpu_runtime.hpp"

namespace dstk::data {

// The few NVML entry points used, resolved from the driver's library. The
// types mirror nvml.h (its ABI is stable: versioned entry points).
struct DeviceMemoryMeter::Nvml {
    using Device = void*;
    struct Memory {
        unsigned long long total, free, used;
    };
    struct ProcessInfo { // nvmlProcessInfo_t, as the _v3 entry point fills it
        unsigned int pid;
        unsigned long long used;
        unsigned int gpu_instance, compute_instance;
    };
    static constexpr int success = 0, insufficient_size = 7;
    static constexpr unsigned long long not_available = ~0ull;

    void* lib = nullptr;
    bool ready = false;
    int (*init)() = nullptr;
    int (*shutdown)() = nullptr;
    int (*count)(unsigned*) = nullptr;
    int (*by_index)(unsigned, Device*) = nullptr;
    int (*by_bus_id)(const char*, Device*) = nullptr;
    int (*index_of)(Device, unsigned*) = nullptr;
    int (*memory)(Device, Memory*) = nullptr;
    int (*processes)(Device, unsigned*, ProcessInfo*) = nullptr;
    std::map<unsigned, std::uint64_t> used_before; // NVML index -> used bytes before our context
    Device device = nullptr;

    Nvml() {
        lib = ::dlopen("libnvidia-ml.so.1", RTLD_NOW | RTLD_LOCAL);
        if (!lib) return;
        auto get = [this](auto& fn, const char* name) {
            fn = reinterpret_cast<std::remove_reference_t<decltype(fn)>>(::dlsym(lib, name));
            return fn != nullptr;
        };
        ready = get(init, "nvmlInit_v2") && get(shutdown, "nvmlShutdown") && get(count, "nvmlDeviceGetCount_v2") &&
                get(by_index, "nvmlDeviceGetHandleByIndex_v2") && get(by_bus_id, "nvmlDeviceGetHandleByPciBusId_v2") &&
                get(index_of, "nvmlDeviceGetIndex") && get(memory, "nvmlDeviceGetMemoryInfo") &&
                get(processes, "nvmlDeviceGetComputeRunningProcesses_v3") && init() == success;
        if (!ready) return;
        unsigned n = 0;
        if (count(&n) != success) n = 0;
        for (unsigned i = 0; i < n; ++i) {
            Device d = nullptr;
            Memory m{};
            if (by_index(i, &d) == success && memory(d, &m) == success) used_before[i] = m.used;
        }
    }
    ~Nvml() {
        if (ready) shutdown();
        if (lib) ::dlclose(lib);
    }

    // This process's usage on `device`, if NVML lists it.
    bool process_used(std::uint64_t& bytes) const {
        std::vector<ProcessInfo> list(32);
        for (int attempt = 0; attempt < 4; ++attempt) {
            auto n = static_cast<unsigned>(list.size());
            const int rc = processes(device, &n, list.data());
            if (rc == insufficient_size) {
                list.resize(n + 16);
                continue;
            }
            if (rc != success) return false;
            const auto pid = static_cast<unsigned>(::getpid());
            for (unsigned i = 0; i < n; ++i)
                if (list[i].pid == pid && list[i].used != not_available) {
                    bytes = list[i].used;
                    return true;
                }
            return false;
        }
        return false;
    }
    bool device_used(std::uint64_t& bytes) const {
        Memory m{};
        if (memory(device, &m) != success) return false;
        bytes = m.used;
        return true;
    }
};

DeviceMemoryMeter::DeviceMemoryMeter() : nvml_(std::make_unique<Nvml>()) {}
DeviceMemoryMeter::~DeviceMemoryMeter() = default;

void DeviceMemoryMeter::attach(int device) {
    device_ = device;
    attached_ = true;
    std::uint64_t free_b = 0, total_b = 0;
    gpu::mem_info(device, free_b, total_b); // makes the context, so that NVML lists this process
    Nvml& n = *nvml_;
    unsigned index = 0;
    std::uint64_t v = 0;
    if (n.ready && n.by_bus_id(gpu::pci_bus_id(device).c_str(), &n.device) == Nvml::success &&
        n.index_of(n.device, &index) == Nvml::success) {
        if (n.process_used(v)) {
            source_ = Source::nvml_process;
            method_ = "NVML, per process";
            return;
        }
        if (n.used_before.count(index) && n.device_used(v)) {
            source_ = Source::nvml_device;
            method_ = "NVML, device-wide since start";
            baseline_ = n.used_before.at(index);
            return;
        }
    }
    source_ = Source::runtime;
    method_ = "cudaMemGetInfo since the CUDA context was made (the context itself not counted)";
    baseline_ = total_b - free_b;
}

std::uint64_t DeviceMemoryMeter::sample() {
    if (!attached_) return 0;
    std::uint64_t v = 0;
    const bool ok = source_ == Source::nvml_process  ? nvml_->process_used(v)
                    : source_ == Source::nvml_device ? nvml_->device_used(v)
                                                     : false;
    if (!ok) {
        std::uint64_t free_b = 0, total_b = 0;
        gpu::mem_info(device_, free_b, total_b);
        v = total_b - free_b;
        if (source_ != Source::runtime) { // NVML stopped answering: go on from its last figure
            source_ = Source::runtime;
            method_ += " (then cudaMemGetInfo: NVML stopped answering)";
            baseline_ = v > last_ ? v - last_ : 0;
        }
    }
    last_ = v > baseline_ ? v - baseline_ : 0;
    peak_ = std::max(peak_, last_);
    return last_;
}

} // namespace dstk::data
