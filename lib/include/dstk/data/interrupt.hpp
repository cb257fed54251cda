#pragma once
// Interrupting the data path's waits. A thread that waits for the data path
// (a consumer for its next batch, start_epoch for reader threads to stop, the
// cuda loader's feeder for the source) may wait forever where a read never
// returns (a hung network filesystem, a disk that stopped answering). While an
// InterruptCheck is installed on the waiting thread, those waits
// (wait_interruptible) poll it every interrupt_poll and throw Interrupted when
// it says so; without one they wait as a plain condition variable wait.
//
// The check belongs to the thread, not to a loader: only the thread that
// waits can run it (Python's signal handlers run on the main thread with the
// GIL; the feeder asks whether it is being stopped), and a source deep in a
// mix needs no argument threaded through every next().
//
// A wait that throws Interrupted leaves its object as it was before the call:
// next() took no batch and may be called again; an interrupted start_epoch
// started no epoch, and the caller starts one again before asking for
// batches. The threads that were stuck stay stuck until their read returns;
// only the wait for them was given up.
#include <chrono>
#include <condition_variable>
#include <functional>
#include <mutex>

#include "dstk/error.hpp"

namespace dstk::data {

// Thrown by a wait whose thread's check asked it to stop; exit code 130.
class Interrupted : public Error {
  public:
    Interrupted()
        : Error(ExitCode::interrupted, "interrupted while waiting for the data path (a stop was asked for)") {}
};

// How often a waiting thread runs its check: often enough for a Ctrl-C to
// answer within a fraction of a second, rarely enough to cost nothing.
inline constexpr std::chrono::milliseconds interrupt_poll{50};

// Installs `interrupted` as this thread's check while it lives (the one
// installed before comes back after). An empty function masks an outer check:
// a destructor that must wait to the end installs one.
class InterruptCheck {
  public:
    explicit InterruptCheck(std::function<bool()> interrupted);
    ~InterruptCheck();
    InterruptCheck(const InterruptCheck&) = delete;
    InterruptCheck& operator=(const InterruptCheck&) = delete;

    // Whether this thread has a check (an unmasked one).
    static bool installed();
    // Runs this thread's check; false without one.
    static bool requested();

  private:
    std::function<bool()> interrupted_;
    const InterruptCheck* outer_;
};

// cv.wait(lock, ready), and while a check is installed on this thread, that
// check every interrupt_poll until ready() holds: Interrupted when it says to
// stop, thrown with `lock` held. The check runs with `lock` released (it may
// take other locks: Python's GIL).
template <typename Ready>
void wait_interruptible(std::condition_variable& cv, std::unique_lock<std::mutex>& lock, Ready ready) {
    if (!InterruptCheck::installed()) return cv.wait(lock, ready);
    while (!cv.wait_for(lock, interrupt_poll, ready)) {
        lock.unlock();
        const bool stop = InterruptCheck::requested();
        lock.lock();
        if (stop) throw Interrupted();
    }
}

// Between the pieces of a long piece of work (a split read into memory):
// Interrupted where this thread's check says to stop, and the tools' Error
// where their signal handler saw a signal (dstk/signals.hpp).
void interruption_point();

// Locks `m`, a mutex another thread may hold while it waits for a read; while
// a check is installed on this thread, that check every interrupt_poll until
// the lock is taken (Interrupted when it says to stop, nothing held).
std::unique_lock<std::timed_mutex> lock_interruptible(std::timed_mutex& m);

} // namespace dstk::data
