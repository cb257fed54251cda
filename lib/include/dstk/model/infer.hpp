#pragma once
// Running a saved model: `dstrain eval` (loss, accuracy, per-class accuracy,
// confusion matrix over a dataset split) and `dstrain predict` (class and
// probabilities per sample, from a dataset split, a .npy file or a .npy on
// stdin). Both go through the Trainer's evaluation mode (BN running
// statistics, no dropout) on the chosen backend, fed with host batches read
// in order: the same arithmetic as dstrain's test evaluation.
#include <cstdint>
#include <filesystem>
#include <memory>
#include <optional>
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

// The trainer that runs `m` on inputs of `input_dtype`, its state loaded.
class Predictor {
  public:
    Predictor(const SavedModel& m, DType input_dtype, const InferenceOptions& o, const OutputOptions& out);
    ~Predictor();
    std::uint32_t batch() const { return batch_; }
    std::uint32_t classes() const { return classes_; }
    std::uint64_t sample_bytes() const { return sample_bytes_; }
    std::string device() const;
    // Logits [n][classes] of n <= batch() samples (host memory, C order, the
    // input dtype). With labels, the loss is accumulated for take_metrics().
    std::vector<float> logits(const void* x, std::uint32_t n, const std::int32_t* labels = nullptr);
    train::Metrics take_metrics(); // loss and accuracy over the labelled batches since the last call

  private:
    std::unique_ptr<train::Trainer> trainer_;
    std::unique_ptr<train::BackendBuffer> x_, y_;
    std::uint32_t batch_, classes_;
    std::uint64_t sample_bytes_;
    std::vector<std::int32_t> zeros_;
};

struct EvalReport {
    std::string model, dataset, split, device;
    std::uint32_t classes = 0;
    std::uint64_t samples = 0, correct = 0;
    double loss = 0;
    std::vector<std::uint64_t> confusion; // [true class][predicted class]
    double accuracy() const { return samples ? static_cast<double>(correct) / static_cast<double>(samples) : 0.0; }
};

EvalReport evaluate_model(const SavedModel& m, const std::filesystem::path& dataset, const std::string& split,
                          const InferenceOptions& o, const OutputOptions& out);
std::string eval_report_text(const EvalReport& r);
std::string eval_report_json(const EvalReport& r);

struct PredictOptions {
    std::filesystem::path input; // dataset directory, .npy file, or "-" (a .npy on stdin)
    std::string split = "test";  // for a dataset
    std::filesystem::path
        output; // empty or "-": JSON lines on stdout; *.npy: probabilities [N, classes] f32; else JSON lines
    bool force = false;
};
// Returns the number of samples predicted.
std::uint64_t predict(const SavedModel& m, const PredictOptions& p, const InferenceOptions& o,
                      const OutputOptions& out);

} // namespace dstk::model
