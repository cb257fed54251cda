#pragma once
// dstrain's loop for a dataset held whole in the backend's memory (host for
// cpu, GPU for cuda): load, plan, train epoch by epoch, evaluate, report.
// Streaming placements build on Trainer directly (trainer.hpp).
#include <cstdint>
#include <filesystem>
#include <optional>
#include <string>
#include <vector>

#include "dstk/output.hpp"
#include "dstk/train/trainer.hpp"

namespace dstk::train {

struct RunOptions {
    std::filesystem::path dataset;
    std::string model = "ref-cnn";
    std::uint32_t epochs = 5;
    std::uint32_t batch = 256;
    std::optional<float> lr; // default: 0.05 sgd, 0.002 adamw (times batch/256 for sgd)
    OptimizerKind optimizer = OptimizerKind::sgd;
    float momentum = 0.9f;
    bool nesterov = true;
    float weight_decay = 5e-4f;
    ScheduleKind schedule = ScheduleKind::cosine;
    double warmup_epochs = 0.0;
    std::uint32_t step_epochs = 0; // step schedule: decay every step_epochs epochs
    float gamma = 0.1f;
    float label_smoothing = 0.0f;
    std::optional<Precision> precision; // default tf32 on cuda
    std::optional<Device> device;       // default: cuda:0 when a GPU is there, else cpu
    std::uint64_t seed = 0;
    unsigned threads = 0;
    std::uint64_t workspace = std::uint64_t{256} << 20;
    bool deterministic = false;                 // cuda: deterministic cuDNN algorithms and kernels only (TrainerConfig)
    KernelMode kernels = KernelMode::automatic; // cuda: --kernels (TrainerConfig::kernels)
    std::string log_json;                       // JSON lines, one per epoch
    std::string command_line;
};

struct EpochReport {
    std::uint32_t epoch = 0;
    Metrics train, test;
    double seconds = 0.0, train_seconds = 0.0, samples_per_second = 0.0;
    float lr = 0.0f;
};

struct RunReport {
    std::string model, device, precision;
    std::uint64_t parameters = 0;
    MemoryPlan planned;
    std::uint64_t measured_device_bytes = 0;
    // The data path's GPU memory ceiling (cuda): runtime overhead measured
    // after the warm-up + planned buffers (planned.total() + data); the peak
    // measured over the run, and how it was measured.
    std::uint64_t memory_ceiling = 0, runtime_overhead = 0, data_device_bytes = 0, peak_device_bytes = 0;
    std::string memory_method;
    std::vector<EpochReport> epochs;
};

// Throws Error: usage (bad options or model), no_fit (no GPU), failure
// (non-finite loss, naming epoch and step; I/O).
RunReport run_training(const RunOptions& options, const OutputOptions& out);

std::string run_report_json(const RunReport& r); // --json document

} // namespace dstk::train
