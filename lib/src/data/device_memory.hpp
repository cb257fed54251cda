#pragma once
// The GPU memory this process holds, measured the best way the machine allows
// (method()):
//   "NVML, per process"   NVML's usage for this pid: the CUDA context, library
//                         handles, loaded kernels and every allocation.
//   "NVML, device-wide since start"  NVML's used memory of the device less what
//                         it was before this process made its CUDA context
//                         (where NVML lists no usage for this pid, e.g. in a
//                         PID namespace); other processes' changes count too.
//   "cudaMemGetInfo since attach"  total - free less the same at attach(), when
//                         NVML is missing: the CUDA context made before
//                         attach() is not counted.
// NVML is loaded at run time (libnvidia-ml.so.1, installed with the driver),
// so any build measures per process where the driver allows it.
#include <cstdint>
#include <memory>
#include <string>

namespace dstk::data {

class DeviceMemoryMeter {
  public:
    // Reads NVML's device-wide figures while this process has no CUDA context
    // yet (the baseline of the device-wide method): construct it first.
    DeviceMemoryMeter();
    ~DeviceMemoryMeter();
    DeviceMemoryMeter(const DeviceMemoryMeter&) = delete;
    DeviceMemoryMeter& operator=(const DeviceMemoryMeter&) = delete;

    // Binds to the CUDA device trained on (making its context) and picks the
    // method; a no_fit_error in a build without CUDA (gpu_runtime.hpp).
    void attach(int device);
    bool attached() const { return attached_; }
    // Bytes held now; raises peak(). 0 before attach().
    std::uint64_t sample();
    std::uint64_t peak() const { return peak_; }
    void reset_peak() { peak_ = 0; }
    const std::string& method() const { return method_; }

  private:
    struct Nvml;
    enum class Source : std::uint8_t { none, nvml_process, nvml_device, runtime };
    std::unique_ptr<Nvml> nvml_;
    Source source_ = Source::none;
    bool attached_ = false;
    int device_ = 0;
    std::string method_ = "none";
    std::uint64_t baseline_ = 0;
    std::uint64_t last_ = 0, peak_ = 0;
};

} // namespace dstk::data
