#pragma once
// A fixed pool of worker threads. parallel_for runs fn(i) for i in [0, n) and
// returns when all are done, rethrowing the first exception; results must not
// depend on which thread ran which index (determinism is the caller's job:
// write into slot i, reduce in index order).
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <exception>
#include <functional>
#include <mutex>
#include <string_view>
#include <thread>
#include <vector>

namespace dstk {

class ThreadPool {
  public:
    // threads == 0: one per hardware thread.
    explicit ThreadPool(unsigned threads = 0);
    ~ThreadPool();
    ThreadPool(const ThreadPool&) = delete;
    ThreadPool& operator=(const ThreadPool&) = delete;

    unsigned size() const { return static_cast<unsigned>(workers_.size()); }

    void parallel_for(std::uint64_t n, const std::function<void(std::uint64_t)>& fn);

    // Fire-and-forget task; wait_idle() waits for all submitted tasks.
    void submit(std::function<void()> task);
    void wait_idle();

  private:
    void worker_loop();

    std::vector<std::thread> workers_;
    std::deque<std::function<void()>> queue_;
    std::mutex mutex_;
    std::condition_variable wake_, idle_;
    unsigned busy_ = 0;
    bool stop_ = false;
    std::exception_ptr first_error_;
};

unsigned hardware_threads();

// Starts `count` threads running body(i), appended to `threads`. Where the
// system refuses one (a container's pids limit, a process at its thread
// limit), stop() is called to make those already started return, they are
// joined and removed, and an Error says what could not start: a joinable
// std::thread left in the vector would end the process (std::terminate).
void start_threads(std::vector<std::thread>& threads, unsigned count, const std::function<void(unsigned)>& body,
                   const std::function<void()>& stop, std::string_view what);

} // namespace dstk
