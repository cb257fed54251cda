#pragma once
// A dstrain run: dataset -> batch sources -> Trainer, with epochs, evaluation,
// the GPU memory ceiling, per-stage timing, checkpoints, interruption and
// resume. tools/dstrain/main.cpp parses into TrainRunOptions (through
// add_train_run_options) and calls run_training.
#include <cstdint>
#include <filesystem>
#include <string>

#include <CLI/CLI.hpp>

#include "dstk/output.hpp"

namespace dstk::data {

struct TrainRunOptions {
    std::filesystem::path dataset;
    // Model and optimisation (the engine's options).
    std::string model = "ref-cnn";
    std::uint64_t epochs = 10;
    std::uint32_t batch = 256;
    std::string optimizer = "sgd";
    float lr = 0.05f, momentum = 0.9f, weight_decay = 5e-4f, label_smoothing = 0.0f;
    std::string schedule = "cosine";
    std::uint64_t warmup_steps = 0;
    std::string precision = "tf32";
    std::string device; // empty: cuda:0 when a GPU is usable, else cpu with a notice
    std::uint64_t seed = 0;
    unsigned cpu_threads = 0;
    // Data path.
    std::string data = "auto";       // auto | device | stream | managed
    std::string order = "chunk";     // sequential | chunk | full
    std::uint64_t window = 8;        // chunk order: chunks mixed together
    std::uint64_t chunk_samples = 0; // chunk order on .npy storage (0: about 4 MiB of samples)
    unsigned prefetch = 4;           // ring slots
    unsigned readers = 2;            // reader threads
    std::string managed_policy = "prefetch";
    bool oversubscribe = false;
    // Evaluation, checkpoints, logs.
    std::uint64_t eval_every = 0;       // steps; 0: after each epoch
    std::filesystem::path checkpoint;   // directory; empty: none
    std::uint64_t checkpoint_every = 0; // steps; 0: after each epoch
    bool resume = false;
    std::filesystem::path log_json;     // JSON lines, one per epoch / evaluation
    std::uint64_t stop_after_steps = 0; // stop (with a checkpoint) after this many steps in total; 0: never
    std::string command_line;
    OutputOptions out;
};

// Adds every option above (except command_line/out) to `app`.
void add_train_run_options(CLI::App& app, TrainRunOptions& o);
void run_training(const TrainRunOptions& o);

} // namespace dstk::data
