#pragma once
// dstrain's subcommands over a saved model: `dstrain eval DATASET --weights
// FILE` and `dstrain predict INPUT --weights FILE` (man dstrain). Plain
// `dstrain DATASET ...` still trains.
#include <filesystem>
#include <string>

#include "dstk/cli_fwd.hpp"
#include "dstk/model/infer.hpp"
#include "dstk/output.hpp"

namespace dstk::model {

struct CommandOptions {
    CLI::App* eval = nullptr;
    CLI::App* predict = nullptr;
    std::filesystem::path weights;
    std::string split = "test", device, precision;
    InferenceOptions inference;
    PredictOptions predict_options;
    std::filesystem::path dataset;
    bool confusion = false; // eval: the per-class table and confusion matrix above confusion_limit classes
    OutputOptions out;
};

// Adds the eval and predict subcommands to `app`.
void add_model_commands(CLI::App& app, CommandOptions& c);
// Runs the subcommand given on the command line; false when none was.
bool run_model_command(CommandOptions& c);

} // namespace dstk::model
