#include "dstk/signals.hpp"

#include <atomic>
#include <csignal>
#include <cstring>
#include <mutex>
#include <unistd.h>

#include "dstk/error.hpp"

namespace dstk {
namespace {

std::atomic<int> g_signals{0};
std::atomic<int> g_first_signal{0};

// Fixed storage so the handler touches no allocator.
constexpr int max_paths = 256;
constexpr int max_path_len = 4096;
char g_paths[max_paths][max_path_len];
std::atomic<bool> g_used[max_paths];
std::mutex g_register_mutex;

void on_signal(int sig) {
    if (g_signals.fetch_add(1) == 0) { // first: let the tool unwind and clean up
        g_first_signal.store(sig);
        return;
    }
    for (int i = max_paths - 1; i >= 0; --i) {
        if (!g_used[i].load()) continue;
        if (::unlink(g_paths[i]) != 0) ::rmdir(g_paths[i]);
    }
    const char msg[] = "\ninterrupted: temporary outputs removed\n";
    (void)!::write(STDERR_FILENO, msg, sizeof msg - 1);
    const int first = g_first_signal.load();
    ::_exit(128 + (first ? first : sig));
}

} // namespace

void install_interrupt_handlers() {
    struct sigaction sa {};
    sa.sa_handler = on_signal;
    sigemptyset(&sa.sa_mask);
    sa.sa_flags = 0; // no SA_RESTART: blocking reads return EINTR and loops notice
    sigaction(SIGINT, &sa, nullptr);
    sigaction(SIGTERM, &sa, nullptr);
}

bool interrupted() {
    return g_signals.load() > 0;
}

void throw_if_interrupted() {
    if (interrupted()) throw Error(ExitCode::interrupted, "interrupted (signal received); partial outputs removed");
}

ExitCode interrupt_exit_code() {
    return g_first_signal.load() == SIGTERM ? ExitCode::terminated : ExitCode::interrupted;
}

void register_temp_path(const std::filesystem::path& p) {
    const std::string s = p.string();
    if (s.size() >= max_path_len) return;
    std::lock_guard lock(g_register_mutex);
    // Keep registration order: take the lowest free slot above every used one.
    int slot = -1;
    for (int i = max_paths - 1; i >= 0; --i) {
        if (g_used[i].load()) break;
        slot = i;
    }
    if (slot < 0) return;
    std::memcpy(g_paths[slot], s.c_str(), s.size() + 1);
    g_used[slot].store(true);
}

void unregister_temp_path(const std::filesystem::path& p) {
    const std::string s = p.string();
    std::lock_guard lock(g_register_mutex);
    for (int i = 0; i < max_paths; ++i)
        if (g_used[i].load() && s == g_paths[i]) g_used[i].store(false);
}

} // namespace dstk
