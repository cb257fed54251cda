#pragma once
// The optimiser's launchers (optimizer_step.cu). Everything runs on the given
// stream and is safe to capture in a graph.
#include <cuda_runtime.h>

#include <cstdint>

#include "act_type.hpp"
#include "dstk/train/optimizer.hpp"

namespace dstk::train::cuda {

// One optimiser step over the flat fp32 parameters; the learning rate is
// computed on the device from *step (so a captured graph stays valid), then
// launch_advance_step increments it. Where inv[i] != ~0u the updated parameter
// is also written to copy[inv[i]] (type copy_t): the compute copies stay fresh
// without another pass.
void launch_optimizer(const OptimizerConfig& o, const ScheduleConfig& sched, float* params, const float* grads,
                      float* slots, std::uint64_t count, const unsigned long long* step, const std::uint32_t* inv,
                      void* copy, ActType copy_t, cudaStream_t s);
void launch_advance_step(unsigned long long* step, cudaStream_t s);

} // namespace dstk::train::cuda
