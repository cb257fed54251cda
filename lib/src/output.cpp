#include "dstk/output.hpp"

#include <cstdio>
#include <sys/resource.h>
#include <unistd.h>

#include "dstk/units.hpp"

namespace dstk {

void note(const OutputOptions& out, const std::string& line) {
    if (!out.quiet) std::fprintf(stderr, "%s\n", line.c_str());
}

void warning(const std::string& line) {
    std::fprintf(stderr, "warning: %s\n", line.c_str());
}

Progress::Progress(std::string label, std::uint64_t total_items, std::uint64_t total_bytes, const OutputOptions& out,
                   std::string item_name)
    : label_(std::move(label)), item_name_(std::move(item_name)), total_items_(total_items), total_bytes_(total_bytes),
      start_(std::chrono::steady_clock::now()), last_draw_(start_),
      enabled_(!out.quiet && (out.progress || ::isatty(STDERR_FILENO))), forced_(out.progress) {}

Progress::~Progress() {
    finish();
}

void Progress::add(std::uint64_t items, std::uint64_t bytes) {
    items_ += items;
    bytes_ += bytes;
    if (enabled_) draw(false);
}

void Progress::set_detail(std::string detail) {
    std::lock_guard lock(draw_mutex_);
    detail_ = std::move(detail);
}

void Progress::draw(bool force) {
    std::unique_lock lock(draw_mutex_, std::try_to_lock);
    if (!lock.owns_lock()) return;
    const auto now = std::chrono::steady_clock::now();
    if (!force && now - last_draw_ < std::chrono::milliseconds(166)) return;
    last_draw_ = now;
    const double secs = std::chrono::duration<double>(now - start_).count();
    const std::uint64_t items = items_, bytes = bytes_;
    const double frac = total_items_ ? double(items) / double(total_items_)
                                     : (total_bytes_ ? double(bytes) / double(total_bytes_) : 0.0);
    const std::string rate = format_rate(secs > 0 ? bytes / secs : 0);
    if (!total_items_ && !total_bytes_) { // a stream of unknown length (stdin): what arrived, and how fast
        std::fprintf(stderr, "\r%s: %s %s  %s  %s   ", label_.c_str(), format_count(items).c_str(), item_name_.c_str(),
                     format_bytes(bytes).c_str(), rate.c_str());
    } else {
        std::string eta = "--";
        if (frac > 0.001 && secs > 0.5) eta = format_duration(secs * (1 - frac) / frac);
        // Work counted in items alone (training steps) shows no byte counts.
        const std::string volume = total_bytes_ || bytes ? "  " + format_bytes(bytes) + "  " + rate : std::string();
        std::fprintf(stderr, "\r%s: %5.1f%%  %s/%s %s%s  ETA %s%s%s   ", label_.c_str(), 100 * frac,
                     format_count(items).c_str(), format_count(total_items_).c_str(), item_name_.c_str(),
                     volume.c_str(), eta.c_str(), detail_.empty() ? "" : "  ", detail_.c_str());
    }
    std::fflush(stderr);
    drawn_ = true;
}

void Progress::finish() {
    if (!enabled_ || finished_) return;
    if (forced_) {
        draw(true);
        std::lock_guard lock(draw_mutex_);
        std::fputc('\n', stderr);
        finished_ = true;
        return;
    }
    std::lock_guard lock(draw_mutex_);
    finished_ = true;
    if (drawn_) {
        std::fprintf(stderr, "\r\033[K");
        std::fflush(stderr);
        drawn_ = false;
    }
}

std::uint64_t peak_rss_bytes() {
    rusage ru{};
    getrusage(RUSAGE_SELF, &ru);
    return static_cast<std::uint64_t>(ru.ru_maxrss) * 1024;
}

} // namespace dstk
