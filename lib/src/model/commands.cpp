#include "dstk/model/commands.hpp"

#include <cstdio>

#include <CLI/CLI.hpp>

#include "dstk/cli.hpp"
#include "dstk/units.hpp"

namespace dstk::model {
namespace {

void add_inference_options(CLI::App& sub, CommandOptions& c) {
    sub.add_option("-w,--weights", c.weights, "The model file (model.safetensors written by dstrain)")->required();
    sub.add_option("--split", c.split, "Split of a dataset to use")->capture_default_str();
    sub.add_option("-b,--batch", c.inference.batch, "Samples per batch")->capture_default_str();
    sub.add_option("--device", c.device, "cuda:N or cpu (default: cuda:0 when a GPU is present, else cpu)");
    sub.add_option(
        "--precision", c.precision,
        "GPU arithmetic: fp32, tf32 or bf16 (default: what the model was trained in); the CPU computes fp32");
    sub.add_option("-T,--threads", c.inference.threads, "CPU threads for --device cpu (0: one per hardware thread)")
        ->capture_default_str();
}

} // namespace

void add_model_commands(CLI::App& app, CommandOptions& c) {
    c.eval = app.add_subcommand("eval", "Evaluate a saved model on a dataset split: each head's loss and metrics "
                                        "(accuracy and top-5, R2 and Pearson r, explained deviance), and for classes "
                                        "the accuracy per class and the confusion matrix");
    c.eval->add_option("DATASET", c.dataset, "Dataset directory")->required();
    add_inference_options(*c.eval, c);
    c.eval->add_flag("--confusion", c.confusion,
                     "Print the per-class table and the confusion matrix whatever the number of classes (default: up "
                     "to " +
                         std::to_string(confusion_limit) + " classes)");
    add_output_options(*c.eval, c.out);

    c.predict = app.add_subcommand("predict", "Each head's prediction per sample from a saved model (class and "
                                              "probabilities, values or rates), as JSON lines or .npy files");
    c.predict
        ->add_option("INPUT", c.predict_options.input,
                     "A dataset directory, a .npy of samples (N x C x H x W, N x H x W or N x D), or - for a .npy "
                     "on stdin")
        ->required();
    add_inference_options(*c.predict, c);
    c.predict->add_option(
        "-o,--output", c.predict_options.output,
        "Where to write: FILE.npy (each head's predictions, f32 N x outputs: probabilities, values or "
        "rates; FILE.HEAD.npy per head for several heads), another FILE or - for JSON lines {index, "
        "class, probabilities} (default: stdout)");
    c.predict->add_option("--side", c.predict_options.side,
                          "A .npy of side inputs (N x values) for a model with a side input, beside a .npy INPUT (a "
                          "dataset INPUT has its own field)");
    c.predict->add_flag("-f,--force", c.predict_options.force, "Replace an existing --output file");
    add_output_options(*c.predict, c.out, false);
}

bool run_model_command(CommandOptions& c) {
    const bool eval = c.eval && c.eval->parsed(), predicting = c.predict && c.predict->parsed();
    if (!eval && !predicting) return false;
    if (!c.device.empty()) c.inference.device = train::parse_device(c.device);
    if (!c.precision.empty()) c.inference.precision = train::parse_precision(c.precision);
    const SavedModel m = load_model(c.weights);
    if (eval) {
        const EvalReport r = evaluate_model(m, c.dataset, c.split, c.inference, c.out, c.confusion);
        std::fputs((c.out.json ? eval_report_json(r) : eval_report_text(r)).c_str(), stdout);
        return true;
    }
    c.predict_options.split = c.split;
    const std::uint64_t n = predict(m, c.predict_options, c.inference, c.out);
    const auto& o = c.predict_options.output;
    note(c.out, "dstrain: predicted " + format_count(n) + " samples" +
                    (o.empty() || o == "-" ? std::string() : " into " + o.string()));
    return true;
}

} // namespace dstk::model
