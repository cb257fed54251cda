#include "dstk/cli.hpp"

#include <cstdio>

#include "dstk/error.hpp"
#include "dstk/signals.hpp"

namespace dstk {

void add_output_options(CLI::App& app, OutputOptions& out, bool with_json) {
    app.add_flag("-q,--quiet", out.quiet, "Print only errors and results (no notes, no progress)");
    app.add_flag("--progress", out.progress, "Show progress on stderr even when it is not a terminal");
    if (with_json) app.add_flag("--json", out.json, "Print one JSON document on stdout instead of the text output");
    app.set_version_flag("-V,--version", std::string(app.get_name()) + " (dstk) " DSTK_VERSION);
}

int run_tool(CLI::App& app, int argc, char** argv, const std::function<void()>& body) {
    const std::string name = app.get_name();
    try {
        app.parse(argc, argv);
    } catch (const CLI::CallForHelp& e) {
        return app.exit(e);
    } catch (const CLI::CallForAllHelp& e) {
        return app.exit(e);
    } catch (const CLI::CallForVersion& e) {
        return app.exit(e);
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
        std::fprintf(stderr, "%s: %s%s\n", name.c_str(), e.code() == ExitCode::interrupted ? "" : "error: ", e.what());
        return static_cast<int>(e.code());
    } catch (const std::bad_alloc&) {
        std::fprintf(stderr, "%s: error: out of memory\n", name.c_str());
        return static_cast<int>(ExitCode::failure);
    } catch (const std::exception& e) {
        std::fprintf(stderr, "%s: error: %s\n", name.c_str(), e.what());
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
