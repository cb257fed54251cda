#pragma once
// The weight gradients of a backward pass on a second stream, beside the data
// gradients on the main one. At batch sizes where one small convolution's
// kernels leave most SMs idle, a layer's weight gradient and the data
// gradients below it then run at the same time; captured into a graph, the
// fork and join below become its edges (CUDA's stream-capture fork/join).
//
// SideBranch owns the second stream, its cuDNN and cuBLAS handles (where it
// has them) and the events that order the two. The trainer has a second one
// for the update of the upper layers' parameters (upper_update_layer). GradBuffers hands out the buffers the main
// stream writes data gradients into, so that none is overwritten while the
// side stream still reads it: a weight gradient reads its layer's output
// gradient (dy) after the main stream has moved on to the layers below.
// Results are those of one stream: the side's kernels use their own
// workspaces and write disjoint parts of the gradient vector.
#include <cuda_runtime.h>

#include <cstddef>

#include "cudnn_check.hpp"

namespace dstk::train::cuda {

class SideBranch {
  public:
    // cublas_math: the main cuBLAS handle's math mode; handles: whether the
    // branch gets cuDNN and cuBLAS handles (a branch of plain kernels needs none).
    SideBranch(cudaStream_t main, cublasMath_t cublas_math, bool handles = true);
    ~SideBranch();
    SideBranch(const SideBranch&) = delete;
    SideBranch& operator=(const SideBranch&) = delete;

    cudaStream_t stream() const { return side_; }
    cudnnHandle_t cudnn() const { return cudnn_; }
    cublasHandle_t cublas() const { return cublas_; }
    void set_cublas_workspace(void* p, std::size_t bytes);

    // The side stream waits for what the main stream has issued so far.
    void fork();
    // The main stream waits for what the side stream has issued since the
    // first fork after the last join (nothing where it was not forked); a
    // capture ends only after this (every forked stream must rejoin).
    void join();
    // `e` marks what the side stream has issued so far.
    void record(cudaEvent_t e) const;
    // The side stream also waits for what `other`'s side stream has issued
    // since its fork (nothing where it was not forked): call after fork().
    void wait_for(const SideBranch& other);

  private:
    cudaStream_t main_ = nullptr, side_ = nullptr;
    cudnnHandle_t cudnn_ = nullptr;
    cublasHandle_t cublas_ = nullptr;
    cudaEvent_t forked_ = nullptr, joined_ = nullptr, waited_ = nullptr;
    bool open_ = false; // forked since the last join
};

// Three data-gradient buffers of `bytes` each, handed out by next(): never the
// one holding dy, and one the side stream no longer reads (the main stream
// waits for that read where all are still being read).
class GradBuffers {
  public:
    static constexpr std::size_t count = 3;
    GradBuffers() = default;
    ~GradBuffers();
    GradBuffers(const GradBuffers&) = delete;
    GradBuffers& operator=(const GradBuffers&) = delete;

    void set(std::size_t k, void* p) { buf_[k] = p; }
    void* operator[](std::size_t k) const { return buf_[k]; }
    // Creates the events (once the device is current).
    void create_events();

    // Where the main stream writes the gradient that comes after dy.
    void* next(const void* dy, cudaStream_t main);
    // The side stream reads p (if it is one of the buffers) up to now.
    void read_by_side(const void* p, const SideBranch& side);
    // At a pass's end, once the side stream has rejoined: nothing is read.
    void reset();

  private:
    void* buf_[count] = {};
    cudaEvent_t read_[count] = {};
    bool pending_[count] = {};
    std::size_t age_[count] = {}; // when read_by_side last marked it: the oldest read is waited for first
    std::size_t clock_ = 0;
};

} // namespace dstk::train::cuda
