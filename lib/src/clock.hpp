#pragma once
// The data path's stage timing: a monotonic clock and seconds since a point.
#include <chrono>

namespace dstk::data {

using Clock = std::chrono::steady_clock;

inline double seconds_since(Clock::time_point t) {
    return std::chrono::duration<double>(Clock::now() - t).count();
}

} // namespace dstk::data
