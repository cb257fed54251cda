#include "dstk/bench/page_cache.hpp"

#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <map>
#include <mutex>
#include <vector>

#include "dstk/error.hpp"
#include "dstk/sysinfo.hpp"

namespace dstk::bench {
namespace {

struct Fd {
    int fd;
    explicit Fd(const std::filesystem::path& p) : fd(::open(p.c_str(), O_RDONLY | O_CLOEXEC)) {
        if (fd < 0) throw_errno("cannot open", p.string());
    }
    ~Fd() { ::close(fd); }
};

} // namespace

bool can_drop_caches() {
    return ::access("/proc/sys/vm/drop_caches", W_OK) == 0;
}

std::string drop_file_cache(const std::filesystem::path& file, bool drop_caches) {
    Fd f(file);
    // Dirty pages cannot be dropped: write them back first.
    ::fdatasync(f.fd);
    if (int err = ::posix_fadvise(f.fd, 0, 0, POSIX_FADV_DONTNEED); err != 0)
        throw runtime_error(errno_message("cannot drop the cached pages of", file.string(), err));
    if (!drop_caches) return "posix_fadvise";
    ::sync();
    FILE* p = std::fopen("/proc/sys/vm/drop_caches", "w");
    if (!p || std::fputs("1\n", p) < 0 || std::fclose(p) != 0)
        throw runtime_error(
            "cannot write /proc/sys/vm/drop_caches (--drop-caches needs root and a writable /proc/sys); "
            "leave --drop-caches out to drop only the file's pages");
    return "drop_caches";
}

double resident_fraction(const std::filesystem::path& file, std::uint64_t offset, std::uint64_t bytes) {
    if (bytes == 0) return 0;
    const std::uint64_t page = static_cast<std::uint64_t>(::sysconf(_SC_PAGESIZE));
    const std::uint64_t start = offset / page * page;
    const std::uint64_t len = offset + bytes - start;
    Fd f(file);
    void* map = ::mmap(nullptr, len, PROT_READ, MAP_SHARED, f.fd, static_cast<off_t>(start));
    if (map == MAP_FAILED) throw_errno("cannot map", file.string());
    std::vector<unsigned char> vec((len + page - 1) / page);
    const int rc = ::mincore(map, len, vec.data());
    const int err = errno;
    ::munmap(map, len);
    if (rc != 0) throw runtime_error(errno_message("cannot query the page cache (mincore) of", file.string(), err));
    const auto resident = std::count_if(vec.begin(), vec.end(), [](unsigned char v) { return v & 1; });
    return double(resident) / double(vec.size());
}

std::optional<std::string> cold_cache_unsupported(const std::filesystem::path& file, bool drop_caches) {
    static std::mutex mutex;
    static std::map<std::filesystem::path, std::optional<std::string>> known;
    std::lock_guard lock(mutex);
    if (auto it = known.find(file); it != known.end()) return it->second;
    const std::uint64_t size = std::filesystem::file_size(file);
    const std::uint64_t probe = std::min<std::uint64_t>(size, 16ull << 20);
    std::optional<std::string> why;
    if (probe > 0) {
        {
            Fd f(file);
            std::vector<char> buf(1 << 20);
            for (std::uint64_t off = 0; off < probe; off += buf.size())
                if (::pread(f.fd, buf.data(), std::min<std::uint64_t>(buf.size(), probe - off), off) < 0)
                    throw_errno("cannot read", file.string());
        }
        drop_file_cache(file, drop_caches);
        const double left = resident_fraction(file, 0, probe);
        if (left > 0.5) {
            const DiskInfo disk = disk_info(file);
            char pct[16];
            std::snprintf(pct, sizeof pct, "%.0f%%", 100 * left);
            why = "cannot make reads cold on " +
                  (disk.filesystem.empty() ? std::string("this filesystem") : "a " + disk.filesystem + " filesystem") +
                  " (" + pct + " of the file stays in memory after posix_fadvise(DONTNEED)); put the file on a disk";
        }
    }
    known.emplace(file, why);
    return why;
}

} // namespace dstk::bench
