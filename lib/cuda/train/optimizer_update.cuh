#pragma once
// One parameter's optimiser update on the device (SGD with momentum, AdamW),
// shared by the update kernels (optimizer_step.cu) and the kernels that
// update a parameter as they finish its gradient (ParamUpdate): one body of
// arithmetic, so the same bits either way.
#include "device_common.cuh"
#include "optimizer_step.hpp"

namespace dstk::train::cuda {

template <class C>
__device__ __forceinline__ void refresh_copy(const std::uint32_t* inv, C* copy, std::uint64_t i, float v) {
    if (inv) {
        const std::uint32_t j = inv[i];
        if (j != ~0u) st(copy, j, v);
    }
}

// Parameter i of p (m, v: its optimiser slots; v unused by SGD) after the
// gradient g, its compute copy refreshed where inv has one. Every product
// and sum is spelled out (fused where it says fma): left to the compiler,
// AdamW's sums of two products were contracted one way in one kernel and
// the other way in another, which broke the same bits.
template <class C>
__device__ __forceinline__ void update_param(const OptimizerConfig& o, const StepScalars& sc, float* p, float* m,
                                             float* v, std::uint64_t i, float g, const std::uint32_t* inv, C* copy) {
    const float pi = p[i];
    float np;
    if (o.kind == OptimizerKind::sgd) {
        const float gi = __fmaf_rn(o.weight_decay, pi, g);
        const float mi = __fmaf_rn(o.momentum, m[i], gi);
        m[i] = mi;
        np = __fmaf_rn(-sc.lr, o.nesterov ? __fmaf_rn(o.momentum, mi, gi) : mi, pi);
    } else {
        const float decay = __fmaf_rn(-sc.lr, o.weight_decay, 1.0f);
        const float mi = __fmaf_rn(o.beta1, m[i], __fmul_rn(1.0f - o.beta1, g));
        const float vi = __fmaf_rn(o.beta2, v[i], __fmul_rn(__fmul_rn(1.0f - o.beta2, g), g));
        m[i] = mi;
        v[i] = vi;
        const float denom = __fadd_rn(__fsqrt_rn(__fdiv_rn(vi, sc.c2)), o.eps);
        np = __fmaf_rn(pi, decay, -__fdiv_rn(__fmul_rn(sc.lr, __fdiv_rn(mi, sc.c1)), denom));
    }
    p[i] = np;
    refresh_copy(inv, copy, i, np);
}

// update_param for ParamUpdate u (parameter i of the flat vector).
template <class C> __device__ __forceinline__ void apply_update(const ParamUpdate& u, std::uint64_t i, float g) {
    update_param(u.o, *u.sc, u.params, u.slots, u.slots + u.count, i, g, u.inv, static_cast<C*>(u.copy));
}

} // namespace dstk::train::cuda
