#pragma once
// Environment switches (DSTK_*: man pages, ENVIRONMENT), read one way
// everywhere: unset and empty mean the same, the default; "0" turns a path
// off; anything else is the switch's value.
#include <cstdlib>
#include <optional>
#include <string_view>

namespace dstk {

// The variable's value, empty where it is unset.
inline std::string_view env_value(const char* name) {
    const char* e = std::getenv(name);
    return e ? std::string_view(e) : std::string_view();
}

// Whether the variable is set to "0" (the path it names is off).
inline bool env_off(const char* name) {
    return env_value(name) == "0";
}

// On (any value but "0") or off ("0") where the variable is set; nullopt
// where it is unset or empty (the caller's default).
inline std::optional<bool> env_flag(const char* name) {
    const std::string_view v = env_value(name);
    if (v.empty()) return std::nullopt;
    return v != "0";
}

// The variable as a decimal integer (strtol's reading: leading digits, 0
// for none), or fallback where it is unset or empty.
inline long env_long(const char* name, long fallback) {
    const char* e = std::getenv(name);
    return e && *e ? std::strtol(e, nullptr, 10) : fallback;
}

} // namespace dstk
