#pragma once
// What a training run does with model files: --init-from reads one before
// the first step, --save writes one at the end (saved_model.hpp).
#include <filesystem>
#include <optional>
#include <string>
#include <vector>

#include "dstk/cli_fwd.hpp"
#include "dstk/atomic_output.hpp"
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

// Where a model goes, and what may stand there when it is put in place.
struct SaveTarget {
    std::filesystem::path path;
    Replace replace = Replace::next_free;
    bool default_name = false; // the default place, where a free name is the rule
};

// Where the run's models go, checked before training: the --save files
// (usage error for an unknown extension, or for a file that exists, without
// --force or `replace_own`: a resumed run replaces what it wrote); by default
// model.safetensors in the checkpoint directory, else beside the --log-json
// file, else in the current directory. Without --force or `replace_own`, a
// name taken when the model is put in place (decided at the rename: another
// run may have saved there meanwhile) becomes the first free NAME-N.EXT
// beside it. Nothing but a regular file is ever replaced.
std::vector<SaveTarget> save_paths(const ModelRunOptions& o, const std::filesystem::path& checkpoint_dir,
                                   const std::filesystem::path& log_json, bool replace_own);

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
// The end of a run: the trainer's model into each target (save_paths), put
// in place together (one OutputSet), with a note each. The default
// model.safetensors taken becomes model-N with a note; a --save name another
// process took during the run is a runtime error once every file is in
// place, naming where the model went instead.
void save_trained(train::Trainer& t, const train::ModelSpec& spec, const std::string& dataset,
                  const std::string& dataset_checksum, const std::vector<SaveTarget>& targets,
                  const OutputOptions& out);

} // namespace dstk::model
