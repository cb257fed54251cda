#pragma once
// What a tool prints and where: data and results to stdout, diagnostics and
// progress to stderr. Progress only on a TTY (or with --progress), at most
// ~6 updates a second. The rule of -q in every tool: it silences notes
// (including the summary of what was written) and progress on stderr, never
// errors or warnings, and never stdout, which holds results (reports, tables,
// epoch lines, --json). The one exception is dsplan --check -q, where the exit
// status is the result (as grep -q).
#include <atomic>
#include <chrono>
#include <cstdint>
#include <mutex>
#include <string>

namespace dstk {

struct OutputOptions {
    bool quiet = false;
    bool progress = false; // force progress even when stderr is not a TTY
    bool json = false;     // one machine-readable document on stdout
};

void note(const OutputOptions& out, const std::string& line); // stderr unless --quiet
void warning(const std::string& line);                        // stderr, "warning: ..."

// Progress over a known amount of work. Thread-safe: add() from any thread.
class Progress {
  public:
    Progress(std::string label, std::uint64_t total_items, std::uint64_t total_bytes, const OutputOptions& out,
             std::string item_name = "samples");
    ~Progress();
    Progress(const Progress&) = delete;
    Progress& operator=(const Progress&) = delete;

    void add(std::uint64_t items, std::uint64_t bytes);
    // Text shown after the counts from the next redraw on ("12,345 samples/s").
    void set_detail(std::string detail);
    // Ends the display: erases the line on a terminal; with --progress, draws
    // the final state and ends the line so logs keep it.
    void finish();

    bool enabled() const { return enabled_; }

  private:
    void draw(bool force);

    std::string label_, item_name_, detail_;
    std::uint64_t total_items_, total_bytes_;
    std::atomic<std::uint64_t> items_{0}, bytes_{0};
    std::chrono::steady_clock::time_point start_, last_draw_;
    std::mutex draw_mutex_;
    bool enabled_;
    bool forced_; // --progress: the last state stays on stderr (logs keep it)
    bool drawn_ = false, finished_ = false;
};

// Peak resident set size of this process, in bytes (getrusage).
std::uint64_t peak_rss_bytes();

} // namespace dstk
