#include "dstk/train/optimizer.hpp"

#include <cmath>
#include <numbers>
#include <string>

#include "dstk/error.hpp"
#include "dstk/enum_names.hpp"

namespace dstk::train {

namespace {
constexpr EnumNames<OptimizerKind, 2> optimizer_names{{{{OptimizerKind::sgd, "sgd"}, {OptimizerKind::adamw, "adamw"}}}};
constexpr EnumNames<ScheduleKind, 3> schedule_names{
    {{{ScheduleKind::constant, "constant"}, {ScheduleKind::step, "step"}, {ScheduleKind::cosine, "cosine"}}}};
} // namespace

OptimizerKind parse_optimizer(std::string_view name) {
    return optimizer_names.parse(name, "--optimizer");
}

ScheduleKind parse_schedule(std::string_view name) {
    return schedule_names.parse(name, "--schedule");
}

std::string_view optimizer_name(OptimizerKind k) {
    return optimizer_names.name(k);
}

std::string_view schedule_name(ScheduleKind k) {
    return schedule_names.name(k);
}

float learning_rate(const OptimizerConfig& o, const ScheduleConfig& s, std::uint64_t step) {
    double lr = o.lr;
    if (s.warmup_steps > 0 && step < s.warmup_steps)
        return static_cast<float>(lr * static_cast<double>(step + 1) / static_cast<double>(s.warmup_steps));
    switch (s.kind) {
    case ScheduleKind::constant:
        break;
    case ScheduleKind::step:
        if (s.step_every > 0) lr *= std::pow(static_cast<double>(s.gamma), static_cast<double>(step / s.step_every));
        break;
    case ScheduleKind::cosine:
        if (s.total_steps > s.warmup_steps) {
            const double t = std::min(1.0, static_cast<double>(step - s.warmup_steps) /
                                               static_cast<double>(s.total_steps - s.warmup_steps));
            lr *= 0.5 * (1.0 + std::cos(std::numbers::pi * t));
        }
        break;
    }
    return static_cast<float>(lr);
}

void sgd_update(const OptimizerConfig& o, float lr, std::span<float> p, std::span<const float> g, std::span<float> m) {
    const float mu = o.momentum, wd = o.weight_decay;
    for (std::size_t i = 0; i < p.size(); ++i) {
        const float gi = g[i] + wd * p[i];
        const float mi = mu * m[i] + gi;
        m[i] = mi;
        p[i] -= lr * (o.nesterov ? gi + mu * mi : mi);
    }
}

void adamw_update(const OptimizerConfig& o, float lr, std::uint64_t t, std::span<float> p, std::span<const float> g,
                  std::span<float> m, std::span<float> v) {
    const float b1 = o.beta1, b2 = o.beta2;
    const float c1 = 1.0f - std::pow(b1, static_cast<float>(t)), c2 = 1.0f - std::pow(b2, static_cast<float>(t));
    const float decay = 1.0f - lr * o.weight_decay;
    for (std::size_t i = 0; i < p.size(); ++i) {
        const float gi = g[i];
        const float mi = b1 * m[i] + (1.0f - b1) * gi;
        const float vi = b2 * v[i] + (1.0f - b2) * gi * gi;
        m[i] = mi;
        v[i] = vi;
        p[i] = p[i] * decay - lr * (mi / c1) / (std::sqrt(vi / c2) + o.eps);
    }
}

} // namespace dstk::train
