#pragma once
// dstrain's options: what to train and how (TrainOptions), and how the data
// reaches the trainer (DataOptions). main.cpp declares the first set, which it
// parses from strings; add_data_options declares the second.
#include <cstdint>
#include <filesystem>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "dstk/cli_fwd.hpp"
#include "dstk/model/run_model.hpp"
#include "dstk/train/trainer.hpp"

namespace dstk::run {

struct TrainOptions {
    std::filesystem::path dataset;               // the first of datasets
    std::vector<std::filesystem::path> datasets; // DATASET...: one directory, or a mix (run/mix_run.hpp)
    std::string model = "ref-cnn";
    std::string input;                   // the input field; empty: the dataset's input role
    std::string label;                   // the target of a model without heads(...); empty: the dataset's label role
    std::optional<train::LossKind> loss; // its loss; default: by the label's dtype (train::default_loss)
    std::string side_input;              // a field joined to the flat features before the head(s); empty: none
    std::uint32_t epochs = 5;
    std::uint32_t batch = 256; // per rank; the global batch is ranks x batch
    bool batch_given = false;  // typed on this command line (a resume at another rank count derives it otherwise)
    std::optional<float> lr;   // default: 0.05 sgd, 0.002 adamw (times batch/256 for sgd)
    train::OptimizerKind optimizer = train::OptimizerKind::sgd;
    float momentum = 0.9f;
    bool nesterov = true;
    float weight_decay = 5e-4f;
    train::ScheduleKind schedule = train::ScheduleKind::cosine;
    double warmup_epochs = 0.0;
    std::uint32_t step_epochs = 0; // step schedule: decay every step_epochs epochs
    float gamma = 0.1f;
    float label_smoothing = 0.0f;
    std::optional<train::Precision> precision; // default tf32 on cuda
    std::optional<train::Device> device;       // default: cuda:0 when a GPU is there, else cpu
    std::uint64_t seed = 0;
    unsigned threads = 0;
    std::uint64_t workspace = std::uint64_t{256} << 20;
    bool deterministic = false; // cuda: deterministic cuDNN algorithms and kernels only (TrainerConfig)
    train::KernelMode kernels = train::KernelMode::automatic; // cuda: --kernels (TrainerConfig::kernels)
    std::string log_json;     // JSON lines: the memory ceiling, then one per epoch (and per --eval-every)
    std::string tensorboard;  // directory for a TensorBoard event file (run/tensorboard_log.hpp); empty: none
    std::string command_line; // recorded in checkpoints
    // The options given on the command line, recorded in checkpoints for
    // --resume (dstk/checkpoint.hpp, resume_options).
    std::map<std::string, std::vector<std::string>> given_options;
    model::ModelRunOptions files; // --save, --init-from, --force
    double dist_timeout = 120.0;  // data parallel: seconds every rank has to reach the start-up rendezvous
};

struct DataOptions {
    std::string data = "auto";       // auto | device | stream | managed
    std::string order = "chunk";     // sequential | chunk | full
    std::uint64_t window = 8;        // chunk order: chunks mixed together
    std::uint64_t chunk_samples = 0; // chunk order on .npy storage (0: about 4 MiB of samples)
    unsigned prefetch = 4;           // stream: ring slots; managed: batches prefetched ahead
    unsigned readers = 2;            // stream: reader threads
    bool prefetch_given = false;     // --prefetch / --readers typed: they win over --bench
    bool readers_given = false;
    std::filesystem::path bench; // dsbench results: K and readers from its figures (run/tuning.hpp)
    bool direct = false;         // stream: O_DIRECT reads of the inputs
    bool direct_given = false;   // --direct or --no-direct typed; else chosen by the split's size
    std::string host_mem;        // stream: host memory for ring + window cache ("2G"); empty: from available memory
    std::string managed_policy = "prefetch";
    bool oversubscribe = false;
    std::uint64_t eval_every = 0;       // steps; 0: after each epoch
    std::filesystem::path checkpoint;   // directory; empty: none
    std::uint64_t checkpoint_every = 0; // steps; 0: at the end of each epoch only
    bool resume = false;
    std::uint64_t max_steps = 0;         // stop after this many steps in total, with a checkpoint; 0: no limit
    std::vector<double> weights;         // a mix: one per member (default: the members' sizes)
    std::vector<std::string> placements; // a mix: auto, device, host or stream, one for all or per member
};

// Adds --data --order --window --chunk-samples --prefetch --readers --bench
// --direct --host-mem --managed-policy --oversubscribe --eval-every --checkpoint
// --checkpoint-every --resume --max-steps --weights --placement to `app`.
void add_data_options(CLI::App& app, DataOptions& d);

} // namespace dstk::run
