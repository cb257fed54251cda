#pragma once
// How every dsbench figure is taken: one untimed warm-up, then timed
// repetitions (at least `repetitions`, more until `min_time` seconds have been
// timed, never more than max_repetitions), each preceded by an untimed
// prepare step (dropping caches, migrating managed memory back to the host).
// Figures are the median over repetitions, with the slowest and fastest.
#include <cstdint>
#include <functional>
#include <vector>

#include "dstk/bench/results.hpp"

namespace dstk::bench {

struct RepeatPolicy {
    unsigned repetitions = 5;
    double min_time = 0.5; // seconds of timed repetitions, at least
    unsigned max_repetitions = 50;
};

// run_once returns the seconds it measured (GPU cases time with CUDA events;
// host cases with the steady clock). Returns the seconds of each timed repetition.
std::vector<double> time_repetitions(const RepeatPolicy& policy, const std::function<void()>& prepare,
                                     const std::function<double()>& run_once);

// Median, slowest and fastest of `values`; `values` must not be empty.
Metric summarize(std::vector<double> values, std::string unit);
// `amount` units of work per repetition over these timings: amount / seconds per repetition.
Metric rate_metric(double amount, const std::vector<double>& seconds, std::string unit);
// The p-th percentile (0..100, nearest rank) of `values`, which must not be empty.
double percentile(std::vector<double> values, double p);

double now_seconds(); // steady clock

} // namespace dstk::bench
