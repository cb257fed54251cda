#pragma once
// A file descriptor that closes itself: every ::open in the library goes
// through UniqueFd, so no error path leaks one and no try/catch is needed to
// close it. Inputs are opened with open_input_file: a FIFO or a device named
// where a file is expected is refused at once instead of blocking the tool.
#include <cstdint>
#include <filesystem>
#include <string>
#include <utility>

namespace dstk {

class UniqueFd {
  public:
    UniqueFd() = default;
    explicit UniqueFd(int fd) : fd_(fd) {}
    ~UniqueFd() { reset(); }
    UniqueFd(UniqueFd&& o) noexcept : fd_(std::exchange(o.fd_, -1)) {}
    UniqueFd& operator=(UniqueFd&& o) noexcept {
        if (this != &o) reset(std::exchange(o.fd_, -1));
        return *this;
    }
    UniqueFd(const UniqueFd&) = delete;
    UniqueFd& operator=(const UniqueFd&) = delete;

    int get() const { return fd_; }
    explicit operator bool() const { return fd_ >= 0; }
    int release() { return std::exchange(fd_, -1); }
    void reset(int fd = -1);

    // ::open with O_CLOEXEC added; throws (errno_message: "cannot <what> 'path' (reason)") on failure.
    static UniqueFd open(const std::filesystem::path& path, int flags, const std::string& what, int mode = 0644);
    // ::open with O_CLOEXEC added; an empty UniqueFd on failure, errno kept.
    static UniqueFd try_open(const std::filesystem::path& path, int flags, int mode = 0644);

  private:
    int fd_ = -1;
};

// An input file for reading (`extra_flags`: O_DIRECT, O_NOFOLLOW): opened
// with O_NONBLOCK, so that a FIFO without a writer cannot block the open, then
// checked with fstat to be a regular file, and O_NONBLOCK cleared. Anything
// else (FIFO, device, socket, directory) is a runtime error naming `what`,
// the path and what it is. Pipes are read only as stdin ('-'), never by name.
UniqueFd open_input_file(const std::filesystem::path& path, const std::string& what, int extra_flags = 0);
// The same, but an empty UniqueFd with errno kept when open() itself fails
// (ENOENT, EACCES...), for callers that phrase that error themselves.
UniqueFd try_open_input_file(const std::filesystem::path& path, const std::string& what, int extra_flags = 0);
// The whole of a small input file (a manifest, a results file), opened with
// open_input_file; a runtime error naming `what` when it holds more than
// `max_bytes` (corrupt, or not the file meant).
std::string read_input_file(const std::filesystem::path& path, const std::string& what, std::uint64_t max_bytes,
                            int extra_flags = 0);
// Throws the error open_input_file gives for a file of mode `st_mode` that is
// not a regular file; returns when it is one.
void require_regular_file(unsigned st_mode, const std::filesystem::path& path, const std::string& what);

// File descriptors 0, 1 and 2 opened on /dev/null where they are closed
// (`tool 2>&-`): otherwise the next file the process opens would take the
// number and receive whatever is meant for stdin, stdout or stderr (progress
// text inside an output). Called first by run_tool and by the Python module.
void ensure_standard_fds();

} // namespace dstk
