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

} // namespace dstk
