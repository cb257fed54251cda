#pragma once
// What a trainer measures over the batches it trains or evaluates: per head,
// the figures that fit its loss (train/loss.hpp), as sums that add over
// batches and over data-parallel ranks:
//
//   ce           loss (mean cross-entropy), accuracy, top-5 accuracy (a
//                sample with a NaN or Inf output is never right)
//   mse          loss (= MSE), R^2 and Pearson r: per output, then the mean over
//                the outputs whose target (and, for r, prediction) varies
//   poisson,     loss (NLL without its constant: rate - y log rate), and the
//   poisson-exp  fraction of the Poisson deviance explained against a
//                mean-rate baseline, 1 - D(model) / D(mean rate), per output then
//                averaged, with D = 2 sum(y log(y / rate) - (y - rate)) and the
//                baseline's rate each output's mean target over the samples
//                measured; Pearson r of rate and count as for mse
//   bce          loss, accuracy of the 0/1 decisions (output > 0 against
//                target > 0.5; a NaN or Inf output is never right), Pearson r
//                of sigmoid(output) and target
// The reported total loss is the heads' losses weighted and summed.
#include <cstdint>
#include <string>
#include <vector>

#include "dstk/train/loss.hpp"

namespace dstk::train {

struct HeadMetrics {
    // Rows of `sums`: per output, sums over samples of the target y, y^2, the
    // prediction p (the output, the rate, the probability), p^2, p y, y log y
    // (0 at y = 0) and the loss.
    enum Row : int { row_y, row_yy, row_p, row_pp, row_py, row_ylogy, row_loss, rows };

    std::string name; // "" for the one head of a model without heads(...)
    LossKind kind = LossKind::ce;
    std::uint32_t width = 0; // outputs per sample (classes for ce)
    std::uint64_t samples = 0;
    double loss_sum = 0.0;               // sum over samples of the per-sample loss (no label smoothing)
    std::uint64_t correct = 0, top5 = 0; // ce: samples; bce (correct only): 0/1 decisions
    std::vector<double> sums;            // [rows][width]: every loss but ce

    double loss() const;
    double accuracy() const;      // ce, bce; else 0
    double top5_accuracy() const; // ce; else 0
    double r2() const;            // mean over outputs; NaN where no output's target varies
    double pearson() const;       // mean over outputs; NaN where none varies
    double explained() const;     // poisson kinds: mean fraction of deviance explained; NaN where undefined
    // Whether every output's prediction and loss sums are finite. Where one is
    // not, r2, pearson and explained are NaN for the head: averaging over the
    // other outputs (as over outputs whose target does not vary) would report
    // a diverged model's figures from its surviving outputs.
    bool finite_predictions() const;
    double at(Row r, std::uint32_t output) const { return sums[static_cast<std::size_t>(r) * width + output]; }
};

// A head's figures as reported: key (JSON), label (text) and value, as a
// fraction shown in percent where `percent`. ce: loss, accuracy, top5_accuracy
// (top-5 where the head has more than 5 classes); mse: loss, r2, pearson;
// poisson kinds: loss (the NLL), explained, pearson; bce: loss, accuracy,
// pearson. NaN where undefined (JSON null, text "-").
struct Figure {
    std::string key, label;
    double value = 0.0;
    bool percent = false;
};
std::vector<Figure> figures(const HeadMetrics& m);
// "acc 97.10%  top-5 99.80%", "r2 0.4512  r 0.6731": the figures but the loss.
std::string figures_text(const HeadMetrics& m);

struct Metrics {
    std::uint64_t samples = 0;
    double loss_sum = 0.0; // sum over samples of the heads' weighted per-sample losses
    std::vector<HeadMetrics> heads;

    double loss() const { return samples ? loss_sum / static_cast<double>(samples) : 0.0; }
    // The first head's accuracy (ce, bce), as the epoch line shows it; 0 otherwise.
    double accuracy() const { return heads.empty() ? 0.0 : heads[0].accuracy(); }
    // Adds another measurement of the same heads (an empty one takes the other's shape).
    void add(const Metrics& m);
    // Every count and sum as doubles, for a sum over ranks; unpack() takes such a sum back.
    std::vector<double> pack() const;
    void unpack(const std::vector<double>& v);
};

} // namespace dstk::train
