#include "input_sets.hpp"

#include "cuda_check.hpp"

namespace dstk::train::cuda {

InputSets::InputSets(cudaStream_t main, int priority) : main_(main) {
    CUDA_CHECK(cudaStreamCreateWithPriority(&input_, cudaStreamNonBlocking, priority));
    CUDA_CHECK(cudaEventCreateWithFlags(&ready_, cudaEventDisableTiming));
    CUDA_CHECK(cudaEventCreateWithFlags(&gate_, cudaEventDisableTiming));
    for (auto& e : read_) CUDA_CHECK(cudaEventCreateWithFlags(&e, cudaEventDisableTiming));
}

InputSets::~InputSets() {
    if (input_) cudaStreamSynchronize(input_);
    for (auto e : read_)
        if (e) cudaEventDestroy(e);
    if (ready_) cudaEventDestroy(ready_);
    if (gate_) cudaEventDestroy(gate_);
    if (input_) cudaStreamDestroy(input_);
}

// An event never recorded counts as complete: the first use of each set waits for nothing.
void InputSets::take(bool serial) {
    CUDA_CHECK(cudaEventRecord(read_[set_], main_)); // every reader of the current set is enqueued by now
    const unsigned last = set_;
    set_ = (set_ + 1) % count;
    CUDA_CHECK(cudaStreamWaitEvent(input_, read_[serial ? last : set_], 0));
    CUDA_CHECK(cudaStreamWaitEvent(input_, gate_, 0));
}

void InputSets::open_gate(cudaStream_t s) {
    cudaStreamCaptureStatus capturing = cudaStreamCaptureStatusNone;
    CUDA_CHECK(cudaStreamIsCapturing(s, &capturing));
    CUDA_CHECK(cudaEventRecordWithFlags(
        gate_, s, capturing == cudaStreamCaptureStatusActive ? cudaEventRecordExternal : cudaEventRecordDefault));
}

void InputSets::hand_over(cudaStream_t to) {
    CUDA_CHECK(cudaEventRecord(ready_, input_));
    CUDA_CHECK(cudaStreamWaitEvent(to, ready_, 0));
}

} // namespace dstk::train::cuda
