#pragma once
// Facts about this machine, as far as they can be read.
#include <cstdint>
#include <filesystem>
#include <optional>
#include <string>

namespace dstk {

struct MemoryInfo {
    std::uint64_t total = 0;                  // /proc/meminfo MemTotal
    std::uint64_t available = 0;              // /proc/meminfo MemAvailable
    std::optional<std::uint64_t> hwloc_total; // hwloc's sum of NUMA node memory
    // True where /proc/meminfo and hwloc disagree by more than 5% (VMs whose
    // memory grows while running, containers with limits).
    bool sources_disagree() const;
};

struct SystemInfo {
    std::string hostname, kernel, cpu_model;
    unsigned logical_cores = 0, physical_cores = 0, numa_nodes = 1;
    bool hwloc_ok = false;
    MemoryInfo memory;
    std::optional<std::uint64_t> cgroup_memory_limit; // MemoryReading::cgroup_limit
};

SystemInfo detect_system();

// The host memory figures alone (/proc/meminfo and the cgroup), without
// hwloc's topology: what the data path plans with, cheap to call often.
struct MemoryReading {
    std::uint64_t total = 0, available = 0; // /proc/meminfo MemTotal, MemAvailable
    // The memory cgroup's limit when set: cgroup v2 memory.max, else the v1
    // controller's hierarchical_memory_limit.
    std::optional<std::uint64_t> cgroup_limit;
    std::uint64_t cgroup_anon = 0; // that cgroup's anonymous memory (v2 memory.stat "anon", v1 "total_rss")
};
MemoryReading read_host_memory();

// This process's cgroup v2 directory (/proc/self/cgroup's "0::" line under
// /sys/fs/cgroup): where its memory.max and memory.stat are.
std::filesystem::path own_cgroup_dir();

struct DiskInfo {
    std::uint64_t free = 0, total = 0; // statvfs, bytes available to this user
    std::string filesystem;            // "ext4", "tmpfs", ... from /proc/self/mountinfo
    std::string mount_point, device;
};
DiskInfo disk_info(const std::filesystem::path& path); // path or its nearest existing parent

} // namespace dstk
