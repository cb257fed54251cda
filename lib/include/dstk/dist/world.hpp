#pragma once
// This process among the ranks of a data-parallel run (DESIGN.md, "Beyond one
// machine"): where the launcher put it (rank, world size, local rank, read
// from the environment of mpirun or srun), and the few host collectives a run
// needs beside the trainer's Reducer (summed figures, gathered peaks, the NCCL
// id, a common decision to stop).
//
// A plain run (no launcher) initialises nothing: no MPI, and every
// collective is the identity. A world that an MPI launcher started, one rank
// included, initialises MPI, then meets at a rendezvous with a deadline: a
// rank that never arrives ends the others with exit 1 and a message naming
// it, never a hang. One rank takes the distributed path (its reducer at N = 1
// returns its input bit for bit) so that the path is measured and tested on
// one GPU against the plain one.
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <vector>

namespace dstk::dist {

class Reducer;

struct Launch {
    int rank = 0, size = 1, local_rank = 0;
    int local_size = 0;   // processes on this host; 0: not told
    std::string job;      // the launcher's job id (Open MPI, Slurm); empty: not told
    std::string launcher; // "Open MPI", "MPICH/PMI", "Slurm"; empty: started without one
    // Started by mpirun/mpiexec (Open MPI, MPICH/PMI), whose variables are
    // set only in the processes they start. Slurm's are also set in a batch
    // script's plain commands, so a Slurm world of one stays a plain run.
    bool by_mpi_launcher = false;
};

using Getenv = std::function<const char*(const char*)>;
// The first launcher whose variables are set: Open MPI (OMPI_COMM_WORLD_RANK,
// _SIZE, _LOCAL_RANK), MPICH/PMI (PMI_RANK, PMI_SIZE, MPI_LOCALRANKID), Slurm
// (SLURM_PROCID, SLURM_NTASKS, SLURM_LOCALID); with them the host's process
// count (OMPI_COMM_WORLD_LOCAL_SIZE, MPI_LOCALNRANKS, SLURM_STEP_NUM_NODES=1)
// and the job id (PMIX_NAMESPACE, SLURM_JOB_ID.SLURM_STEP_ID). A value that is not a number
// in range is a usage error naming the variable.
Launch detect_launch(const Getenv& env);
Launch detect_launch(); // from the process environment

// Whether this build has MPI (CMake found it).
bool mpi_built();

class World {
  public:
    // Plain (size 1 and not by_mpi_launcher, or size 1 in a build without
    // MPI, such as the Python package): nothing is initialised. Otherwise:
    // MPI_Init under a watchdog, then
    // every rank checks in with rank 0 within `timeout_s` seconds. Errors:
    // usage (exit 2) for a build without MPI; failure (exit 1) naming the
    // ranks that did not arrive (the watchdog, when MPI_Init itself does not
    // return, ends the process with exit 1 and that message).
    static std::unique_ptr<World> join(const Launch& launch, double timeout_s);
    World(const World&) = delete;
    World& operator=(const World&) = delete;
    // Finalises MPI on a normal exit; while an exception unwinds it does not
    // (MPI_Finalize waits for every rank), so the launcher sees this rank fail
    // and ends the others.
    ~World();

    int rank() const { return launch_.rank; }
    int size() const { return launch_.size; }
    int local_rank() const { return launch_.local_rank; }
    bool root() const { return launch_.rank == 0; }
    const Launch& launch() const { return launch_; }
    // MPI initialised: data-parallel training, with a Reducer, for any size.
    bool distributed() const { return mpi_; }

    // In place: the sum over ranks, added in rank order (the same on every rank).
    void sum(std::span<double> values);
    // Every rank's value, in rank order, on every rank.
    std::vector<std::uint64_t> gather(std::uint64_t value);
    // Rank 0's bytes to every rank (every rank passes the same size).
    void broadcast(std::span<std::byte> bytes);
    // True on every rank when any rank passes true.
    bool any(bool flag);
    // Returns once every rank has called it.
    void barrier();
    // The MPI Reducer of host memory (the cpu backend), in a fixed order:
    // bitwise the same result on every rank and in every run.
    std::unique_ptr<Reducer> host_reducer();

  private:
    explicit World(const Launch& launch) : launch_(launch) {}
    Launch launch_;
    bool mpi_ = false;
};

} // namespace dstk::dist
