#pragma once
// What a training run does with model files: --init-from reads one before
// the first step, --save writes one at the end (saved_model.hpp).
#include <filesystem>
#include <optional>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>

#include "dstk/model/saved_model.hpp"
#include "dstk/output.hpp"
#include "dstk/train/trainer.hpp"

namespace dstk::model {

struct ModelRunOptions {
    std::vector<std::filesystem::path> save; // empty: the default path (save_paths)
    std::filesystem::path init_from;         // empty: initialise from the seed
    bool force = false;                      // replace an existing --save file
};

// Adds --save, --init-from and --force to `app`.
void add_model_run_options(CLI::App& app, ModelRunOptions& o);

// Where the run's model goes, decided and checked before training: the
// --save files (usage error for an unknown extension, or for a file that
// exists, without --force or `replace_own`: a resumed run replaces what it
// wrote); by default model.safetensors in the checkpoint directory, else
// beside the --log-json file, else in the current directory, and where that
// exists (without --force or `replace_own`) the first free
// model-N.safetensors beside it, with a note. Nothing but a regular file is
// ever replaced.
std::vector<std::filesystem::path> save_paths(const ModelRunOptions& o, const std::filesystem::path& checkpoint_dir,
                                              const std::filesystem::path& log_json, bool replace_own,
                                              const OutputOptions& out);

// --init-from: checks that the file holds the network `tc.plan` describes
// and takes its normalisation (the weights were trained with it). Returns
// the model, whose weights go into the trainer with load_weights.
SavedModel prepare_init_from(const ModelRunOptions& o, train::TrainerConfig& tc, const OutputOptions& out);
// Parameters and BN statistics from `m`; optimiser state and step count start at zero.
void load_weights(train::Trainer& t, const SavedModel& m);

// The trainer's current weights as a saved model of `spec`, trained on the
// split whose input field has `dataset_checksum`.
SavedModel model_from_trainer(train::Trainer& t, const train::ModelSpec& spec, const std::string& dataset,
                              const std::string& dataset_checksum);
// The end of a run: the trainer's model into each of `paths` (checked before
// training by save_paths), with a note each.
void save_trained(train::Trainer& t, const train::ModelSpec& spec, const std::string& dataset,
                  const std::string& dataset_checksum, const std::vector<std::filesystem::path>& paths,
                  const OutputOptions& out);

} // namespace dstk::model
