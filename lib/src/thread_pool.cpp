#include "dstk/thread_pool.hpp"

#include <atomic>
#include <string>

#include "dstk/error.hpp"

namespace dstk {

unsigned hardware_threads() {
    const unsigned n = std::thread::hardware_concurrency();
    return n ? n : 1;
}

void start_threads(std::vector<std::thread>& threads, unsigned count, const std::function<void(unsigned)>& body,
                   const std::function<void()>& stop, std::string_view what) {
    const std::size_t before = threads.size();
    try {
        for (unsigned i = 0; i < count; ++i) threads.emplace_back(body, i);
    } catch (const std::exception& e) { // std::system_error; bad_alloc from the vector
        const std::size_t started = threads.size() - before;
        stop();
        for (std::size_t t = before; t < threads.size(); ++t) threads[t].join();
        threads.resize(before);
        throw runtime_error("cannot start " + std::string(what) + " (" + std::to_string(started) + " of " +
                            std::to_string(count) + " started: " + e.what() +
                            "); the system refuses more threads (a pids or thread limit): lower the threads "
                            "asked for, or end other processes");
    }
}

ThreadPool::ThreadPool(unsigned threads) {
    if (threads == 0) threads = hardware_threads();
    workers_.reserve(threads);
    start_threads(
        workers_, threads, [this](unsigned) { worker_loop(); },
        [this] {
            std::lock_guard lock(mutex_);
            stop_ = true;
            wake_.notify_all();
        },
        std::to_string(threads) + " worker threads");
}

ThreadPool::~ThreadPool() {
    {
        std::lock_guard lock(mutex_);
        stop_ = true;
    }
    wake_.notify_all();
    for (auto& w : workers_) w.join();
}

void ThreadPool::worker_loop() {
    for (;;) {
        std::function<void()> task;
        {
            std::unique_lock lock(mutex_);
            wake_.wait(lock, [&] { return stop_ || !queue_.empty(); });
            if (queue_.empty()) return; // stop_ and drained
            task = std::move(queue_.front());
            queue_.pop_front();
            ++busy_;
        }
        try {
            task();
        } catch (...) {
            std::lock_guard lock(mutex_);
            if (!first_error_) first_error_ = std::current_exception();
        }
        {
            std::lock_guard lock(mutex_);
            --busy_;
            if (busy_ == 0 && queue_.empty()) idle_.notify_all();
        }
    }
}

void ThreadPool::submit(std::function<void()> task) {
    {
        std::lock_guard lock(mutex_);
        queue_.push_back(std::move(task));
    }
    wake_.notify_one();
}

void ThreadPool::wait_idle() {
    std::unique_lock lock(mutex_);
    idle_.wait(lock, [&] { return busy_ == 0 && queue_.empty(); });
    if (first_error_) {
        auto e = first_error_;
        first_error_ = nullptr;
        std::rethrow_exception(e);
    }
}

void ThreadPool::parallel_for(std::uint64_t n, const std::function<void(std::uint64_t)>& fn) {
    if (n == 0) return;
    if (n == 1 || workers_.size() == 1) {
        for (std::uint64_t i = 0; i < n; ++i) fn(i);
        return;
    }
    // Workers pull indices from a shared counter; each index runs exactly once.
    struct Shared {
        std::atomic<std::uint64_t> next{0};
        std::atomic<bool> failed{false};
        std::mutex m;
        std::condition_variable done_cv;
        unsigned running = 0;
        std::exception_ptr error;
    } shared;
    const unsigned tasks = static_cast<unsigned>(std::min<std::uint64_t>(n, workers_.size()));
    shared.running = tasks;
    for (unsigned t = 0; t < tasks; ++t) {
        submit([&] {
            try {
                for (std::uint64_t i; !shared.failed && (i = shared.next.fetch_add(1)) < n;) fn(i);
            } catch (...) {
                std::lock_guard lock(shared.m);
                if (!shared.error) shared.error = std::current_exception();
                shared.failed = true;
            }
            std::lock_guard lock(shared.m);
            if (--shared.running == 0) shared.done_cv.notify_all();
        });
    }
    std::unique_lock lock(shared.m);
    shared.done_cv.wait(lock, [&] { return shared.running == 0; });
    if (shared.error) std::rethrow_exception(shared.error);
}

} // namespace dstk
