#include "direct_io.hpp"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <new>

#include "dstk/error.hpp"

namespace dstk {

AlignedBuffer aligned_buffer(std::uint64_t bytes) {
    AlignedBuffer b(static_cast<std::uint8_t*>(std::aligned_alloc(direct_align, bytes)));
    if (!b) throw std::bad_alloc();
    return b;
}

UniqueFd open_direct(const std::filesystem::path& path, const std::string& where, int* refused) {
    UniqueFd fd = try_open_input_file(path, where, O_DIRECT);
    int err = fd ? 0 : errno;
    if (fd) {
        AlignedBuffer probe = aligned_buffer(direct_align);
        if (::pread(fd.get(), probe.get(), direct_align, 0) < 0) err = errno;
    }
    if (err == 0) return fd;
    if (err != EINVAL && err != EOPNOTSUPP) throw_errno("cannot open with O_DIRECT", where);
    *refused = err;
    return {};
}

int pread_direct(int fd, std::uint8_t* buf, std::uint64_t start, std::uint64_t len, std::uint64_t need,
                 const std::string& where) {
    std::uint64_t got = 0;
    while (got < need) {
        const ssize_t r = ::pread(fd, buf + got, len - got, static_cast<off_t>(start + got));
        if (r < 0 && errno == EINTR) continue;
        if (r < 0 && (errno == EINVAL || errno == EOPNOTSUPP)) return errno;
        if (r < 0) throw_errno("cannot read (O_DIRECT)", where);
        if (r == 0) break;
        got += static_cast<std::uint64_t>(r);
        if (got % direct_align != 0) break; // end of file: a short tail
    }
    if (got < need)
        throw runtime_error("cannot read " + where + ": it ends at byte " + std::to_string(start + got) +
                            ", before byte " + std::to_string(start + need) +
                            " (the file shrank while reading?) re-create or restore the dataset");
    return 0;
}

} // namespace dstk
