#include "dstk/cli.hpp"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <limits>
#include <system_error>
#include <vector>

#include <CLI/CLI.hpp>

#include "dstk/data/mix.hpp"
#include "dstk/error.hpp"
#include "dstk/fd.hpp"
#include "dstk/json.hpp"
#include "dstk/signals.hpp"

namespace dstk {
namespace {

// Levenshtein distance, with a swap of two neighbours counting as one edit
// ("--trian" is one edit from "--train").
std::size_t edit_distance(std::string_view a, std::string_view b) {
    std::vector<std::vector<std::size_t>> d(a.size() + 1, std::vector<std::size_t>(b.size() + 1));
    for (std::size_t i = 0; i <= a.size(); ++i) d[i][0] = i;
    for (std::size_t j = 0; j <= b.size(); ++j) d[0][j] = j;
    for (std::size_t i = 1; i <= a.size(); ++i)
        for (std::size_t j = 1; j <= b.size(); ++j) {
            d[i][j] = std::min({d[i - 1][j] + 1, d[i][j - 1] + 1, d[i - 1][j - 1] + (a[i - 1] == b[j - 1] ? 0 : 1)});
            if (i > 1 && j > 1 && a[i - 1] == b[j - 2] && a[i - 2] == b[j - 1])
                d[i][j] = std::min(d[i][j], d[i - 2][j - 2] + 1);
        }
    return d[a.size()][b.size()];
}

// Every option name of the tool with the command it belongs to ("dstrain",
// "dstrain eval"), so a valid option typed under the wrong subcommand is named as such.
void collect_option_names(const CLI::App& app, const std::string& owner,
                          std::vector<std::pair<std::string, std::string>>& names) {
    for (const CLI::Option* o : app.get_options()) {
        for (const std::string& l : o->get_lnames()) names.emplace_back("--" + l, owner);
        for (const std::string& s : o->get_snames()) names.emplace_back("-" + s, owner);
    }
    for (const CLI::App* sub : app.get_subcommands({}))
        collect_option_names(*sub, owner + " " + sub->get_name(), names);
}

// What an unexpected argument that is no option may have meant: a dataset,
// where the tool names its dataset by option (dsplan); a subcommand's
// argument, where the tool takes none of its own before one (dsbench).
std::string positional_hint(const CLI::App& app, const std::string& arg) {
    std::error_code ec;
    if (app.get_option_no_throw("--dataset") && std::filesystem::is_directory(arg, ec))
        return " (name a dataset with --dataset " + arg + ")";
    const auto subs = app.get_subcommands([](const CLI::App*) { return true; });
    const auto positionals = app.get_options([](const CLI::Option* o) { return o->get_positional(); });
    if (subs.empty() || !positionals.empty()) return "";
    std::string names;
    for (const CLI::App* sub : subs) names += (names.empty() ? "" : ", ") + sub->get_name();
    return " (" + app.get_name() + " takes a subcommand first: " + names + ")";
}

// "unknown option '--trian' (did you mean '--train'?)" for each argument
// CLI11 did not expect that looks like an option, "unexpected argument 'd'"
// for one that does not (unless it follows such an option: its value);
// CLI11's own message where there is neither.
std::string unexpected_arguments_message(const CLI::App& app, const CLI::ParseError& e) {
    std::vector<std::pair<std::string, std::string>> names;
    collect_option_names(app, app.get_name(), names);
    std::string message;
    bool option_value = false; // the argument before was an unexpected option without "="
    for (const std::string& arg : app.remaining(true)) {
        const bool value = option_value;
        option_value = arg.size() > 1 && arg[0] == '-' && arg.find('=') == std::string::npos;
        if (arg.empty() || arg[0] != '-') {
            if (value) continue;
            if (!message.empty()) message += "; ";
            message += "unexpected argument '" + arg + "'";
            message += positional_hint(app, arg);
            continue;
        }
        if (arg.size() < 2) continue;
        const std::string typed = arg.substr(0, arg.find('='));
        std::string best, owner;
        std::size_t best_distance = std::numeric_limits<std::size_t>::max();
        for (const auto& [n, o] : names) {
            const std::size_t dist = edit_distance(typed, n);
            if (dist < best_distance) best_distance = dist, best = n, owner = o;
        }
        if (!message.empty()) message += "; ";
        if (best_distance == 0) { // a real option, of another command
            message += "option '" + typed + "' does not apply here (it is an option of '" + owner + "')";
            continue;
        }
        message += "unknown option '" + typed + "'";
        // Close enough to be a typo: at most a third of the name wrong (and at least 2 edits allowed).
        if (!best.empty() && best_distance <= std::max<std::size_t>(2, typed.size() / 3))
            message += " (did you mean '" + best + "'?)";
    }
    return message.empty() ? e.what() : message;
}

// Paths and the command line go into JSON files (manifests, reports, logs,
// checkpoints), which hold UTF-8 text only: an argument that is not UTF-8 is
// refused before any work rather than failing at the last write.
void check_utf8_arguments(int argc, char** argv) {
    for (int i = 1; i < argc; ++i)
        if (!is_utf8(argv[i]))
            throw usage_error("argument '" + escape_bytes(argv[i]) +
                              "' is not valid UTF-8 (dstk writes paths and command lines into JSON files, which "
                              "hold UTF-8 text only); use a UTF-8 name: rename an existing file (e.g. with convmv) "
                              "or reach it through a symbolic link that has one");
}

// std::thread and std::async say only "Resource temporarily unavailable"
// where the system refuses a thread: what it means, and what to do.
const char* thread_refused_hint(const std::exception& e) {
    const auto* s = dynamic_cast<const std::system_error*>(&e);
    if (!s || s->code() != std::errc::resource_unavailable_try_again) return "";
    return " (cannot start a thread: the system refuses more threads, a pids or thread limit); lower --threads, or "
           "end other processes";
}

} // namespace

CLI::Validator number_in(double lo, double hi, bool lo_open, bool hi_open) {
    const std::string lo_text = std::isinf(lo) ? "-inf" : CLI::detail::to_string(lo);
    const std::string hi_text = std::isinf(hi) ? "inf" : CLI::detail::to_string(hi);
    const std::string range = (lo_open ? "(" : "[") + lo_text + ", " + hi_text + (hi_open ? ")" : "]");
    return CLI::Validator(
        [=](std::string& text) -> std::string {
            double v = 0;
            if (!CLI::detail::lexical_cast(text, v)) return "'" + text + "' is not a number";
            const bool inside = std::isfinite(v) && (lo_open ? v > lo : v >= lo) && (hi_open ? v < hi : v <= hi);
            if (!std::isfinite(v)) return text + " is not a finite number";
            if (!inside) return text + " is outside " + range;
            return {};
        },
        "in " + range);
}

CLI::Validator mix_weight() {
    return CLI::Validator(
        [](std::string& text) -> std::string {
            double v = 0;
            if (CLI::detail::lexical_cast(text, v) && data::valid_mix_weight(v)) return {};
            return "'" + text + "' is not a weight (weights must be positive finite numbers, e.g. 2,1,1)";
        },
        "POSITIVE");
}

void add_output_options(CLI::App& app, OutputOptions& out, bool with_json) {
    app.add_flag("-q,--quiet", out.quiet,
                 "Silence notes and progress on stderr (errors and warnings still print; results on stdout stay)");
    app.add_flag("--progress", out.progress, "Show progress on stderr even when it is not a terminal");
    if (with_json) app.add_flag("--json", out.json, "Print one JSON document on stdout instead of the text output");
    app.set_version_flag("-V,--version", std::string(app.get_name()) + " (dstk) " DSTK_VERSION);
}

int run_tool(CLI::App& app, int argc, char** argv, const std::function<void()>& body) {
    ensure_standard_fds();
    const std::string name = app.get_name();
    try {
        app.parse(argc, argv);
        check_utf8_arguments(argc, argv);
    } catch (const CLI::CallForHelp& e) {
        return app.exit(e);
    } catch (const CLI::CallForAllHelp& e) {
        return app.exit(e);
    } catch (const CLI::CallForVersion& e) {
        return app.exit(e);
    } catch (const CLI::ExtrasError& e) {
        std::fprintf(stderr, "%s: error: %s\nRun '%s --help' for the options.\n", name.c_str(),
                     unexpected_arguments_message(app, e).c_str(), name.c_str());
        return static_cast<int>(ExitCode::usage);
    } catch (const CLI::ParseError& e) {
        std::fprintf(stderr, "%s: error: %s\nRun '%s --help' for the options.\n", name.c_str(), e.what(), name.c_str());
        return static_cast<int>(ExitCode::usage);
    } catch (const Error& e) { // a validator threw one of ours
        std::fprintf(stderr, "%s: error: %s\n", name.c_str(), e.what());
        return static_cast<int>(e.code());
    }
    install_interrupt_handlers();
    try {
        body();
        return static_cast<int>(ExitCode::ok);
    } catch (const Error& e) {
        std::fflush(stdout);
        const bool signal = e.code() == ExitCode::interrupted;
        std::fprintf(stderr, "%s: %s%s\n", name.c_str(), signal ? "" : "error: ", e.what());
        return static_cast<int>(signal ? interrupt_exit_code() : e.code());
    } catch (const std::bad_alloc&) {
        std::fprintf(stderr, "%s: error: out of memory\n", name.c_str());
        return static_cast<int>(ExitCode::failure);
    } catch (const std::exception& e) {
        std::fprintf(stderr, "%s: error: %s%s\n", name.c_str(), e.what(), thread_refused_hint(e));
        return static_cast<int>(ExitCode::failure);
    }
}

std::string command_line(int argc, char** argv) {
    std::string s;
    for (int i = 0; i < argc; ++i) {
        std::string a = argv[i];
        const bool plain = !a.empty() && a.find_first_not_of("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ"
                                                             "0123456789-_./=:,+@%") == std::string::npos;
        if (!plain) {
            std::string q = "'";
            for (char c : a) q += c == '\'' ? std::string("'\\''") : std::string(1, c);
            a = q + "'";
        }
        s += (i ? " " : "") + a;
    }
    return s;
}

} // namespace dstk
