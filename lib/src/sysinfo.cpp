#include "dstk/sysinfo.hpp"

#include <cmath>
#include <fstream>
#include <hwloc.h>
#include <sstream>
#include <sys/statvfs.h>
#include <sys/utsname.h>
#include <thread>
#include <unistd.h>

namespace fs = std::filesystem;

namespace dstk {
namespace {

std::optional<std::uint64_t> meminfo_kib(const std::string& key) {
    std::ifstream in("/proc/meminfo");
    std::string name;
    std::uint64_t value;
    std::string unit;
    while (in >> name >> value) {
        std::getline(in, unit);
        if (name == key + ":") return value * 1024;
    }
    return std::nullopt;
}

std::string cpu_model_name() {
    std::ifstream in("/proc/cpuinfo");
    std::string line;
    while (std::getline(in, line)) {
        if (line.rfind("model name", 0) == 0 || line.rfind("Model", 0) == 0) {
            const auto colon = line.find(':');
            if (colon != std::string::npos) {
                std::string v = line.substr(colon + 1);
                v.erase(0, v.find_first_not_of(' '));
                return v;
            }
        }
    }
    return "unknown";
}

std::optional<std::uint64_t> cgroup_limit(const fs::path& dir) {
    std::ifstream in(dir / "memory.max");
    std::string v;
    if (!(in >> v) || v == "max") return std::nullopt;
    try {
        return std::stoull(v);
    } catch (...) {
        return std::nullopt;
    }
}

// memory.stat's "anon" (bytes), 0 where the file or the key is missing.
std::uint64_t cgroup_anon(const fs::path& dir) {
    std::uint64_t anon = 0;
    std::ifstream stat(dir / "memory.stat");
    std::string key;
    std::uint64_t value = 0;
    while (stat >> key >> value)
        if (key == "anon") anon = value;
    return anon;
}

} // namespace

bool MemoryInfo::sources_disagree() const {
    if (!hwloc_total || total == 0) return false;
    const double a = double(total), b = double(*hwloc_total);
    return std::fabs(a - b) / std::max(a, b) > 0.05;
}

std::filesystem::path own_cgroup_dir() {
    std::ifstream in("/proc/self/cgroup");
    std::string line;
    while (std::getline(in, line))
        if (line.rfind("0::", 0) == 0) return std::filesystem::path("/sys/fs/cgroup") / line.substr(3).substr(1);
    return "/sys/fs/cgroup";
}

SystemInfo detect_system() {
    SystemInfo s;
    char host[256] = {};
    ::gethostname(host, sizeof host - 1);
    s.hostname = host;
    utsname u{};
    if (::uname(&u) == 0) s.kernel = std::string(u.sysname) + " " + u.release;
    s.cpu_model = cpu_model_name();
    s.logical_cores = std::thread::hardware_concurrency();
    s.physical_cores = s.logical_cores;
    s.memory.total = meminfo_kib("MemTotal").value_or(0);
    s.memory.available = meminfo_kib("MemAvailable").value_or(0);
    const fs::path cgroup = own_cgroup_dir();
    s.cgroup_memory_limit = cgroup_limit(cgroup);
    if (s.cgroup_memory_limit) s.cgroup_anon = cgroup_anon(cgroup);

    hwloc_topology_t topo;
    if (hwloc_topology_init(&topo) == 0) {
        if (hwloc_topology_load(topo) == 0) {
            s.hwloc_ok = true;
            const int cores = hwloc_get_nbobjs_by_type(topo, HWLOC_OBJ_CORE);
            const int pus = hwloc_get_nbobjs_by_type(topo, HWLOC_OBJ_PU);
            const int numa = hwloc_get_nbobjs_by_type(topo, HWLOC_OBJ_NUMANODE);
            if (cores > 0) s.physical_cores = static_cast<unsigned>(cores);
            if (pus > 0) s.logical_cores = static_cast<unsigned>(pus);
            if (numa > 0) s.numa_nodes = static_cast<unsigned>(numa);
            std::uint64_t total = 0;
            for (int i = 0; i < numa; ++i) {
                hwloc_obj_t node = hwloc_get_obj_by_type(topo, HWLOC_OBJ_NUMANODE, static_cast<unsigned>(i));
                if (node && node->attr) total += node->attr->numanode.local_memory;
            }
            if (total > 0) s.memory.hwloc_total = total;
        }
        hwloc_topology_destroy(topo);
    }
    return s;
}

DiskInfo disk_info(const fs::path& path) {
    DiskInfo d;
    fs::path p = path.empty() ? fs::path(".") : path;
    std::error_code ec;
    p = fs::absolute(p, ec);
    while (!fs::exists(p, ec) && p.has_parent_path() && p != p.parent_path()) p = p.parent_path();
    struct statvfs st {};
    if (::statvfs(p.c_str(), &st) == 0) {
        d.free = static_cast<std::uint64_t>(st.f_bavail) * st.f_frsize;
        d.total = static_cast<std::uint64_t>(st.f_blocks) * st.f_frsize;
    }
    // The longest mount point that is a prefix of the canonical path.
    const std::string canon = fs::weakly_canonical(p, ec).string();
    std::ifstream in("/proc/self/mountinfo");
    std::string line;
    std::size_t best = 0;
    while (std::getline(in, line)) {
        std::istringstream ls(line);
        std::string id, parent, devno, root, mount, opts, field;
        ls >> id >> parent >> devno >> root >> mount >> opts;
        while (ls >> field && field != "-") {
        }
        std::string fstype, source;
        ls >> fstype >> source;
        const bool prefix =
            canon.rfind(mount, 0) == 0 && (mount == "/" || canon.size() == mount.size() || canon[mount.size()] == '/');
        if (prefix && mount.size() >= best) {
            best = mount.size();
            d.mount_point = mount;
            d.filesystem = fstype;
            d.device = source;
        }
    }
    return d;
}

} // namespace dstk
