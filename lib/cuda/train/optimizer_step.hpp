#pragma once
// The optimiser's launchers (optimizer_step.cu). Everything runs on the given
// stream and is safe to capture in a graph.
#include <cuda_runtime.h>

#include <cstdint>

#include "act_type.hpp"
#include "dstk/train/optimizer.hpp"

namespace dstk::train::cuda {

// What an optimiser step needs of the step count: the learning rate (the
// schedule's, at *step) and AdamW's bias corrections. launch_step_scalars
// computes them on the device from *step (so a captured graph stays valid),
// once per step before the updates; the last update then increments it.
struct StepScalars {
    float lr, c1, c2;
};
void launch_step_scalars(const OptimizerConfig& o, const ScheduleConfig& sched, const unsigned long long* step,
                         StepScalars* out, cudaStream_t s);

// An optimiser step's update of the flat fp32 parameters (`count` of them,
// slots after each other: m, then v for AdamW). Where inv[i] != ~0u the
// updated parameter is also written to copy[inv[i]] (type copy_t): the
// compute copies stay fresh without another pass. advance (or null): the
// step count, incremented by the same launch (the step's last update;
// launch_step_scalars has read it by then).
//
// launch_optimizer applies it to a range of parameters from their gradients.
// A kernel that finishes a gradient applies the same update as it stores it
// (the weight gradients' fixed-order sums, elementwise.hpp, with a map; the
// first batch norm's backward, first_bn.hpp): parameter i is updated the
// moment its gradient is summed, with the same arithmetic
// (optimizer_update.cuh), so the same bits, and no update kernel of its own
// follows at the end of the step. params null: no update.
struct ParamUpdate {
    OptimizerConfig o{};
    float* params = nullptr;
    float* slots = nullptr;
    std::uint64_t count = 0;
    const StepScalars* sc = nullptr;
    const std::uint32_t* inv = nullptr;
    void* copy = nullptr;
    ActType copy_t = ActType::f32;
    unsigned long long* advance = nullptr;
};

// The update of the parameters [r.begin, r.end) from their gradients: a
// step may update the parameters whose gradients are complete while the
// last weight gradients are still being computed, and the rest after.
struct ParamRange {
    std::uint64_t begin = 0, end = 0;
};
void launch_optimizer(const ParamUpdate& u, const float* grads, ParamRange r, cudaStream_t s);

} // namespace dstk::train::cuda
