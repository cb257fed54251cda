// System facts read from /proc, hwloc and statvfs.
#include <cstdio>
#include <gtest/gtest.h>

#include "dstk/gpu_info.hpp"
#include "dstk/output.hpp"
#include "dstk/sysinfo.hpp"

using namespace dstk;

TEST(SysInfo, MemoryAndCores) {
    const SystemInfo s = detect_system();
    EXPECT_GT(s.memory.total, 0u);
    EXPECT_GT(s.memory.available, 0u);
    EXPECT_LE(s.memory.available, s.memory.total);
    EXPECT_GE(s.logical_cores, 1u);
    EXPECT_GE(s.physical_cores, 1u);
    EXPECT_LE(s.physical_cores, s.logical_cores);
    EXPECT_GE(s.numa_nodes, 1u);
    EXPECT_FALSE(s.cpu_model.empty());
    if (s.hwloc_ok && s.memory.hwloc_total) EXPECT_GT(*s.memory.hwloc_total, 0u);
}

TEST(SysInfo, DisagreementIsReportedNotHidden) {
    MemoryInfo m;
    m.total = 100ull << 30;
    m.hwloc_total = 8ull << 30; // a VM whose memory grew after boot
    EXPECT_TRUE(m.sources_disagree());
    m.hwloc_total = 99ull << 30;
    EXPECT_FALSE(m.sources_disagree());
    m.hwloc_total.reset();
    EXPECT_FALSE(m.sources_disagree());
}

TEST(SysInfo, DiskOfAPathAndOfAPathNotYetCreated) {
    const DiskInfo d = disk_info("/tmp");
    EXPECT_GT(d.total, 0u);
    EXPECT_LE(d.free, d.total);
    EXPECT_FALSE(d.filesystem.empty());
    EXPECT_FALSE(d.mount_point.empty());
    const DiskInfo later = disk_info("/tmp/not/yet/created/out");
    EXPECT_EQ(later.total, d.total);
}

TEST(SysInfo, GpuDetectionSaysWhyWhenThereIsNone) {
    std::string why;
    const auto gpus = detect_gpus(&why);
    if (gpus.empty()) {
        EXPECT_FALSE(why.empty());
        if (!built_with_cuda()) EXPECT_EQ(why, "built without CUDA support");
    } else {
        EXPECT_GT(gpus[0].total_memory, 0u);
        EXPECT_FALSE(gpus[0].name.empty());
    }
    EXPECT_GT(peak_rss_bytes(), 0u);
}

// The data path's reading equals /proc/meminfo's own lines (parsed here
// independently, with sscanf), and detect_system reports the same figures.
TEST(SysInfo, HostMemoryReadingMatchesProcMeminfo) {
    const MemoryReading m = read_host_memory();
    std::FILE* f = std::fopen("/proc/meminfo", "r");
    ASSERT_NE(f, nullptr);
    char line[256];
    unsigned long long total = 0, available = 0, v = 0;
    while (std::fgets(line, sizeof line, f)) {
        if (std::sscanf(line, "MemTotal: %llu", &v) == 1) total = v * 1024;
        if (std::sscanf(line, "MemAvailable: %llu", &v) == 1) available = v * 1024;
    }
    std::fclose(f);
    EXPECT_EQ(m.total, total);
    EXPECT_GT(m.available, 0u);
    EXPECT_LE(m.available, m.total);
    // MemAvailable moves between the two reads; within 1 GiB is the same reading.
    EXPECT_LT(m.available > available ? m.available - available : available - m.available, 1ull << 30);
    EXPECT_EQ(detect_system().memory.total, m.total);
    if (m.cgroup_limit) EXPECT_GT(*m.cgroup_limit, 0u);
}
