#include "dstk/plot.hpp"

#include <spawn.h>
#include <sys/wait.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <string>

#include "dstk/env.hpp"
#include "dstk/atomic_output.hpp"
#include "dstk/error.hpp"

extern char** environ;

namespace fs = std::filesystem;

namespace dstk {
namespace {

// plot.py beside an installed tool (<prefix>/bin/../share/dstk/plot.py),
// else in the source tree the tools were built from.
fs::path plot_script() {
    std::error_code ec;
    const fs::path exe = fs::read_symlink("/proc/self/exe", ec);
    const fs::path installed = exe.parent_path().parent_path() / DSTK_INSTALL_DATADIR / "dstk" / "plot.py";
    if (!ec && fs::is_regular_file(installed)) return installed;
    const fs::path source = DSTK_PLOT_SCRIPT;
    if (fs::is_regular_file(source)) return source;
    throw no_fit_error("the plotting script plot.py is missing (neither " + installed.string() + " nor " +
                       source.string() + " exists) reinstall dstk, or run the tools from their build tree");
}

std::string python() {
    const std::string_view p = env_value("DSTK_PYTHON");
    return p.empty() ? "python3" : std::string(p);
}

// Runs argv with stdout on `fd`; the exit status.
int run_with_stdout(const std::vector<std::string>& args, int fd) {
    std::vector<char*> argv;
    for (const auto& a : args) argv.push_back(const_cast<char*>(a.c_str()));
    argv.push_back(nullptr);
    posix_spawn_file_actions_t fa;
    posix_spawn_file_actions_init(&fa);
    posix_spawn_file_actions_adddup2(&fa, fd, STDOUT_FILENO);
    pid_t pid = 0;
    const int rc = posix_spawnp(&pid, argv[0], &fa, nullptr, argv.data(), environ);
    posix_spawn_file_actions_destroy(&fa);
    if (rc != 0)
        throw no_fit_error("cannot draw a picture: " + args[0] + " cannot be started (" + std::strerror(rc) +
                           ") install Python 3 with matplotlib, or name an interpreter with DSTK_PYTHON");
    int status = 0;
    while (::waitpid(pid, &status, 0) < 0)
        if (errno != EINTR) throw_errno("cannot wait for", args[0]);
    if (!WIFEXITED(status))
        throw runtime_error("the plotting script " + args[1] + " was killed by signal " +
                            std::to_string(WTERMSIG(status)) + " (out of memory?)");
    return WEXITSTATUS(status);
}

} // namespace

void draw_plot(const std::vector<fs::path>& inputs, const fs::path& png, bool force) {
    const fs::path script = plot_script();
    AtomicFile out(png, force);
    std::vector<std::string> args{python(), script.string()};
    for (const auto& in : inputs) args.push_back(in.string());
    args.insert(args.end(), {"-o", "-"});
    const int code = run_with_stdout(args, out.fd());
    const std::string what = "cannot draw " + png.string();
    if (code == 3)
        throw no_fit_error(what + " (" + args[0] +
                           " lacks matplotlib, as said above) install it (apt-get install "
                           "python3-matplotlib or pip install matplotlib), or name another interpreter with "
                           "DSTK_PYTHON");
    if (code != 0)
        throw Error(code == 2 ? ExitCode::usage : ExitCode::failure,
                    what + " (" + script.string() + " exited with " + std::to_string(code) + ", as said above)");
    out.commit();
}

} // namespace dstk
