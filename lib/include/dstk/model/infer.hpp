#pragma once
// Running a saved model: `dstrain eval` (every head's loss and metrics, and
// for classes the accuracy per class and the confusion matrix, over a
// dataset split) and `dstrain predict` (every head's prediction per sample,
// from a dataset split, a .npy file or a .npy on stdin). Both go through the
// Trainer's evaluation mode (BN running statistics, no dropout) on the chosen
// backend, fed with host batches read in order: the same arithmetic as
// dstrain's test evaluation.
#include <cstdint>
#include <filesystem>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "dstk/model/saved_model.hpp"
#include "dstk/output.hpp"
#include "dstk/train/trainer.hpp"

namespace dstk::model {

struct InferenceOptions {
    std::optional<train::Device> device;       // default: cuda:0 when a GPU is present, else cpu
    std::optional<train::Precision> precision; // default: the precision the model was trained in (cpu: fp32)
    std::uint32_t batch = 256;
    unsigned threads = 0; // cpu backend
};

// The dtypes of the data a Predictor is fed: the input's, each head's target
// (empty: the model's own, for batches without targets), the side input's
// (none: the model's).
struct DataTypes {
    DType input = DType::f32;
    std::vector<DType> targets;
    std::optional<DType> side;
};

// The trainer that runs `m` on host batches of its fields, its state loaded.
class Predictor {
  public:
    Predictor(const SavedModel& m, const DataTypes& types, const InferenceOptions& o, const OutputOptions& out);
    ~Predictor();
    std::uint32_t batch() const { return batch_; }
    const train::TrainerConfig& config() const;
    std::string device() const;
    // Each head's outputs [n][width] (C order) for n <= batch() samples.
    // data[i]: the host bytes of train::batch_fields(config())[i], or null for
    // a target not given (zeros; the metrics of such a batch are meaningless).
    std::vector<std::vector<float>> outputs(std::span<const void* const> data, std::uint32_t n);
    train::Metrics take_metrics(); // over the batches since the last call

  private:
    std::unique_ptr<train::Trainer> trainer_;
    std::vector<std::unique_ptr<train::BackendBuffer>> buffers_; // one per batch field
    std::vector<std::uint8_t> zeros_;
    std::uint32_t batch_;
};

// Classes above which eval leaves out the per-class table and the confusion
// matrix unless asked (EvalOptions::confusion).
inline constexpr std::uint32_t confusion_limit = 50;

struct EvalHead {
    std::string name, target; // name "" for a model without heads(...)
    train::HeadMetrics metrics;
    std::vector<std::uint64_t> class_samples, class_correct; // ce: per true class
    std::vector<std::uint64_t> confusion;                    // ce, where shown: [true class][predicted class]
};

struct EvalReport {
    std::string model, dataset, split, device;
    std::uint64_t samples = 0;
    double loss = 0; // the heads' weighted total
    std::vector<EvalHead> heads;
};

// `confusion`: per-class table and matrix whatever the number of classes.
EvalReport evaluate_model(const SavedModel& m, const std::filesystem::path& dataset, const std::string& split,
                          const InferenceOptions& o, const OutputOptions& out, bool confusion = false);
std::string eval_report_text(const EvalReport& r);
std::string eval_report_json(const EvalReport& r);

struct PredictOptions {
    std::filesystem::path input; // dataset directory, .npy file, or "-" (a .npy on stdin)
    std::string split = "test";  // for a dataset
    // empty or "-": JSON lines on stdout; *.npy: each head's predictions [N, width] f32 (one head: this file;
    // several: FILE.HEAD.npy each); else JSON lines
    std::filesystem::path output;
    std::filesystem::path side; // a .npy of side inputs [N, values] beside a .npy input
    bool force = false;
};
// Returns the number of samples predicted.
std::uint64_t predict(const SavedModel& m, const PredictOptions& p, const InferenceOptions& o,
                      const OutputOptions& out);

} // namespace dstk::model
