#include "dstk/data/interrupt.hpp"

#include <utility>

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

} // namespace dstk::data
