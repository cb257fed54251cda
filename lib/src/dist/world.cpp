// The world of a data-parallel run over MPI: initialisation under a watchdog,
// the start-up rendezvous, the host collectives and the host Reducer. A build
// without MPI keeps the world of one.
#include "dstk/dist/world.hpp"

#include <algorithm>
#include <chrono>
#include <climits>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <mutex>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "dist/arrivals.hpp"
#include "dstk/dist/reducer.hpp"
#include "dstk/error.hpp"

#if defined(DSTK_HAVE_MPI)
// The C API only: the deprecated C++ bindings need a library we do not link.
#define OMPI_SKIP_MPICXX 1
#define MPICH_SKIP_MPICXX 1
#include <mpi.h>
#endif

namespace dstk::dist {

bool mpi_built() {
#if defined(DSTK_HAVE_MPI)
    return true;
#else
    return false;
#endif
}

namespace {

std::string timeout_text(double s) {
    char buf[32];
    std::snprintf(buf, sizeof buf, "%g", s);
    return buf;
}

std::string what_to_do() {
    return "check that every rank started and can reach the others (a crashed or stuck process, a node that never "
           "came up, a wrong host list), or raise --dist-timeout";
}

#if defined(DSTK_HAVE_MPI)

// MPI_Init waits for every rank under Open MPI: a rank that never starts
// would hold the others there for ever. The watchdog ends this process with
// exit 1 and a message once the deadline passes, unless disarmed first.
class Watchdog {
  public:
    Watchdog(double seconds, std::function<std::string()> message)
        : thread_([this, seconds, message = std::move(message)] {
              std::unique_lock lock(mutex_);
              if (changed_.wait_for(lock, std::chrono::duration<double>(seconds), [this] { return disarmed_; })) return;
              std::fprintf(stderr, "dstrain: error: %s\n", message().c_str());
              std::fflush(stderr);
              std::_Exit(1);
          }) {}
    ~Watchdog() { disarm(); }
    void disarm() {
        {
            std::lock_guard lock(mutex_);
            disarmed_ = true;
        }
        changed_.notify_all();
        if (thread_.joinable()) thread_.join();
    }

  private:
    std::mutex mutex_;
    std::condition_variable changed_;
    bool disarmed_ = false;
    std::thread thread_;
};

void mpi_check(int rc, const char* what) {
    if (rc == MPI_SUCCESS) return;
    char text[MPI_MAX_ERROR_STRING];
    int len = 0;
    MPI_Error_string(rc, text, &len);
    throw runtime_error(std::string(what) + " failed (" + std::string(text, static_cast<std::size_t>(len)) +
                        ") check the MPI installation and the launcher's log");
}

// Counts above INT_MAX go in pieces.
template <class F> void in_pieces(std::size_t count, F&& piece) {
    constexpr std::size_t most = std::size_t{1} << 28;
    for (std::size_t first = 0; first < count; first += most)
        piece(first, static_cast<int>(std::min(most, count - first)));
}

constexpr int rendezvous_tag = 0x4453;

// Every rank checks in with rank 0, which answers when all have: with
// nonblocking calls polled up to the deadline, so that a rank missing here
// (MPI launchers that do not hold MPI_Init for all) is named, not waited for.
void rendezvous(const Launch& l, std::chrono::steady_clock::time_point deadline, double timeout_s) {
    const int n = l.size;
    std::vector<MPI_Request> requests;
    std::vector<int> flags(static_cast<std::size_t>(n), 1);
    if (l.rank == 0) {
        for (int r = 1; r < n; ++r) {
            requests.emplace_back();
            mpi_check(MPI_Irecv(&flags[static_cast<std::size_t>(r)], 1, MPI_INT, r, rendezvous_tag, MPI_COMM_WORLD,
                                &requests.back()),
                      "MPI_Irecv");
        }
    } else {
        requests.resize(2);
        mpi_check(MPI_Isend(&flags[0], 1, MPI_INT, 0, rendezvous_tag, MPI_COMM_WORLD, &requests[0]), "MPI_Isend");
        mpi_check(MPI_Irecv(&flags[1], 1, MPI_INT, 0, rendezvous_tag, MPI_COMM_WORLD, &requests[1]), "MPI_Irecv");
    }
    std::vector<int> done(requests.size(), 0);
    for (;;) {
        bool all = true;
        for (std::size_t i = 0; i < requests.size(); ++i) {
            if (!done[i]) mpi_check(MPI_Test(&requests[i], &done[i], MPI_STATUS_IGNORE), "MPI_Test");
            all = all && done[i];
        }
        if (all) break;
        if (std::chrono::steady_clock::now() > deadline) {
            std::string missing;
            if (l.rank == 0) {
                for (std::size_t i = 0; i < done.size(); ++i)
                    if (!done[i]) missing += (missing.empty() ? "" : ", ") + std::to_string(i + 1);
            } else {
                missing = "0";
            }
            throw runtime_error("rank " + std::to_string(l.rank) + " of " + std::to_string(n) + ": rank(s) " + missing +
                                " did not reach the start-up rendezvous within --dist-timeout " +
                                timeout_text(timeout_s) + " s; " + what_to_do());
        }
        std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
    if (l.rank == 0) {
        std::vector<MPI_Request> sends(static_cast<std::size_t>(n - 1));
        for (int r = 1; r < n; ++r)
            mpi_check(MPI_Isend(&flags[0], 1, MPI_INT, r, rendezvous_tag, MPI_COMM_WORLD,
                                &sends[static_cast<std::size_t>(r - 1)]),
                      "MPI_Isend");
        mpi_check(MPI_Waitall(n - 1, sends.data(), MPI_STATUSES_IGNORE), "MPI_Waitall");
    }
}

// Gathers `count` floats of every rank, then adds them in rank order: the
// same bits on every rank, and in every run of the same world size.
class MpiReducer final : public Reducer {
  public:
    explicit MpiReducer(const Launch& l) : rank_(l.rank), size_(l.size) {}
    int rank() const override { return rank_; }
    int size() const override { return size_; }
    void average_host(float* data, std::size_t count) override {
        const auto n = static_cast<std::size_t>(size_);
        in_pieces(count, [&](std::size_t first, int len) {
            all_.resize(n * static_cast<std::size_t>(len));
            mpi_check(MPI_Allgather(data + first, len, MPI_FLOAT, all_.data(), len, MPI_FLOAT, MPI_COMM_WORLD),
                      "MPI_Allgather");
            const float inv = 1.0f / static_cast<float>(size_);
            for (int i = 0; i < len; ++i) {
                float s = all_[static_cast<std::size_t>(i)];
                for (std::size_t r = 1; r < n; ++r) s += all_[r * static_cast<std::size_t>(len) + i];
                data[first + static_cast<std::size_t>(i)] = s * inv;
            }
        });
    }
    void broadcast_host(float* data, std::size_t count) override {
        in_pieces(count, [&](std::size_t first, int len) {
            mpi_check(MPI_Bcast(data + first, len, MPI_FLOAT, 0, MPI_COMM_WORLD), "MPI_Bcast");
        });
    }
    void average_device(float*, std::size_t, void*) override {
        throw std::logic_error("the MPI reducer works on host memory only");
    }
    void broadcast_device(float*, std::size_t, void*) override {
        throw std::logic_error("the MPI reducer works on host memory only");
    }

  private:
    int rank_, size_;
    std::vector<float> all_;
};

#endif

} // namespace

std::unique_ptr<World> World::join(const Launch& launch, double timeout_s) {
    std::unique_ptr<World> w(new World(launch));
    if (launch.size <= 1 && !launch.by_mpi_launcher) return w;
    if (!(timeout_s > 0)) throw usage_error("invalid --dist-timeout (must be positive seconds)");
#if defined(DSTK_HAVE_MPI)
    // A year at most: a longer wait does not fit the clock's ticks.
    const double wait_s = std::min(timeout_s, 3.2e7);
    const auto deadline =
        std::chrono::steady_clock::now() +
        std::chrono::duration_cast<std::chrono::steady_clock::duration>(std::chrono::duration<double>(wait_s));
    Arrivals arrivals(launch);
    {
        Watchdog watchdog(wait_s, [&] {
            return "rank " + std::to_string(launch.rank) + " of " + std::to_string(launch.size) +
                   ": MPI_Init did not complete within --dist-timeout " + timeout_text(timeout_s) +
                   " s (it waits for every rank): " + arrivals.missing_text() + "; " + what_to_do();
        });
        int provided = 0;
        mpi_check(MPI_Init_thread(nullptr, nullptr, MPI_THREAD_FUNNELED, &provided), "MPI_Init_thread");
        watchdog.disarm();
    }
    w->mpi_ = true;
    int size = 0, rank = 0;
    MPI_Comm_size(MPI_COMM_WORLD, &size);
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    if (size != launch.size || rank != launch.rank)
        throw runtime_error("MPI says rank " + std::to_string(rank) + " of " + std::to_string(size) + ", " +
                            launch.launcher + "'s environment rank " + std::to_string(launch.rank) + " of " +
                            std::to_string(launch.size) +
                            " (two launchers' variables mixed?) start dstrain with one launcher");
    rendezvous(launch, deadline, timeout_s);
    arrivals.done();
    return w;
#else
    if (launch.size <= 1) return w; // one rank trains the same without MPI
    throw usage_error(launch.launcher + " started " + std::to_string(launch.size) +
                      " processes, but this dstrain was built without MPI (no data-parallel training) rebuild with "
                      "MPI installed (scripts/setup.sh installs Open MPI), or run one process");
#endif
}

World::~World() {
#if defined(DSTK_HAVE_MPI)
    if (mpi_ && std::uncaught_exceptions() == 0) MPI_Finalize();
#endif
}

void World::sum(std::span<double> values) {
#if defined(DSTK_HAVE_MPI)
    if (!mpi_ || values.empty()) return;
    const auto n = static_cast<std::size_t>(size());
    std::vector<double> all(n * values.size());
    mpi_check(MPI_Allgather(values.data(), static_cast<int>(values.size()), MPI_DOUBLE, all.data(),
                            static_cast<int>(values.size()), MPI_DOUBLE, MPI_COMM_WORLD),
              "MPI_Allgather");
    for (std::size_t i = 0; i < values.size(); ++i) {
        double s = all[i];
        for (std::size_t r = 1; r < n; ++r) s += all[r * values.size() + i];
        values[i] = s;
    }
#else
    (void)values;
#endif
}

std::vector<std::uint64_t> World::gather(std::uint64_t value) {
    std::vector<std::uint64_t> all(static_cast<std::size_t>(size()), value);
#if defined(DSTK_HAVE_MPI)
    if (mpi_)
        mpi_check(MPI_Allgather(&value, 1, MPI_UINT64_T, all.data(), 1, MPI_UINT64_T, MPI_COMM_WORLD), "MPI_Allgather");
#endif
    return all;
}

void World::broadcast(std::span<std::byte> bytes) {
#if defined(DSTK_HAVE_MPI)
    if (!mpi_) return;
    in_pieces(bytes.size(), [&](std::size_t first, int len) {
        mpi_check(MPI_Bcast(bytes.data() + first, len, MPI_BYTE, 0, MPI_COMM_WORLD), "MPI_Bcast");
    });
#else
    (void)bytes;
#endif
}

bool World::any(bool flag) {
#if defined(DSTK_HAVE_MPI)
    if (!mpi_) return flag;
    int in = flag ? 1 : 0, out = 0;
    mpi_check(MPI_Allreduce(&in, &out, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD), "MPI_Allreduce");
    return out != 0;
#else
    return flag;
#endif
}

void World::barrier() {
#if defined(DSTK_HAVE_MPI)
    if (mpi_) mpi_check(MPI_Barrier(MPI_COMM_WORLD), "MPI_Barrier");
#endif
}

std::unique_ptr<Reducer> World::host_reducer() {
#if defined(DSTK_HAVE_MPI)
    if (mpi_) return std::make_unique<MpiReducer>(launch_);
#endif
    throw std::logic_error("World::host_reducer in a plain run (no MPI)");
}

} // namespace dstk::dist
