#pragma once
// A file descriptor that closes itself: every ::open in the library goes
// through UniqueFd, so no error path leaks one and no try/catch is needed to
// close it.
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

} // namespace dstk
