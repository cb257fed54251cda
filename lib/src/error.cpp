#include "dstk/error.hpp"

#include <cerrno>
#include <cstring>

namespace dstk {

std::string errno_message(const std::string& what, const std::string& path, int err) {
    return what + " '" + path + "' (" + std::strerror(err) + ")";
}

void throw_errno(const std::string& what, const std::string& path) {
    const int err = errno;
    const ExitCode code = (err == ENOSPC || err == EDQUOT) ? ExitCode::no_fit : ExitCode::failure;
    std::string msg = errno_message(what, path, err);
    if (err == ENOSPC || err == EDQUOT) msg += "; free some space or write elsewhere";
    throw Error(code, msg);
}

} // namespace dstk
