// The optimiser updates (SGD, AdamW) with the learning-rate schedule on the
// device, and the step counter.
#include "optimizer_step.hpp"

#include "launch_common.cuh"
#include "optimizer_update.cuh"

namespace dstk::train::cuda {
namespace {

// learning_rate() of optimizer.cpp, on the device.
__device__ float device_lr(float base, ScheduleConfig s, std::uint64_t step) {
    double lr = base;
    if (s.warmup_steps > 0 && step < s.warmup_steps)
        return static_cast<float>(lr * static_cast<double>(step + 1) / static_cast<double>(s.warmup_steps));
    if (s.kind == ScheduleKind::step) {
        if (s.step_every > 0) lr *= pow(static_cast<double>(s.gamma), static_cast<double>(step / s.step_every));
    } else if (s.kind == ScheduleKind::cosine && s.total_steps > s.warmup_steps) {
        const double t =
            fmin(1.0, static_cast<double>(step - s.warmup_steps) / static_cast<double>(s.total_steps - s.warmup_steps));
        lr *= 0.5 * (1.0 + cos(3.14159265358979323846 * t));
    }
    return static_cast<float>(lr);
}

// The step's scalars, once per step: device_lr's double-precision schedule
// on one thread was a fixed cost of every update kernel, the last of which
// ends the step.
__global__ void step_scalars_kernel(OptimizerConfig o, ScheduleConfig sched, const unsigned long long* step,
                                    StepScalars* out) {
    const float lr = device_lr(o.lr, sched, *step);
    const float t = static_cast<float>(*step + 1);
    *out = {lr, 1.0f - powf(o.beta1, t), 1.0f - powf(o.beta2, t)};
}

// SGD's and AdamW's update over [0, count) (slots m, v: v unused by SGD).
template <class C>
__global__ void update_kernel(OptimizerConfig o, float* p, const float* g, float* m, float* v, std::uint64_t count,
                              const StepScalars* sc, const std::uint32_t* inv, C* copy, unsigned long long* advance) {
    if (advance && blockIdx.x == 0 && threadIdx.x == 0) *advance += 1;
    const StepScalars s = *sc;
    GRID_LOOP(i, count) update_param(o, s, p, m, v, i, g[i], inv, copy);
}

__global__ void advance_step_kernel(unsigned long long* step) {
    *step += 1;
}

void launch_advance_step(unsigned long long* step, cudaStream_t s) {
    plain_launch(advance_step_kernel, 1, 1, 0, s, step);
}

} // namespace

void launch_step_scalars(const OptimizerConfig& o, const ScheduleConfig& sched, const unsigned long long* step,
                         StepScalars* out, cudaStream_t s) {
    plain_launch(step_scalars_kernel, 1, 1, 0, s, o, sched, step, out);
}

void launch_optimizer(const ParamUpdate& u, const float* grads, ParamRange r, cudaStream_t s) {
    if (r.end <= r.begin) {
        if (u.advance) launch_advance_step(u.advance, s);
        return;
    }
    const std::uint64_t b0 = r.begin, len = r.end - r.begin;
    const unsigned b = blocks_for(len, 4);
    const std::uint32_t* iv = u.inv ? u.inv + b0 : nullptr;
    dispatch(u.copy_t, [&](auto tag) {
        using T = DSTK_T;
        float* v = u.o.kind == OptimizerKind::sgd ? nullptr : u.slots + u.count + b0;
        plain_launch(update_kernel<T>, b, threads, 0, s, u.o, u.params + b0, grads + b0, u.slots + b0, v, len, u.sc, iv,
                     static_cast<T*>(u.copy), u.advance);
    });
}

} // namespace dstk::train::cuda
