#pragma once
// A dstrain run over the data path: dataset -> BatchSource (device, stream or
// managed placement; sequential, chunk or full order) -> Trainer, with the
// GPU memory ceiling, per-stage timing, evaluation every epoch or N steps,
// checkpoints, SIGINT/SIGTERM handling and resume. The engine's options are
// train::RunOptions (dstk/train/run.hpp); the data path adds DataRunOptions.
#include <cstdint>
#include <filesystem>
#include <map>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>

#include "dstk/model/run_model.hpp"
#include "dstk/output.hpp"
#include "dstk/train/run.hpp"

namespace dstk::data {

struct DataRunOptions {
    std::string data = "auto";       // auto | device | stream | managed
    std::string order = "chunk";     // sequential | chunk | full
    std::uint64_t window = 8;        // chunk order: chunks mixed together
    std::uint64_t chunk_samples = 0; // chunk order on .npy storage (0: about 4 MiB of samples)
    unsigned prefetch = 4;           // stream: ring slots; managed: batches prefetched ahead
    unsigned readers = 2;            // stream: reader threads
    bool prefetch_given = false;     // --prefetch / --readers typed: they win over --bench
    bool readers_given = false;
    std::filesystem::path bench; // dsbench results: K and readers from its figures (data/tuning.hpp)
    bool direct = false;         // stream: O_DIRECT reads of the inputs
    std::string managed_policy = "prefetch";
    bool oversubscribe = false;
    std::uint64_t eval_every = 0;       // steps; 0: after each epoch
    std::filesystem::path checkpoint;   // directory; empty: none
    std::uint64_t checkpoint_every = 0; // steps; 0: at the end of each epoch only
    bool resume = false;
    std::uint64_t max_steps = 0; // stop after this many steps in total, with a checkpoint; 0: no limit
    model::ModelRunOptions model; // --save, --init-from, --force
    std::map<std::string, std::vector<std::string>> recorded_options; // what checkpoints record (resume_options)
};

// Adds --data --order --window --chunk-samples --prefetch --readers --bench
// --direct --managed-policy --oversubscribe --eval-every --checkpoint
// --checkpoint-every --resume --max-steps to `app`.
void add_data_run_options(CLI::App& app, DataRunOptions& d);

// Throws Error: usage (options, empty split, batch larger than the split,
// resume with other options), no_fit (no GPU, managed split too large),
// failure (I/O, bad chunk, divergence: the last checkpoint is kept),
// interrupted (after SIGINT/SIGTERM: the step finished and, with
// --checkpoint, a checkpoint written).
train::RunReport run_training(const train::RunOptions& e, const DataRunOptions& d, const OutputOptions& out);

} // namespace dstk::data
