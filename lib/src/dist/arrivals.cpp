#include "dist/arrivals.hpp"

#include <sys/stat.h>
#include <unistd.h>

#include <cstdlib>
#include <fstream>
#include <system_error>

namespace dstk::dist {

Arrivals::Arrivals(const Launch& launch) : launch_(launch) {
    if (launch.job.empty() || launch.local_size != launch.size) return;
    const char* tmp = std::getenv("TMPDIR");
    std::string job = launch.job;
    for (char& c : job)
        if (c == '/') c = '_';
    const std::filesystem::path dir =
        std::filesystem::path(tmp && *tmp ? tmp : "/tmp") / ("dstk-ranks-" + std::to_string(::getuid()) + "-" + job);
    ::mkdir(dir.c_str(), 0700);
    struct stat st {};
    // Only a directory of ours: another user's could hold any names.
    if (::lstat(dir.c_str(), &st) != 0 || !S_ISDIR(st.st_mode) || st.st_uid != ::getuid()) return;
    std::ofstream(dir / std::to_string(launch.rank));
    dir_ = dir;
}

std::string Arrivals::missing_text() const {
    if (dir_.empty())
        return "the ranks that did not arrive cannot be named from this host (they run elsewhere, or the launcher "
               "gives no job id): the launcher's log names them";
    std::string missing;
    for (int r = 0; r < launch_.size; ++r)
        if (!std::filesystem::exists(dir_ / std::to_string(r)))
            missing += (missing.empty() ? "" : ", ") + std::to_string(r);
    if (missing.empty()) return "every rank started dstrain, but not every rank reached MPI_Init";
    return "rank(s) " + missing + " never started dstrain";
}

void Arrivals::done() {
    if (dir_.empty()) return;
    std::error_code ec;
    std::filesystem::remove(dir_ / std::to_string(launch_.rank), ec);
    std::filesystem::remove(dir_, ec); // fails while other ranks' marks remain
    dir_.clear();
}

} // namespace dstk::dist
