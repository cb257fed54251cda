#include "dstk/data/interrupt.hpp"

#include <utility>

#include "dstk/signals.hpp"

namespace dstk::data {
namespace {

thread_local const InterruptCheck* current = nullptr;

} // namespace

InterruptCheck::InterruptCheck(std::function<bool()> interrupted)
    : interrupted_(std::move(interrupted)), outer_(current) {
    current = this;
}

InterruptCheck::~InterruptCheck() {
    current = outer_;
}

bool InterruptCheck::installed() {
    return current && current->interrupted_;
}

bool InterruptCheck::requested() {
    return installed() && current->interrupted_();
}

void interruption_point() {
    throw_if_interrupted();
    if (InterruptCheck::requested()) throw Interrupted();
}

std::unique_lock<std::timed_mutex> lock_interruptible(std::timed_mutex& m) {
    if (!InterruptCheck::installed()) return std::unique_lock(m);
    std::unique_lock lock(m, std::defer_lock);
    while (!lock.try_lock_for(interrupt_poll))
        if (InterruptCheck::requested()) throw Interrupted();
    return lock;
}

} // namespace dstk::data
