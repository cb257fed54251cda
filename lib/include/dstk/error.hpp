#pragma once
// One error type for the whole toolkit. It carries the process exit code, so
// each tool catches it in one place (run_tool in cli.hpp) and exits with it.
#include <stdexcept>
#include <string>

namespace dstk {

// Exit codes shared by every tool (DESIGN.md, documented in each man page).
enum class ExitCode : int {
    ok = 0,
    failure = 1,       // runtime failure: I/O, corrupt input, divergence
    usage = 2,         // bad options or arguments
    no_fit = 3,        // does not fit / resource missing (GPU, disk)
    interrupted = 130, // stopped by a signal, after clean-up: SIGINT exits 130 (128 + 2)
    terminated = 143,  // SIGTERM exits 143 (128 + 15); errors carry `interrupted`, run_tool picks the code
};

class Error : public std::runtime_error {
  public:
    Error(ExitCode code, const std::string& message) : std::runtime_error(message), code_(code) {}
    ExitCode code() const noexcept { return code_; }

  private:
    ExitCode code_;
};

// Messages follow "problem (why) suggestion".
inline Error usage_error(const std::string& m) {
    return Error(ExitCode::usage, m);
}
inline Error runtime_error(const std::string& m) {
    return Error(ExitCode::failure, m);
}
inline Error no_fit_error(const std::string& m) {
    return Error(ExitCode::no_fit, m);
}

// strerror(errno) with the operation and path: "cannot open 'x' (No such file or directory)".
std::string errno_message(const std::string& what, const std::string& path, int err);
[[noreturn]] void throw_errno(const std::string& what, const std::string& path);

} // namespace dstk
