#pragma once
// NCCL, the engine that reduces gradients between GPUs (one process per GPU):
// the cuda backend's Reducer. The processes are started by the cluster's
// launcher and bootstrapped by MPI: rank 0 makes the unique id, MPI
// broadcasts it, every rank then builds its reducer with it. No CUDA or NCCL
// type crosses this header; a build without NCCL still links it and says so.
#include <array>
#include <cstddef>
#include <memory>

#include "dstk/dist/reducer.hpp"

namespace dstk::dist {

// Whether this build has NCCL (false without CUDA or without NCCL found at
// build time).
bool nccl_available();

// The bytes of a fresh ncclUniqueId, made on rank 0 and sent to the others.
// Throws dstk::Error (no_fit) when the build has no NCCL.
using NcclId = std::array<std::byte, 128>;
NcclId nccl_unique_id();

// This rank's communicator on GPU `device` (every rank calls it with the same
// id and size). Creation that does not complete within timeout_s seconds (a
// rank that never arrives, an unreachable peer) is aborted and reported as a
// runtime error naming this rank, never a hang. The reducer's device
// operations run on the stream they are given; they are capturable in a CUDA
// graph once one collective has run outside it (connections are set up
// lazily). average_* multiplies the sum by 1/size() after the all-reduce (as
// the MPI reducer does), skipped for size 1 so that one rank's values come
// back bit for bit.
std::unique_ptr<Reducer> make_nccl_reducer(const NcclId& id, int rank, int size, int device, double timeout_s);

} // namespace dstk::dist
