// The launcher's environment: which rank this process is, of how many, and
// which of the host's processes (for the GPU it takes).
#include <cerrno>
#include <cstdlib>
#include <string>

#include "dstk/dist/world.hpp"
#include "dstk/error.hpp"

namespace dstk::dist {
namespace {

struct Names {
    const char* launcher;
    const char* rank;
    const char* size;
    const char* local_rank;
    const char* local_size;
    bool mpi_launcher;
};

// In the order they are tried: mpirun inside a Slurm allocation sets both
// Open MPI's and Slurm's variables, and Open MPI's are the processes' own.
constexpr Names launchers[] = {
    {"Open MPI", "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_LOCAL_RANK",
     "OMPI_COMM_WORLD_LOCAL_SIZE", true},
    {"MPICH/PMI", "PMI_RANK", "PMI_SIZE", "MPI_LOCALRANKID", "MPI_LOCALNRANKS", true},
    {"Slurm", "SLURM_PROCID", "SLURM_NTASKS", "SLURM_LOCALID", nullptr, false},
};

int number(const Getenv& env, const char* name, long low, long high, const char* launcher) {
    const char* text = env(name);
    if (!text) return static_cast<int>(low); // local rank absent: 0
    errno = 0;
    char* end = nullptr;
    const long v = std::strtol(text, &end, 10);
    if (errno != 0 || end == text || *end != '\0' || v < low || v > high)
        throw usage_error(std::string(name) + "='" + text + "' (set by " + launcher + ": must be a number from " +
                          std::to_string(low) + " to " + std::to_string(high) +
                          ") start dstrain through the launcher unchanged, or unset it");
    return static_cast<int>(v);
}

} // namespace

Launch detect_launch(const Getenv& env) {
    for (const Names& n : launchers) {
        if (!env(n.rank) || !env(n.size)) continue;
        Launch l;
        l.launcher = n.launcher;
        l.by_mpi_launcher = n.mpi_launcher;
        l.size = number(env, n.size, 1, 1 << 20, n.launcher);
        l.rank = number(env, n.rank, 0, l.size - 1, n.launcher);
        l.local_rank = number(env, n.local_rank, 0, l.size - 1, n.launcher);
        if (n.local_size && env(n.local_size)) l.local_size = number(env, n.local_size, 1, l.size, n.launcher);
        const char* nodes = env("SLURM_STEP_NUM_NODES");
        if (!n.local_size && nodes && std::string(nodes) == "1") l.local_size = l.size;
        if (const char* ns = env("PMIX_NAMESPACE")) l.job = ns;
        const char *job = env("SLURM_JOB_ID"), *step = env("SLURM_STEP_ID");
        if (l.job.empty() && job) l.job = std::string(job) + "." + (step ? step : "0");
        return l;
    }
    return {};
}

Launch detect_launch() {
    return detect_launch([](const char* name) { return static_cast<const char*>(std::getenv(name)); });
}

} // namespace dstk::dist
