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
// XXH64.
#include <cstdint>
#include <filesystem>
#include <map>
#include <string>
#include <vector>

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
    std::string created, command_line;
    std::vector<std::uint8_t> trainer_state;
};

std::filesystem::path checkpoint_path(const std::filesystem::path& dir);
// Creates `dir` when missing; replaces the previous checkpoint atomically.
void save_checkpoint(const std::filesystem::path& dir, const Checkpoint& c);
// Runtime errors name the file: missing, truncated, bad magic, checksum mismatch.
Checkpoint load_checkpoint(const std::filesystem::path& dir);
bool checkpoint_exists(const std::filesystem::path& dir);
// Usage error listing every option whose value differs from the checkpoint's.
void check_resume_compatible(const Checkpoint& c, const std::map<std::string, std::string>& run,
                             const std::filesystem::path& dir);

} // namespace dstk
