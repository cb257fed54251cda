#pragma once
// Where work runs: the CPU or one CUDA GPU. The data path and the trainer
// both name a device; neither owns the concept.
#include <cstdint>
#include <string>
#include <string_view>

namespace dstk {

enum class Backend : std::uint8_t { cpu, cuda };

struct Device {
    Backend backend = Backend::cpu;
    int index = 0;
};

Device parse_device(std::string_view text); // "cpu", "cuda", "cuda:N"; usage error naming the setting otherwise
std::string device_name(const Device& d);   // "cpu", "cuda:0"

} // namespace dstk
