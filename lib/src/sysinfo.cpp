#include "dstk/sysinfo.hpp"

#include <charconv>
#include <cmath>
#include <fcntl.h>
#include <fstream>
#include <hwloc.h>
#include <sstream>
#include <sys/statvfs.h>
#include <sys/utsname.h>
#include <thread>
#include <unistd.h>

#include "dstk/fd.hpp"

namespace fs = std::filesystem;

namespace dstk {
namespace {

// The whole of a small /proc or /sys file, read with plain read(2): these
// files are parsed without iostreams or locales.
std::string read_small_file(const fs::path& path) {
    std::string text;
    const UniqueFd fd = UniqueFd::try_open(path, O_RDONLY);
    if (!fd) return text;
    char buf[4096];
    for (;;) {
        const ssize_t n = ::read(fd.get(), buf, sizeof buf);
        if (n <= 0) break;
        text.append(buf, static_cast<std::size_t>(n));
    }
    return text;
}

// The number after `key` at the start of a line of `text` ("MemTotal:", "anon").
std::optional<std::uint64_t> field_value(std::string_view text, std::string_view key) {
    for (std::size_t at = 0; at < text.size();) {
        const std::size_t end = std::min(text.find('\n', at), text.size());
        const std::string_view line = text.substr(at, end - at);
        if (line.size() > key.size() && line.substr(0, key.size()) == key &&
            (line[key.size()] == ' ' || line[key.size()] == '\t')) {
            std::size_t p = key.size();
            while (p < line.size() && (line[p] == ' ' || line[p] == '\t')) ++p;
            std::uint64_t v = 0;
            const auto r = std::from_chars(line.data() + p, line.data() + line.size(), v);
            if (r.ec == std::errc()) return v;
            return std::nullopt;
        }
        at = end + 1;
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

std::optional<std::uint64_t> cgroup_limit() {
    std::string v = read_small_file(own_cgroup_dir() / "memory.max");
    while (!v.empty() && (v.back() == '\n' || v.back() == ' ')) v.pop_back();
    std::uint64_t limit = 0;
    const auto r = std::from_chars(v.data(), v.data() + v.size(), limit);
    if (v.empty() || v == "max" || r.ec != std::errc() || r.ptr != v.data() + v.size()) return std::nullopt;
    return limit;
}

// The cgroup v1 memory controller's directory of this process
// (/proc/self/cgroup's "N:memory:" line), where the v2 unified hierarchy sets
// no limit; empty without one.
fs::path v1_memory_cgroup_dir() {
    const std::string text = read_small_file("/proc/self/cgroup");
    for (std::size_t at = 0; at < text.size();) {
        const std::size_t end = std::min(text.find('\n', at), text.size());
        const std::string_view line = std::string_view(text).substr(at, end - at);
        const std::size_t colon = line.find(':');
        if (colon != std::string_view::npos && line.substr(colon).starts_with(":memory:/"))
            return fs::path("/sys/fs/cgroup/memory") / line.substr(colon + 9);
        at = end + 1;
    }
    return {};
}

// A cgroup v1 memory limit: memory.stat's hierarchical_memory_limit (the
// smallest limit of the cgroup and its parents; v1 writes "unlimited" as a
// number near 2^63), and the anonymous memory charged to it (total_rss).
void read_v1_limit(MemoryReading& m) {
    const fs::path dir = v1_memory_cgroup_dir();
    if (dir.empty()) return;
    const std::string stat = read_small_file(dir / "memory.stat");
    const auto limit = field_value(stat, "hierarchical_memory_limit");
    if (!limit || *limit >= (std::uint64_t{1} << 62)) return;
    m.cgroup_limit = *limit;
    m.cgroup_anon = field_value(stat, "total_rss").value_or(0);
}

} // namespace

bool MemoryInfo::sources_disagree() const {
    if (!hwloc_total || total == 0) return false;
    const double a = double(total), b = double(*hwloc_total);
    return std::fabs(a - b) / std::max(a, b) > 0.05;
}

std::filesystem::path own_cgroup_dir() {
    const std::string text = read_small_file("/proc/self/cgroup");
    for (std::size_t at = 0; at < text.size();) {
        const std::size_t end = std::min(text.find('\n', at), text.size());
        if (text.compare(at, 4, "0::/") == 0) return fs::path("/sys/fs/cgroup") / text.substr(at + 4, end - at - 4);
        at = end + 1;
    }
    return "/sys/fs/cgroup";
}

MemoryReading read_host_memory() {
    MemoryReading m;
    const std::string meminfo = read_small_file("/proc/meminfo");
    m.total = field_value(meminfo, "MemTotal:").value_or(0) * 1024;
    m.available = field_value(meminfo, "MemAvailable:").value_or(0) * 1024;
    m.cgroup_limit = cgroup_limit();
    if (m.cgroup_limit)
        m.cgroup_anon = field_value(read_small_file(own_cgroup_dir() / "memory.stat"), "anon").value_or(0);
    else
        read_v1_limit(m);
    return m;
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
    const MemoryReading m = read_host_memory();
    s.memory.total = m.total;
    s.memory.available = m.available;
    s.cgroup_memory_limit = m.cgroup_limit;

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
