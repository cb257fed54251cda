#include "head_loss.hpp"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <string>

#include "dstk/error.hpp"

namespace dstk::train {
namespace {

constexpr double poisson_eps = 1e-8; // PyTorch's poisson_nll_loss eps (log_input False)

std::string number_text(double v) {
    char buf[32];
    std::snprintf(buf, sizeof buf, "%g", v);
    return buf;
}

double softmax_xent(const HeadPlan& h, const float* z, const std::int32_t* labels, std::uint32_t n, float eps,
                    float* dz, HeadMetrics& m) {
    const std::uint32_t k = h.target.width;
    const double scale = h.weight / static_cast<double>(n);
    double loss_sum = 0.0;
    for (std::uint32_t s = 0; s < n; ++s) {
        const float* zs = z + std::uint64_t{s} * k;
        const std::int32_t label = labels[s];
        if (label < 0 || static_cast<std::uint32_t>(label) >= k)
            throw runtime_error("label " + std::to_string(label) + " of '" + h.target.field + "' outside [0, " +
                                std::to_string(k) + ") (corrupt labels, or more classes than the model's?)");
        const float zl = zs[label];
        float zmax = zs[0];
        for (std::uint32_t j = 0; j < k; ++j) zmax = std::max(zmax, zs[j]);
        const std::uint32_t rank = label_rank(zs, k, static_cast<std::uint32_t>(label));
        double denom = 0.0;
        for (std::uint32_t j = 0; j < k; ++j) denom += std::exp(static_cast<double>(zs[j] - zmax));
        const double lse = std::log(denom) + zmax;
        loss_sum += lse - zl;
        m.correct += rank == 0;
        m.top5 += rank < 5;
        if (!dz) continue;
        float* g = dz + std::uint64_t{s} * k;
        for (std::uint32_t j = 0; j < k; ++j) {
            const double p = std::exp(static_cast<double>(zs[j]) - lse);
            const double q = (j == static_cast<std::uint32_t>(label) ? 1.0 - eps : 0.0) + eps / k;
            g[j] = static_cast<float>((p - q) * scale);
        }
    }
    return loss_sum;
}

// Loss, gradient with respect to z, and prediction of one output.
struct Element {
    double loss, grad, pred;
};

Element element(LossKind kind, double z, double y) {
    switch (kind) {
    case LossKind::mse:
        return {(z - y) * (z - y), 2 * (z - y), z};
    case LossKind::poisson: {
        const double rate = z > 20 ? z : std::log1p(std::exp(z)), sig = 1 / (1 + std::exp(-z));
        return {rate - y * std::log(rate + poisson_eps), sig * (1 - y / (rate + poisson_eps)), rate};
    }
    case LossKind::poisson_exp: {
        const double rate = std::exp(z);
        return {rate - y * z, rate - y, rate};
    }
    case LossKind::bce: {
        const double sig = 1 / (1 + std::exp(-z));
        return {std::max(z, 0.0) - z * y + std::log1p(std::exp(-std::abs(z))), sig - y, sig};
    }
    case LossKind::ce:
        break;
    }
    return {0, 0, 0};
}

double regression(const HeadPlan& h, const float* z, const float* y, std::uint32_t n, float* dz, HeadMetrics& m) {
    const std::uint32_t k = h.target.width;
    const double scale = h.weight / (static_cast<double>(n) * k);
    auto row = [&](HeadMetrics::Row r, std::uint32_t j) -> double& {
        return m.sums[static_cast<std::size_t>(r) * k + j];
    };
    double loss_sum = 0.0;
    for (std::uint32_t s = 0; s < n; ++s) {
        double sample = 0.0;
        for (std::uint32_t j = 0; j < k; ++j) {
            const std::uint64_t e = std::uint64_t{s} * k + j;
            const double yv = y[e];
            if (h.target.loss == LossKind::bce && yv != 0 && yv != 1)
                throw runtime_error("target " + number_text(yv) + " of '" + h.target.field + "' (output " +
                                    std::to_string(j) +
                                    ") is neither 0 nor 1, as the loss bce needs (class labels? choose ce; "
                                    "other values: mse)");
            const Element el = element(h.target.loss, z[e], yv);
            sample += el.loss;
            if (dz) dz[e] = static_cast<float>(el.grad * scale);
            row(HeadMetrics::row_y, j) += yv;
            row(HeadMetrics::row_yy, j) += yv * yv;
            row(HeadMetrics::row_p, j) += el.pred;
            row(HeadMetrics::row_pp, j) += el.pred * el.pred;
            row(HeadMetrics::row_py, j) += el.pred * yv;
            row(HeadMetrics::row_ylogy, j) += yv > 0 ? yv * std::log(yv) : 0.0;
            row(HeadMetrics::row_loss, j) += el.loss;
            // A non-finite output decides nothing (NaN > 0 is false, which would read as a right "no").
            if (h.target.loss == LossKind::bce) m.correct += std::isfinite(z[e]) && (z[e] > 0) == (yv > 0.5);
        }
        loss_sum += sample / k;
    }
    return loss_sum;
}

} // namespace

std::uint32_t label_rank(const float* z, std::uint32_t k, std::uint32_t label) {
    const float zl = z[label];
    std::uint32_t rank = 0;
    for (std::uint32_t j = 0; j < k; ++j) {
        if (!std::isfinite(z[j])) return unranked;
        rank += z[j] > zl || (z[j] == zl && j < label);
    }
    return rank;
}

double head_loss(const HeadPlan& h, const float* z, const std::int32_t* labels, const float* y, std::uint32_t n,
                 float smoothing, float* dz, HeadMetrics& m) {
    const double sum =
        h.target.loss == LossKind::ce ? softmax_xent(h, z, labels, n, smoothing, dz, m) : regression(h, z, y, n, dz, m);
    m.samples += n;
    m.loss_sum += sum;
    return sum;
}

} // namespace dstk::train
