#include "dstk/atomic_output.hpp"

#include <atomic>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <csignal>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include "dstk/fd.hpp"
#include "dstk/error.hpp"
#include "dstk/manifest.hpp"
#include "dstk/output.hpp"
#include "dstk/signals.hpp"
#include "dstk/sysinfo.hpp"
#include "dstk/units.hpp"

namespace fs = std::filesystem;

namespace dstk {
namespace {

std::atomic<int> g_tmp_counter{0};

fs::path temp_sibling(const fs::path& final_path) {
    fs::path parent = final_path.parent_path();
    if (parent.empty()) parent = ".";
    std::string name = ".";
    name += final_path.filename().string();
    name += ".tmp-" + std::to_string(::getpid()) + "-" + std::to_string(g_tmp_counter++);
    return parent / name;
}

fs::path parent_or_dot(const fs::path& p) {
    fs::path parent = p.parent_path();
    return parent.empty() ? fs::path(".") : parent;
}

void remove_quietly(const fs::path& p) {
    std::error_code ec;
    fs::remove_all(p, ec);
}

// The PID in a staging name ".NAME.tmp-PID-N" of `final_path`, 0 when `name` is not one.
pid_t staging_pid(const std::string& name, const fs::path& final_path) {
    std::string prefix = ".";
    prefix += final_path.filename().string();
    prefix += ".tmp-";
    if (name.size() <= prefix.size() || name.compare(0, prefix.size(), prefix) != 0) return 0;
    const std::string rest = name.substr(prefix.size());
    const auto dash = rest.find('-');
    if (dash == 0 || dash == std::string::npos || dash + 1 == rest.size()) return 0;
    if (rest.find_first_not_of("0123456789-") != std::string::npos || rest.find('-', dash + 1) != std::string::npos)
        return 0;
    const long long pid = std::atoll(rest.substr(0, dash).c_str());
    return pid > 0 && pid < (1ll << 31) ? static_cast<pid_t>(pid) : 0;
}

// A run killed with SIGKILL (or a crash) cannot clean up after itself: the next
// output to the same name removes what such runs staged. Only names of our
// pattern whose process is gone are touched; a live writer keeps its own.
void remove_stale_staging(const fs::path& final_path) {
    std::error_code ec;
    for (const auto& e : fs::directory_iterator(parent_or_dot(final_path), ec)) {
        const pid_t pid = staging_pid(e.path().filename().string(), final_path);
        if (pid == 0 || pid == ::getpid() || ::kill(pid, 0) == 0 || errno != ESRCH) continue;
        const auto st = e.symlink_status(ec);
        if (ec || (!fs::is_directory(st) && !fs::is_regular_file(st))) continue;
        remove_quietly(e.path());
        warning("removed '" + e.path().string() + "', staged by process " + std::to_string(pid) +
                " which no longer runs (an interrupted earlier run)");
    }
}

} // namespace

void fsync_path(const fs::path& p) {
    const UniqueFd fd = UniqueFd::open(p, O_RDONLY, "open for fsync");
    if (::fsync(fd.get()) != 0 && errno != EINVAL && errno != EROFS) throw_errno("cannot fsync", p.string());
}

void write_all(int fd, const void* data, std::size_t len, long long offset, const fs::path& path) {
    auto p = static_cast<const char*>(data);
    while (len > 0) {
        const ssize_t n = offset < 0 ? ::write(fd, p, len) : ::pwrite(fd, p, len, offset);
        if (n < 0) {
            if (errno == EINTR) {
                throw_if_interrupted();
                continue;
            }
            throw_errno("cannot write", path.string());
        }
        p += n;
        len -= static_cast<std::size_t>(n);
        if (offset >= 0) offset += n;
    }
}

void read_all(int fd, void* data, std::size_t len, long long offset, const fs::path& path) {
    auto p = static_cast<char*>(data);
    while (len > 0) {
        const ssize_t n = offset < 0 ? ::read(fd, p, len) : ::pread(fd, p, len, offset);
        if (n < 0) {
            if (errno == EINTR) {
                throw_if_interrupted();
                continue;
            }
            throw_errno("cannot read", path.string());
        }
        if (n == 0)
            throw runtime_error("unexpected end of file in '" + path.string() + "' (" + std::to_string(len) +
                                " more bytes expected; file truncated?)");
        p += n;
        len -= static_cast<std::size_t>(n);
        if (offset >= 0) offset += n;
    }
}

void check_overwrite(const fs::path& final_path, bool force) {
    std::error_code ec;
    const fs::file_status st = fs::symlink_status(final_path, ec);
    // --force replaces an earlier output, never a link, device or pipe
    // (dsconvert ... /dev/stdout --force as root once replaced the symlink).
    if (fs::exists(st) && !fs::is_regular_file(st) && !fs::is_directory(st))
        throw usage_error("output '" + final_path.string() +
                          "' exists and is not a regular file or directory (a link, device or pipe is never "
                          "replaced, --force or not); choose another name, or - for stdout where the tool takes it");
    if (fs::exists(st) && !force)
        throw usage_error("output '" + final_path.string() +
                          "' already exists (refusing to overwrite it); use --force to replace it, or choose "
                          "another name");
}

void check_free_disk(const fs::path& dir, std::uint64_t bytes) {
    const DiskInfo d = disk_info(dir);
    if (d.free < bytes)
        throw no_fit_error("not enough free disk at '" + dir.string() + "' (need " + format_bytes(bytes) + ", " +
                           format_bytes(d.free) + " free on " + d.mount_point +
                           "); free some space, write elsewhere, or use --force to skip this check");
}

void check_replaceable_dir(const fs::path& dir) {
    std::error_code ec;
    if (!fs::is_directory(fs::symlink_status(dir, ec)) || fs::is_empty(dir, ec) ||
        fs::exists(dir / manifest_file_name, ec))
        return;
    throw usage_error("output '" + dir.string() + "' is a directory but not a dataset (no " +
                      std::string(manifest_file_name) +
                      "); --force replaces only what a dstk tool wrote: remove it yourself, or choose another name");
}

AtomicDir::AtomicDir(fs::path final_path, bool force) : final_(std::move(final_path)), force_(force) {
    while (final_.has_filename() == false && final_.has_parent_path() && final_ != final_.root_path())
        final_ = final_.parent_path(); // "out/" -> "out"
    check_overwrite(final_, force);
    check_replaceable_dir(final_);
    remove_stale_staging(final_);
    tmp_ = temp_sibling(final_);
    register_temp_path(tmp_);
    std::error_code ec;
    if (!fs::create_directory(tmp_, ec)) {
        unregister_temp_path(tmp_);
        throw runtime_error("cannot create directory '" + tmp_.string() + "' (" + ec.message() + "); check that '" +
                            parent_or_dot(final_).string() + "' exists and is writable");
    }
}

AtomicDir::~AtomicDir() {
    if (!committed_) remove_quietly(tmp_);
    unregister_temp_path(tmp_);
}

fs::path AtomicDir::file(const std::string& name) {
    fs::path p = tmp_ / name;
    register_temp_path(p);
    return p;
}

void AtomicDir::commit() {
    for (const auto& entry : fs::directory_iterator(tmp_))
        if (entry.is_regular_file()) fsync_path(entry.path());
    fsync_path(tmp_);
    std::error_code ec;
    if (fs::exists(fs::symlink_status(final_, ec))) {
        check_overwrite(final_, force_);
        // Swap the new directory in atomically where the filesystem allows it.
        if (::renameat2(AT_FDCWD, tmp_.c_str(), AT_FDCWD, final_.c_str(), RENAME_EXCHANGE) == 0) {
            committed_ = true;
            remove_quietly(tmp_); // now holds the old output
        } else {
            const fs::path old = temp_sibling(final_);
            if (::rename(final_.c_str(), old.c_str()) != 0) throw_errno("cannot move aside", final_.string());
            if (::rename(tmp_.c_str(), final_.c_str()) != 0) throw_errno("cannot rename into", final_.string());
            committed_ = true;
            remove_quietly(old);
        }
    } else {
        if (::rename(tmp_.c_str(), final_.c_str()) != 0) throw_errno("cannot rename into", final_.string());
        committed_ = true;
    }
    fsync_path(parent_or_dot(final_));
    for (const auto& entry : fs::directory_iterator(final_)) unregister_temp_path(tmp_ / entry.path().filename());
}

AtomicFile::AtomicFile(fs::path final_path, bool force) : final_(std::move(final_path)) {
    check_overwrite(final_, force);
    remove_stale_staging(final_);
    tmp_ = temp_sibling(final_);
    register_temp_path(tmp_);
    fd_ = UniqueFd::try_open(tmp_, O_WRONLY | O_CREAT | O_EXCL);
    if (!fd_) {
        const int err = errno;
        unregister_temp_path(tmp_);
        errno = err;
        throw_errno("cannot create", tmp_.string());
    }
}

AtomicFile::~AtomicFile() {
    fd_.reset();
    if (!committed_) ::unlink(tmp_.c_str());
    unregister_temp_path(tmp_);
}

void AtomicFile::write(const void* data, std::size_t len) {
    write_all(fd_.get(), data, len, -1, tmp_);
}

void AtomicFile::commit() {
    if (::fsync(fd_.get()) != 0) throw_errno("cannot fsync", tmp_.string());
    if (::close(fd_.release()) != 0) throw_errno("cannot close", tmp_.string());
    if (::rename(tmp_.c_str(), final_.c_str()) != 0) throw_errno("cannot rename into", final_.string());
    committed_ = true;
    fsync_path(parent_or_dot(final_));
}

} // namespace dstk
