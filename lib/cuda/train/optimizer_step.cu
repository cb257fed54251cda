// The optimiser updates (SGD, AdamW) with the learning-rate schedule on the
// device, and the step counter.
#include "optimizer_step.hpp"

#include "launch_common.cuh"

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

template <class C>
__device__ __forceinline__ void refresh_copy(const std::uint32_t* inv, C* copy, std::uint64_t i, float v) {
    if (inv) {
        const std::uint32_t j = inv[i];
        if (j != ~0u) st(copy, j, v);
    }
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

template <class C>
__global__ void sgd_kernel(OptimizerConfig o, float* p, const float* g, float* m, std::uint64_t count,
                           const StepScalars* sc, const std::uint32_t* inv, C* copy, unsigned long long* advance) {
    if (advance && blockIdx.x == 0 && threadIdx.x == 0) *advance += 1;
    const float lr = sc->lr;
    GRID_LOOP(i, count) {
        const float pi = p[i];
        const float gi = g[i] + o.weight_decay * pi;
        const float mi = o.momentum * m[i] + gi;
        m[i] = mi;
        const float np = pi - lr * (o.nesterov ? gi + o.momentum * mi : mi);
        p[i] = np;
        refresh_copy(inv, copy, i, np);
    }
}

template <class C>
__global__ void adamw_kernel(OptimizerConfig o, float* p, const float* g, float* m, float* v, std::uint64_t count,
                             const StepScalars* sc, const std::uint32_t* inv, C* copy, unsigned long long* advance) {
    if (advance && blockIdx.x == 0 && threadIdx.x == 0) *advance += 1;
    const float lr = sc->lr, c1 = sc->c1, c2 = sc->c2;
    const float decay = 1.0f - lr * o.weight_decay;
    GRID_LOOP(i, count) {
        const float gi = g[i];
        const float mi = o.beta1 * m[i] + (1.0f - o.beta1) * gi;
        const float vi = o.beta2 * v[i] + (1.0f - o.beta2) * gi * gi;
        m[i] = mi;
        v[i] = vi;
        const float np = p[i] * decay - lr * (mi / c1) / (sqrtf(vi / c2) + o.eps);
        p[i] = np;
        refresh_copy(inv, copy, i, np);
    }
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

void launch_optimizer(const OptimizerConfig& o, float* params, const float* grads, float* slots, std::uint64_t count,
                      ParamRange r, const StepScalars* sc, const std::uint32_t* inv, void* copy, ActType copy_t,
                      unsigned long long* advance, cudaStream_t s) {
    if (r.end <= r.begin) {
        if (advance) launch_advance_step(advance, s);
        return;
    }
    const std::uint64_t b0 = r.begin, len = r.end - r.begin;
    const unsigned b = blocks_for(len, 4);
    const std::uint32_t* iv = inv ? inv + b0 : nullptr;
    dispatch(copy_t, [&](auto tag) {
        using T = DSTK_T;
        T* c = static_cast<T*>(copy);
        if (o.kind == OptimizerKind::sgd)
            plain_launch(sgd_kernel<T>, b, threads, 0, s, o, params + b0, grads + b0, slots + b0, len, sc, iv, c,
                         advance);
        else
            plain_launch(adamw_kernel<T>, b, threads, 0, s, o, params + b0, grads + b0, slots + b0, slots + count + b0,
                         len, sc, iv, c, advance);
    });
}

} // namespace dstk::train::cuda
