#include "dstk/fd.hpp"

#include <fcntl.h>
#include <unistd.h>

#include "dstk/error.hpp"

namespace dstk {

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

} // namespace dstk
