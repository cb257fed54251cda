#pragma once
// dstrain checkpoints: one file, DIR/checkpoint.dstk, replaced atomically
// (written under a temporary name, fsynced, renamed), so a kill -9 at any
// moment leaves either the previous checkpoint or the new one, never a mix.
//
// Layout: "DSTKCKP1", u64 length of a JSON header, the header, the trainer's
// state blob (Trainer::save_state: weights, BN statistics, optimiser slots,
// step). The header holds the position (epoch, next batch, steps), the seed
// (every random stream of a run is a pure function of the seed and a counter:
// orders of (seed, epoch), dropout of (seed, step), so seed + position is the
// whole RNG state), the options a resumed run must repeat, and the blob's
// XXH64. It also records the options given on the run's command line, so that
// `dstrain --checkpoint DIR --resume` needs nothing else.
#include <cstdint>
#include <filesystem>
#include <map>
#include <string>
#include <vector>

#include "dstk/cli_fwd.hpp"

namespace dstk {

inline constexpr const char* checkpoint_file_name = "checkpoint.dstk";

struct CheckpointPosition {
    std::uint64_t epoch = 0;      // 0-based epoch the run is in
    std::uint64_t next_batch = 0; // first batch of that epoch not yet trained
    std::uint64_t steps = 0;      // optimiser steps taken in total
};

struct Checkpoint {
    CheckpointPosition position;
    std::uint64_t seed = 0;
    // Options that shape the run (model, optimiser, batch, order, dataset ...):
    // a resume with different values is refused, naming them.
    std::map<std::string, std::string> run;
    // The options given on the command line, by name ("--model", "DATASET"),
    // with CLI11's results: what --resume takes when they are not given again.
    std::map<std::string, std::vector<std::string>> options;
    std::string created, command_line;
    // A mix of datasets (dstrain's run/mix_run.hpp): its members (keys,
    // weights) and the segments of the epoch's order, as a JSON object; empty
    // for one dataset.
    std::string mix;
    std::vector<std::uint8_t> trainer_state;
};

std::filesystem::path checkpoint_path(const std::filesystem::path& dir);
// Creates `dir` when missing; replaces the previous checkpoint atomically.
void save_checkpoint(const std::filesystem::path& dir, const Checkpoint& c);
// Runtime errors name the file: missing, truncated, bad magic, checksum mismatch.
Checkpoint load_checkpoint(const std::filesystem::path& dir);
bool checkpoint_exists(const std::filesystem::path& dir);
// Usage error listing every option whose value differs from the checkpoint's;
// "epochs" may grow, never shrink.
void check_resume_compatible(const Checkpoint& c, const std::map<std::string, std::string>& run,
                             const std::filesystem::path& dir);

// The options given on `app`'s command line (see Checkpoint::options), but
// those in `exclude` (names as CLI11 gives them: "--resume").
std::map<std::string, std::vector<std::string>> given_options(const CLI::App& app,
                                                              const std::vector<std::string>& exclude);
// --resume: each recorded option not given again takes its recorded results,
// as if typed (its callback runs). Returns the names it took.
std::vector<std::string> take_recorded_options(CLI::App& app,
                                               const std::map<std::string, std::vector<std::string>>& recorded);

// dstrain after parsing: with `resume` and a checkpoint in `dir`, takes the
// options it recorded (take_recorded_options, with a note naming them);
// returns what this run's checkpoints record: the options given, but those
// that only steer this invocation (--resume, --checkpoint, --max-steps,
// --init-from, --force, output options).
std::map<std::string, std::vector<std::string>> resume_options(CLI::App& app, const std::filesystem::path& dir,
                                                               bool resume, bool quiet);

} // namespace dstk
