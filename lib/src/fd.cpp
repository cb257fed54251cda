#include "dstk/fd.hpp"

#include <cerrno>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include "dstk/error.hpp"
#include "dstk/units.hpp"

namespace dstk {
namespace {

// What a file of this mode is, for messages ("a FIFO (named pipe)").
const char* file_kind(unsigned mode) {
    if (S_ISFIFO(mode)) return "a FIFO";
    if (S_ISCHR(mode)) return "a character device";
    if (S_ISBLK(mode)) return "a block device";
    if (S_ISSOCK(mode)) return "a socket";
    if (S_ISDIR(mode)) return "a directory";
    if (S_ISLNK(mode)) return "a symbolic link";
    return "not a regular file";
}

} // namespace

void UniqueFd::reset(int fd) {
    if (fd_ >= 0) ::close(fd_);
    fd_ = fd;
}

UniqueFd UniqueFd::try_open(const std::filesystem::path& path, int flags, int mode) {
    return UniqueFd(::open(path.c_str(), flags | O_CLOEXEC, mode));
}

UniqueFd UniqueFd::open(const std::filesystem::path& path, int flags, const std::string& what, int mode) {
    UniqueFd fd = try_open(path, flags, mode);
    if (!fd) throw_errno(what, path.string());
    return fd;
}

void require_regular_file(unsigned st_mode, const std::filesystem::path& path, const std::string& what) {
    if (S_ISREG(st_mode)) return;
    const std::string kind = file_kind(st_mode);
    throw runtime_error("cannot read " + what + " '" + path.string() + "' (it is " + kind +
                        ", not a regular file: dstk reads its inputs at known offsets and sizes, and a pipe or "
                        "device could block it forever); give a regular file" +
                        (S_ISFIFO(st_mode) ? " (data from a pipe goes to stdin, '-', where the tool reads it)" : ""));
}

UniqueFd try_open_input_file(const std::filesystem::path& path, const std::string& what, int extra_flags) {
    UniqueFd fd = UniqueFd::try_open(path, O_RDONLY | O_NONBLOCK | extra_flags);
    if (!fd) return fd;
    struct stat st {};
    if (::fstat(fd.get(), &st) != 0) throw_errno("cannot stat " + what, path.string());
    require_regular_file(st.st_mode, path, what);
    const int flags = ::fcntl(fd.get(), F_GETFL);
    if (flags < 0 || ::fcntl(fd.get(), F_SETFL, flags & ~O_NONBLOCK) != 0)
        throw_errno("cannot set blocking reads on " + what, path.string());
    return fd;
}

UniqueFd open_input_file(const std::filesystem::path& path, const std::string& what, int extra_flags) {
    UniqueFd fd = try_open_input_file(path, what, extra_flags);
    if (!fd) throw_errno("cannot open " + what, path.string());
    return fd;
}

std::string read_input_file(const std::filesystem::path& path, const std::string& what, std::uint64_t max_bytes,
                            int extra_flags) {
    const UniqueFd fd = open_input_file(path, what, extra_flags);
    std::string text;
    char buf[1 << 16];
    for (;;) {
        const ssize_t n = ::read(fd.get(), buf, sizeof buf);
        if (n < 0 && errno == EINTR) continue;
        if (n < 0) throw_errno("cannot read " + what, path.string());
        if (n == 0) return text;
        if (text.size() + static_cast<std::size_t>(n) > max_bytes)
            throw runtime_error(what + " '" + path.string() + "' is larger than " + format_bytes(max_bytes) +
                                " (corrupt, or not the file meant?)");
        text.append(buf, static_cast<std::size_t>(n));
    }
}

void ensure_standard_fds() {
    for (int fd = 0; fd <= 2; ++fd) {
        if (::fcntl(fd, F_GETFD) != -1 || errno != EBADF) continue;
        // The lowest free number is `fd` itself: the ones below it are open by now.
        const int got = ::open("/dev/null", fd == 0 ? O_RDONLY : O_WRONLY);
        if (got >= 0 && got != fd) {
            ::dup2(got, fd);
            ::close(got);
        }
    }
}

} // namespace dstk
