#pragma once
// What every tool's main shares: common options, and one place where errors
// become messages and exit codes.
#include <functional>
#include <limits>
#include <string>

#include "dstk/cli_fwd.hpp"
#include "dstk/output.hpp"

namespace dstk {

// --quiet, --progress, --json (when with_json), --version.
void add_output_options(CLI::App& app, OutputOptions& out, bool with_json = true);

// A numeric option's valid range, checked at parse time: finite and within
// [lo, hi] (an open end excludes the bound; +-infinity leaves that side
// free). Its failure is a usage error (exit 2) naming the option and range;
// the man pages state the same ranges.
CLI::Validator number_in(double lo, double hi, bool lo_open = false, bool hi_open = false);
inline constexpr double unbounded = std::numeric_limits<double>::infinity();
// The weight of a mix member (dstrain and dsplan --weights): a positive
// finite number, the rule the mix itself applies (data/mix.hpp).
CLI::Validator mix_weight();

// Parses argv into `app`, then runs body(). Prints "tool: error: message" for
// an Error and returns its exit code; CLI11 parse errors exit 2, --help 0.
// First opens /dev/null on file descriptors 0-2 where they are closed
// (ensure_standard_fds); refuses arguments that are not UTF-8 (exit 2);
// installs the SIGINT/SIGTERM handlers. An unknown option is named with the
// nearest known one ("did you mean '--train'?").
int run_tool(CLI::App& app, int argc, char** argv, const std::function<void()>& body);

// The command line as typed, shell-quoted where needed (for provenance).
std::string command_line(int argc, char** argv);

} // namespace dstk
