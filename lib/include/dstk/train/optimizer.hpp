#pragma once
// Optimisers and learning-rate schedules. Parameters, gradients and optimiser
// slots are flat float vectors (NetworkPlan order); the CUDA kernels apply the
// same formulas as sgd_update / adamw_update below, which are the reference.
#include <cstdint>
#include <span>
#include <string_view>

namespace dstk::train {

enum class OptimizerKind : std::uint8_t { sgd, adamw };
enum class ScheduleKind : std::uint8_t { constant, step, cosine };

OptimizerKind parse_optimizer(std::string_view name); // usage error if unknown
ScheduleKind parse_schedule(std::string_view name);
std::string_view optimizer_name(OptimizerKind k);
std::string_view schedule_name(ScheduleKind k);

struct OptimizerConfig {
    OptimizerKind kind = OptimizerKind::sgd;
    float lr = 0.05f;
    float momentum = 0.9f;                           // sgd
    bool nesterov = true;                            // sgd
    float weight_decay = 5e-4f;                      // sgd: added to the gradient (PyTorch); adamw: decoupled
    float beta1 = 0.9f, beta2 = 0.999f, eps = 1e-8f; // adamw

    // Float slots per parameter: momentum (sgd), first and second moments (adamw).
    unsigned slots() const { return kind == OptimizerKind::sgd ? 1u : 2u; }
};

struct ScheduleConfig {
    ScheduleKind kind = ScheduleKind::cosine;
    std::uint64_t total_steps = 0;  // cosine decays to 0 at total_steps
    std::uint64_t warmup_steps = 0; // linear warm-up from lr/warmup to lr
    std::uint64_t step_every = 0;   // step: multiply by gamma every step_every steps
    float gamma = 0.1f;
};

// Learning rate for step `step` (0-based).
float learning_rate(const OptimizerConfig& o, const ScheduleConfig& s, std::uint64_t step);

// PyTorch SGD: g += wd*p; m = mu*m + g; p -= lr*(nesterov ? g + mu*m : m).
void sgd_update(const OptimizerConfig& o, float lr, std::span<float> params, std::span<const float> grads,
                std::span<float> momentum);
// AdamW with bias correction; `t` is the 1-based step count.
void adamw_update(const OptimizerConfig& o, float lr, std::uint64_t t, std::span<float> params,
                  std::span<const float> grads, std::span<float> m, std::span<float> v);

} // namespace dstk::train
