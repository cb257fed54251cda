// What a call throws, for tests of error paths: the library's exit code or
// message (ExitCode::ok / "" when it returns).
#pragma once

#include <functional>
#include <string>

#include "dstk/error.hpp"

namespace dstk::test_support {

inline ExitCode code_of(const std::function<void()>& f) {
    try {
        f();
    } catch (const Error& e) {
        return e.code();
    }
    return ExitCode::ok;
}

inline std::string error_of(const std::function<void()>& f) {
    try {
        f();
    } catch (const Error& e) {
        return e.what();
    }
    return "";
}

} // namespace dstk::test_support
