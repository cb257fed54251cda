#include "side_branch.hpp"

#include <utility>

namespace dstk::train::cuda {

SideBranch::SideBranch(cudaStream_t main, cublasMath_t cublas_math, bool handles) : main_(main) {
    int priority = 0; // the main stream's (an eager step's weight gradients are as urgent)
    CUDA_CHECK(cudaStreamGetPriority(main, &priority));
    CUDA_CHECK(cudaStreamCreateWithPriority(&side_, cudaStreamNonBlocking, priority));
    CUDA_CHECK(cudaEventCreateWithFlags(&forked_, cudaEventDisableTiming));
    CUDA_CHECK(cudaEventCreateWithFlags(&joined_, cudaEventDisableTiming));
    CUDA_CHECK(cudaEventCreateWithFlags(&waited_, cudaEventDisableTiming));
    if (!handles) return;
    CUDNN_CHECK(cudnnCreate(&cudnn_));
    CUDNN_CHECK(cudnnSetStream(cudnn_, side_));
    CUBLAS_CHECK(cublasCreate(&cublas_));
    CUBLAS_CHECK(cublasSetStream(cublas_, side_));
    CUBLAS_CHECK(cublasSetMathMode(cublas_, cublas_math));
}

SideBranch::~SideBranch() {
    if (side_) cudaStreamSynchronize(side_);
    if (cublas_) cublasDestroy(cublas_);
    if (cudnn_) cudnnDestroy(cudnn_);
    if (forked_) cudaEventDestroy(forked_);
    if (joined_) cudaEventDestroy(joined_);
    if (waited_) cudaEventDestroy(waited_);
    if (side_) cudaStreamDestroy(side_);
}

void SideBranch::set_cublas_workspace(void* p, std::size_t bytes) {
    CUBLAS_CHECK(cublasSetWorkspace(cublas_, p, bytes));
}

void SideBranch::fork() {
    CUDA_CHECK(cudaEventRecord(forked_, main_));
    CUDA_CHECK(cudaStreamWaitEvent(side_, forked_, 0));
    open_ = true;
}

void SideBranch::join() {
    if (!std::exchange(open_, false)) return;
    CUDA_CHECK(cudaEventRecord(joined_, side_));
    CUDA_CHECK(cudaStreamWaitEvent(main_, joined_, 0));
}

void SideBranch::record(cudaEvent_t e) const {
    CUDA_CHECK(cudaEventRecord(e, side_));
}

void SideBranch::wait_for(const SideBranch& other) {
    if (!other.open_) return;
    CUDA_CHECK(cudaEventRecord(waited_, other.side_));
    CUDA_CHECK(cudaStreamWaitEvent(side_, waited_, 0));
}

GradBuffers::~GradBuffers() {
    for (auto e : read_)
        if (e) cudaEventDestroy(e);
}

void GradBuffers::create_events() {
    for (auto& e : read_)
        if (!e) CUDA_CHECK(cudaEventCreateWithFlags(&e, cudaEventDisableTiming));
}

void* GradBuffers::next(const void* dy, cudaStream_t main) {
    std::size_t pick = count;
    for (std::size_t k = 0; k < count; ++k) {
        if (buf_[k] == dy) continue;
        if (!pending_[k]) return buf_[k];
        if (pick == count || age_[k] < age_[pick]) pick = k;
    }
    CUDA_CHECK(cudaStreamWaitEvent(main, read_[pick], 0));
    pending_[pick] = false;
    return buf_[pick];
}

void GradBuffers::read_by_side(const void* p, const SideBranch& side) {
    for (std::size_t k = 0; k < count; ++k)
        if (buf_[k] == p) {
            side.record(read_[k]);
            pending_[k] = true;
            age_[k] = ++clock_;
        }
}

void GradBuffers::reset() {
    for (bool& p : pending_) p = false;
}

} // namespace dstk::train::cuda
