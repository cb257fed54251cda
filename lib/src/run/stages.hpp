#pragma once
// The stages of a dstrain run (run_training in train_run.cpp calls them in
// this order): setup.cpp builds the Session and measures the memory ceiling,
// loop.cpp trains epoch by epoch, report.cpp writes what the user reads.
#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "data/device_memory.hpp"
#include "dstk/atomic_output.hpp"
#include "dstk/checkpoint.hpp"
#include "dstk/data/batch_source.hpp"
#include "dstk/data/source_plan.hpp"
#include "dstk/dataset.hpp"
#include "dstk/dist/reducer.hpp"
#include "dstk/dist/world.hpp"
#include "dstk/output.hpp"
#include "dstk/run/options.hpp"
#include "dstk/run/report.hpp"
#include "dstk/train/trainer.hpp"
#include "run/mix_run.hpp"

namespace dstk::run {

// Everything a run builds before its first step. Built in place and never
// moved: the sources refer to the dataset.
struct Session {
    // Data parallel: this process among the ranks (a plain world of one
    // without a launcher). First member: it outlives everything else (MPI_Finalize last).
    std::unique_ptr<dist::World> world;
    OutputOptions out; // what this rank prints: rank 0 the run's, the others errors and warnings only
    std::optional<data::DeviceMemoryMeter> meter; // cuda (or device not chosen yet)
    train::Device device;
    train::Precision precision = train::Precision::fp32;
    std::optional<Dataset> ds; // with a mix: its first member, for the fields' facts
    std::optional<MixRun> mix; // several datasets as one (mix_run.hpp)
    const SplitInfo* train_split = nullptr;
    const SplitInfo* test_split = nullptr; // null when absent or empty
    const FieldInfo* x = nullptr;          // the input field
    train::ModelSpec spec;
    bool loss_default = false; // the loss of a model without heads(...) follows its label's dtype (no --loss)
    train::TrainerConfig tc;
    std::uint64_t steps_per_epoch = 0;      // global steps; a partial last global batch is skipped
    std::unique_ptr<dist::Reducer> reducer; // distributed world: the trainer's (outlives it)
    std::unique_ptr<train::Trainer> trainer;
    data::Order order = data::Order::chunk;
    data::TrainingPlan plan;   // the data path's plan (data::plan_training)
    data::SourceConfig sc;     // the training source's configuration, host_mem as given
    std::string placement_why; // why this placement, for the user
    bool hash_batches = false; // --log-json: cpu sources hash their batches
    std::unique_ptr<data::BatchSource> train_src, test_src;
    std::uint64_t rss_before_sources = 0; // resident memory once the trainer is built

    bool on_gpu() const { return device.backend == train::Backend::cuda; }
    bool root() const { return world->root(); }
    int ranks() const { return world->size(); }
    bool distributed() const { return world->distributed(); } // under a launcher, one rank included
    std::uint64_t global_batch() const { return std::uint64_t{tc.max_batch} * static_cast<std::uint64_t>(ranks()); }
};

// The GPU (or host) memory the run may hold, known before the first step.
struct Ceiling {
    std::uint64_t bytes = 0;       // overhead + planned
    std::uint64_t overhead = 0;    // cuda: what the runtime holds after the warm-up
    std::uint64_t planned = 0;     // the trainer's plan + data
    std::uint64_t data_device = 0; // the sources' backend memory
    bool managed = false;          // managed pages are not in the ceiling
    double load_seconds = 0;       // a resident split's load time, for the first epoch's read time
    // Host memory: the process before the sources (and, on cuda, what the
    // warm-up added beside them) plus the sources' planned host bytes.
    std::uint64_t host_bytes = 0, host_process = 0, host_data = 0;
};

// --- setup.cpp ---
// Usage errors found from the options alone, before anything is opened.
void check_options(const TrainOptions& e, const DataOptions& d);
// The world of ranks (dstk/dist/world.hpp) and what this rank prints; the
// per-rank batch: --batch, or on a resume without it the checkpoint's global
// batch over this run's ranks (a resume at another rank count).
void join_world(Session& s, TrainOptions& e, const DataOptions& d, const OutputOptions& out);
// Meter, device, dataset, trainer, sources, in that order (the meter reads
// the device before this process has a CUDA context).
void open_session(Session& s, const TrainOptions& e, const DataOptions& d, const OutputOptions& out);
// Warms up (every kernel on the GPU, the trainer's threads on the CPU) and
// measures the ceiling from the start position's epoch.
Ceiling measure_ceiling(Session& s, std::uint64_t epoch, RunReport& r);

// --- mix_run.cpp ---
// The mix's training and test sources (plan_mix, printed one line per member).
void open_mix_sources(Session& s, const data::SourceRequest& r, const OutputOptions& out);
// Checkpoint::mix at position p: the members, and the epoch's segments mid-epoch.
std::string mix_checkpoint(const MixRun& m, const CheckpointPosition& p);
// --resume of a mix: says what changed (one line per member) and, mid-epoch,
// sets the epoch's order continued with this run's members (MixRun::resumed).
void resume_mix(Session& s, const std::string& mix_json, const CheckpointPosition& pos, const OutputOptions& out);
// After an epoch: each member's share of the samples delivered, beside the plan's.
void report_mix_epoch(const Session& s, const OutputOptions& out);

// --- report.cpp ---
// --log-json: JSON lines, appended as they come to a file put in place at
// the start of the run (atomic_output.hpp: a temporary name renamed, refused
// over an existing file without `force`, never through a link). A resumed
// run's log starts with the lines of the file it continues, and replaces it.
class JsonLog {
  public:
    JsonLog(const std::string& path, bool resume, bool force);
    void emit(const nlohmann::json& j);

  private:
    std::string path_;
    std::optional<AtomicFile> file_;
};
RunReport first_report(const Session& s);
void describe_session(const Session& s, const DataOptions& d, const RunReport& r, const OutputOptions& out);
void report_ceiling(const Session& s, const Ceiling& c, const RunReport& r, JsonLog& log, const OutputOptions& out);
// Where a training step's time goes outside the GPU's own step (issue 18's
// bimodal bf16 speed was time lost outside the captured graph):
// host time in the source's next() (waiting for a batch or a free slot,
// gathering), in train_step() (launching the conversion and the graph), and
// in the rest of the loop (release, checks); and the GPU time between steps
// (loop.cpp's ComputeTimer). Always measured (a clock read per stage);
// printed with DSTK_STEP_TIMES=1, always in --log-json.
struct LoopTimes {
    double next = 0, launch = 0, rest = 0, between = 0, slowest_step = 0; // seconds
    std::uint64_t steps = 0;
};
struct EpochOutcome {
    EpochReport report;
    data::StageTimes stages;
    LoopTimes loop;
    std::uint64_t steps = 0;          // in total, after the epoch
    std::uint64_t peak = 0;           // cuda: measured over the epoch (the largest of the ranks')
    std::vector<std::uint64_t> peaks; // each rank's, in rank order
    // --log-json: per global step from first_batch on, the XXH64 of its sample indices (16 hex digits)
    std::vector<std::string> index_hashes;
    std::uint64_t first_batch = 0;
    bool whole = true; // the epoch ran from its first batch to its last
};
void report_epoch(const Session& s, const TrainOptions& e, const EpochOutcome& o, const Ceiling& c, JsonLog& log,
                  const OutputOptions& out);
void report_eval(std::uint64_t steps, const train::Metrics& m, JsonLog& log, const OutputOptions& out);
void warn_over_ceiling(std::uint64_t peak, const Ceiling& c, const RunReport& r);
// Resident memory of this process now (/proc/self/statm).
std::uint64_t current_rss_bytes();

// --- loop.cpp ---
// What a resume must repeat, and the checkpoint writes.
class Checkpointer {
  public:
    Checkpointer(const Session& s, const TrainOptions& e, const DataOptions& d);
    // The position to start from: a loaded checkpoint's (with --resume), else
    // the start; a mix's resumed order goes to s.mix.
    CheckpointPosition start(Session& s, const OutputOptions& out) const;
    // Nothing without --checkpoint. Every rank calls it: the BN statistics
    // are averaged over the ranks, then rank 0 writes.
    void write(train::Trainer& t, const CheckpointPosition& p) const;

  private:
    void save(train::Trainer& t, const CheckpointPosition& p) const;
    dist::World& world_;
    const MixRun* mix_; // null for one dataset
    const DataOptions& d_;
    std::uint64_t seed_;
    std::string command_line_;
    std::map<std::string, std::vector<std::string>> given_options_;
    std::map<std::string, std::string> run_;
};
// Epochs from `pos` to the last (or --max-steps), with evaluation,
// checkpoints and the reaction to SIGINT/SIGTERM; fills r.epochs.
void train_epochs(Session& s, const TrainOptions& e, const DataOptions& d, const OutputOptions& out,
                  const Checkpointer& ck, CheckpointPosition pos, const Ceiling& c, JsonLog& log, RunReport& r);

// Two digits after the point, etc.: for run's own lines.
std::string fixed(double v, int digits);

} // namespace dstk::run
