// dstrain: train a CNN or MLP on a dataset directory, on the GPU (cuDNN) or the CPU.
#include <cstdio>

#include <CLI/CLI.hpp>

#include "dstk/checkpoint.hpp"
#include "dstk/cli.hpp"
#include "dstk/dist/world.hpp"
#include "dstk/error.hpp"
#include "dstk/model/commands.hpp"
#include "dstk/run/train_run.hpp"
#include "dstk/units.hpp"

namespace {

// What the network is and what it learns: --model, --input, --label, --loss, --side-input.
void add_target_options(CLI::App& app, dstk::run::TrainOptions& o, std::string& loss) {
    app.add_option("-m,--model", o.model,
                   "Preset (ref-cnn, small-cnn, resnet9, mlp, mlp:W1,W2,...) or a layer spec such as "
                   "conv3x3:32,bn,relu,maxpool2,flatten,fc:10, which may end in named heads: "
                   "...,heads(policy=fc:4672>ce:moves, value=fc:1,tanh>mse:results) (man dstrain)")
        ->capture_default_str();
    app.add_option("--input", o.input,
                   "The input field the network reads, any numeric dtype and 1 to 3 dimensions (default: the "
                   "dataset's input role)");
    app.add_option("--label", o.label,
                   "The target field of a model without heads(...): an integer class label or a float field of any "
                   "shape (default: the dataset's label)");
    app.add_option("--loss", loss,
                   "Loss of that target: ce (softmax cross-entropy, integer classes), mse, poisson (softplus rate), "
                   "poisson-exp (exp rate) or bce (multi-label 0/1); default: ce for one integer per sample, else mse");
    app.add_option("--side-input", o.side_input,
                   "A second input field (e.g. f32[4] per sample), normalised and joined to the flat features before "
                   "the head(s) (where 'side' stands in the spec)");
}

// DATASET...: one directory, several (a mix) or a mix.json; --resume takes them from the checkpoint.
std::vector<std::filesystem::path> dataset_paths(const std::vector<std::string>& given,
                                                 const dstk::run::DataOptions& d) {
    if (given.empty())
        throw dstk::usage_error(d.resume ? "no DATASET, and no checkpoint in '" + d.checkpoint.string() +
                                               "' to take it from; give the --checkpoint DIR of the run to resume"
                                         : std::string("no DATASET (dstrain DATASET [options] trains; see also "
                                                       "dstrain eval and dstrain predict)"));
    return {given.begin(), given.end()};
}

} // namespace

int main(int argc, char** argv) {
    using namespace dstk;
    using namespace dstk::train;
    run::TrainOptions o;
    OutputOptions out;
    std::vector<std::string> datasets;
    std::string optimizer = "sgd", schedule = "cosine", precision, device, workspace = "256MiB", kernels = "auto", loss;
    float lr = 0.0f;
    bool no_nesterov = false;

    CLI::App app{
        "Train a network on a dataset directory, on the GPU or the CPU, with the data in GPU memory or "
        "streamed from the files (--data), and report each head's loss and metrics, speed and memory per epoch.",
        "dstrain"};
    // Not ->required(): eval and predict have their own, and --resume takes it from the checkpoint.
    app.add_option("DATASET", datasets,
                   "Dataset directory (dsgen, dsconvert) with train and test splits; several, or a mix.json, "
                   "train as one mix (--weights, --placement)");
    add_target_options(app, o, loss);
    app.add_option("-e,--epochs", o.epochs, "Epochs")->capture_default_str();
    app.add_option("-b,--batch", o.batch,
                   "Batch size, per rank under mpirun or srun (the last partial training batch of an epoch is skipped)")
        ->capture_default_str();
    app.add_option("--lr", lr, "Peak learning rate (default 0.05 x batch/256 for sgd, 0.002 for adamw)")
        ->check(number_in(0, unbounded, true, true));
    app.add_option("--optimizer", optimizer, "sgd or adamw")->capture_default_str();
    app.add_option("--momentum", o.momentum, "SGD momentum")
        ->capture_default_str()
        ->check(number_in(0, 1, false, true));
    app.add_flag("--no-nesterov", no_nesterov, "Plain instead of Nesterov momentum");
    app.add_option("--weight-decay", o.weight_decay, "Weight decay (sgd: L2 in the gradient; adamw: decoupled)")
        ->capture_default_str()
        ->check(number_in(0, 1));
    app.add_option("--schedule", schedule, "Learning-rate schedule: constant, step or cosine")->capture_default_str();
    app.add_option("--warmup-epochs", o.warmup_epochs, "Linear warm-up length in epochs (fractions allowed)")
        ->capture_default_str()
        ->check(number_in(0, unbounded, false, true));
    app.add_option("--step-epochs", o.step_epochs, "step schedule: multiply the rate by --gamma every N epochs");
    app.add_option("--gamma", o.gamma, "step schedule factor")->capture_default_str()->check(number_in(0, 1, true));
    app.add_option("--label-smoothing", o.label_smoothing, "Label smoothing")
        ->capture_default_str()
        ->check(number_in(0, 1, false, true));
    app.add_option("--precision", precision,
                   "GPU arithmetic: fp32, tf32 (the default: TF32 tensor cores in convolutions and matrix "
                   "products) or bf16 (mixed precision: bf16 activations, fp32 master weights); the CPU computes fp32");
    app.add_option("--device", device, "cuda:N or cpu (default: cuda:0 when a GPU is present, else cpu)");
    app.add_option("--seed", o.seed, "Seed for initialisation and dropout")->capture_default_str();
    app.add_option("-T,--threads", o.threads, "CPU threads for --device cpu (0: one per hardware thread)")
        ->capture_default_str();
    app.add_option("--workspace", workspace, "Bound on cuDNN convolution workspace")->capture_default_str();
    app.add_flag("--deterministic", o.deterministic,
                 "GPU: cuDNN algorithms restricted to deterministic ones; same seed, same weights; slower (the CPU "
                 "is always deterministic)");
    app.add_option("--kernels", kernels,
                   "GPU convolution kernel choice: auto (the choice cache, timing what it lacks), cached (the cache "
                   "only, untimed heuristic for the rest), retune (time everything again) or heuristic (no timing, "
                   "no cache)")
        ->capture_default_str();
    app.add_option("--log-json", o.log_json,
                   "Also write JSON lines to this file: the memory ceiling, then one per epoch (and per --eval-every)");
    app.add_option("--tensorboard", o.tensorboard,
                   "Also write a TensorBoard event file into this directory (loss, accuracy, samples/s, stage times, "
                   "memory per step and per epoch; a new file per run): tensorboard --logdir DIR")
        ->type_name("DIR");
    app.add_option("--dist-timeout", o.dist_timeout,
                   "Under mpirun or srun: seconds every rank has to reach the start-up rendezvous (a rank that does "
                   "not ends the run with exit 1, naming it)")
        ->capture_default_str()
        ->check(number_in(0, unbounded, true));
    run::DataOptions d;
    run::add_data_options(app, d);
    model::add_model_run_options(app, o.files);
    add_output_options(app, out);
    model::CommandOptions commands;
    model::add_model_commands(app, commands);

    return run_tool(app, argc, argv, [&] {
        if (model::run_model_command(commands)) return;
        o.batch_given = app.count("--batch") > 0; // before --resume adds the recorded options
        // Under a launcher, rank 0 alone says which options --resume took.
        o.given_options = resume_options(app, d.checkpoint, d.resume, out.quiet || dist::detect_launch().rank != 0);
        o.datasets = dataset_paths(datasets, d);
        o.dataset = o.datasets.front();
        if (app.count("--lr")) o.lr = lr;
        if (!loss.empty()) o.loss = parse_loss(loss, "--loss");
        o.optimizer = parse_optimizer(optimizer);
        o.schedule = parse_schedule(schedule);
        o.nesterov = !no_nesterov;
        if (!precision.empty()) o.precision = parse_precision(precision);
        if (!device.empty()) o.device = parse_device(device);
        o.workspace = parse_size(workspace, "--workspace");
        o.kernels = parse_kernel_mode(kernels);
        o.command_line = command_line(argc, argv);
        const run::RunReport r = run::run_training(o, d, out);
        if (out.json && r.rank == 0) std::fputs(run::run_report_json(r).c_str(), stdout);
    });
}
