#include "dstk/bench/measure.hpp"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <stdexcept>

#include "dstk/signals.hpp"

namespace dstk::bench {

double now_seconds() {
    return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

std::vector<double> time_repetitions(const RepeatPolicy& policy, const std::function<void()>& prepare,
                                     const std::function<double()>& run_once) {
    const unsigned at_least = std::max(1u, policy.repetitions);
    const unsigned at_most = std::max(at_least, policy.max_repetitions);
    if (prepare) prepare();
    run_once(); // warm-up: first-touch allocation, lazy initialisation, readahead state
    std::vector<double> seconds;
    double total = 0;
    while (seconds.size() < at_least || (total < policy.min_time && seconds.size() < at_most)) {
        throw_if_interrupted();
        if (prepare) prepare();
        const double s = run_once();
        seconds.push_back(s);
        total += s;
    }
    return seconds;
}

double percentile(std::vector<double> values, double p) {
    if (values.empty()) throw std::invalid_argument("percentile of no values");
    std::sort(values.begin(), values.end());
    const double rank = std::ceil(std::clamp(p, 0.0, 100.0) / 100.0 * double(values.size()));
    const std::size_t i = rank < 1 ? 0 : std::min(values.size() - 1, std::size_t(rank) - 1);
    return values[i];
}

Metric summarize(std::vector<double> values, std::string unit) {
    if (values.empty()) throw std::invalid_argument("summary of no values");
    std::sort(values.begin(), values.end());
    Metric m;
    m.unit = std::move(unit);
    const std::size_t n = values.size();
    m.median = n % 2 ? values[n / 2] : 0.5 * (values[n / 2 - 1] + values[n / 2]);
    m.min = values.front();
    m.max = values.back();
    return m;
}

Metric rate_metric(double amount, const std::vector<double>& seconds, std::string unit) {
    std::vector<double> rates;
    rates.reserve(seconds.size());
    for (double s : seconds) rates.push_back(s > 0 ? amount / s : 0.0);
    return summarize(std::move(rates), std::move(unit));
}

} // namespace dstk::bench
