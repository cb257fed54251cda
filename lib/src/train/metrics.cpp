#include "dstk/train/metrics.hpp"

#include <cmath>
#include <cstdio>
#include <limits>
#include <stdexcept>

#include "dstk/train/trainer.hpp"

namespace dstk::train {
namespace {

constexpr double nan = std::numeric_limits<double>::quiet_NaN();

// The mean over outputs of f(output), skipping outputs where f is NaN; NaN when all are.
template <class F> double mean_over_outputs(std::uint32_t width, F&& f) {
    double sum = 0.0;
    std::uint32_t n = 0;
    for (std::uint32_t j = 0; j < width; ++j) {
        const double v = f(j);
        if (std::isnan(v)) continue;
        sum += v;
        ++n;
    }
    return n ? sum / n : nan;
}

} // namespace

bool HeadMetrics::finite_predictions() const {
    for (const Row r : {row_p, row_pp, row_py, row_loss})
        for (std::uint32_t j = 0; j < width && !sums.empty(); ++j)
            if (!std::isfinite(at(r, j))) return false;
    return true;
}

double HeadMetrics::loss() const {
    return samples ? loss_sum / static_cast<double>(samples) : 0.0;
}

double HeadMetrics::accuracy() const {
    if (!samples) return 0.0;
    if (kind == LossKind::ce) return static_cast<double>(correct) / static_cast<double>(samples);
    if (kind == LossKind::bce) return static_cast<double>(correct) / (static_cast<double>(samples) * width);
    return 0.0;
}

double HeadMetrics::top5_accuracy() const {
    return samples && kind == LossKind::ce ? static_cast<double>(top5) / static_cast<double>(samples) : 0.0;
}

double HeadMetrics::r2() const {
    if (sums.empty() || samples < 2 || !finite_predictions()) return nan;
    const double n = static_cast<double>(samples);
    return mean_over_outputs(width, [&](std::uint32_t j) {
        const double sy = at(row_y, j), sst = at(row_yy, j) - sy * sy / n;
        const double sse = at(row_yy, j) - 2 * at(row_py, j) + at(row_pp, j);
        return sst > 1e-12 * std::max(1.0, at(row_yy, j)) ? 1.0 - sse / sst : nan;
    });
}

double HeadMetrics::pearson() const {
    if (sums.empty() || samples < 2 || !finite_predictions()) return nan;
    const double n = static_cast<double>(samples);
    return mean_over_outputs(width, [&](std::uint32_t j) {
        const double sy = at(row_y, j), sp = at(row_p, j);
        const double vy = n * at(row_yy, j) - sy * sy, vp = n * at(row_pp, j) - sp * sp;
        if (!(vy > 1e-12 * std::max(1.0, n * at(row_yy, j))) || !(vp > 1e-12 * std::max(1.0, n * at(row_pp, j))))
            return nan;
        return (n * at(row_py, j) - sp * sy) / std::sqrt(vy * vp);
    });
}

double HeadMetrics::explained() const {
    if (sums.empty() || samples < 1 || (kind != LossKind::poisson && kind != LossKind::poisson_exp) ||
        !finite_predictions())
        return nan;
    const double n = static_cast<double>(samples);
    return mean_over_outputs(width, [&](std::uint32_t j) {
        const double s = at(row_y, j), ylogy = at(row_ylogy, j);
        if (!(s > 0)) return nan;
        const double d_null = 2 * (ylogy - s * std::log(s / n));
        const double d_model = 2 * (ylogy - s + at(row_loss, j));
        return d_null > 1e-12 * std::max(1.0, s) ? 1.0 - d_model / d_null : nan;
    });
}

std::vector<Figure> figures(const HeadMetrics& m) {
    std::vector<Figure> f{{"loss", "loss", m.loss(), false}};
    switch (m.kind) {
    case LossKind::ce:
        f.push_back({"accuracy", "acc", m.accuracy(), true});
        if (m.width > 5) f.push_back({"top5_accuracy", "top-5", m.top5_accuracy(), true});
        break;
    case LossKind::mse:
        f.push_back({"r2", "r2", m.r2(), false});
        f.push_back({"pearson", "r", m.pearson(), false});
        break;
    case LossKind::poisson:
    case LossKind::poisson_exp:
        f.push_back({"explained", "explained", m.explained(), false});
        f.push_back({"pearson", "r", m.pearson(), false});
        break;
    case LossKind::bce:
        f.push_back({"accuracy", "acc", m.accuracy(), true});
        f.push_back({"pearson", "r", m.pearson(), false});
        break;
    }
    return f;
}

std::string figures_text(const HeadMetrics& m) {
    std::string out;
    char buf[64];
    for (const Figure& f : figures(m)) {
        if (f.key == "loss") continue;
        if (std::isnan(f.value))
            std::snprintf(buf, sizeof buf, "%s -", f.label.c_str());
        else if (f.percent)
            std::snprintf(buf, sizeof buf, "%s %.2f%%", f.label.c_str(), 100 * f.value);
        else
            std::snprintf(buf, sizeof buf, "%s %.4f", f.label.c_str(), f.value);
        out += (out.empty() ? "" : "  ") + std::string(buf);
    }
    return out;
}

void Metrics::add(const Metrics& m) {
    if (heads.empty()) {
        *this = m;
        return;
    }
    if (m.heads.size() != heads.size()) throw std::logic_error("Metrics::add: other heads");
    samples += m.samples;
    loss_sum += m.loss_sum;
    for (std::size_t h = 0; h < heads.size(); ++h) {
        HeadMetrics& a = heads[h];
        const HeadMetrics& b = m.heads[h];
        if (a.sums.size() != b.sums.size()) throw std::logic_error("Metrics::add: other head sizes");
        a.samples += b.samples;
        a.loss_sum += b.loss_sum;
        a.correct += b.correct;
        a.top5 += b.top5;
        for (std::size_t i = 0; i < a.sums.size(); ++i) a.sums[i] += b.sums[i];
    }
}

std::vector<double> Metrics::pack() const {
    std::vector<double> v{static_cast<double>(samples), loss_sum};
    for (const auto& h : heads) {
        v.insert(v.end(), {static_cast<double>(h.samples), h.loss_sum, static_cast<double>(h.correct),
                           static_cast<double>(h.top5)});
        v.insert(v.end(), h.sums.begin(), h.sums.end());
    }
    return v;
}

void Metrics::unpack(const std::vector<double>& v) {
    if (v.size() != pack().size()) throw std::logic_error("Metrics::unpack: other size");
    std::size_t i = 0;
    auto count = [&] { return static_cast<std::uint64_t>(std::llround(v[i++])); };
    samples = count();
    loss_sum = v[i++];
    for (auto& h : heads) {
        h.samples = count();
        h.loss_sum = v[i++];
        h.correct = count();
        h.top5 = count();
        for (auto& s : h.sums) s = v[i++];
    }
}

Metrics empty_metrics(const NetworkPlan& plan) {
    Metrics m;
    for (const auto& h : plan.heads) {
        HeadMetrics hm;
        hm.name = h.name;
        hm.kind = h.target.loss;
        hm.width = h.target.width;
        if (h.target.loss != LossKind::ce) hm.sums.assign(std::size_t{HeadMetrics::rows} * hm.width, 0.0);
        m.heads.push_back(std::move(hm));
    }
    return m;
}

} // namespace dstk::train
