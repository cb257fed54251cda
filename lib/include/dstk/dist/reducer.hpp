#pragma once
// The collective operations data-parallel training needs, behind one plain
// interface: the MPI implementation (cpu backend, and the bootstrap of NCCL)
// and the NCCL one (cuda backend) both provide it. A trainer given a Reducer
// averages its gradients over the ranks every step; nothing else in the
// trainer knows how many ranks there are.
#include <cstddef>

namespace dstk::dist {

class Reducer {
  public:
    virtual ~Reducer() = default;
    virtual int rank() const = 0;
    virtual int size() const = 0;

    // In place: the element-wise sum over ranks, divided by size(). Host
    // memory; every rank calls it with the same count.
    virtual void average_host(float* data, std::size_t count) = 0;
    // The same on device memory, enqueued on `stream` (a cudaStream_t) without
    // a host synchronisation, so that a CUDA graph can capture it. A reducer
    // without device support throws std::logic_error.
    virtual void average_device(float* data, std::size_t count, void* stream) = 0;
    // In place: rank 0's values to every rank.
    virtual void broadcast_host(float* data, std::size_t count) = 0;
    virtual void broadcast_device(float* data, std::size_t count, void* stream) = 0;
};

} // namespace dstk::dist
