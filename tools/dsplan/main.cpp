// dsplan: size a dataset against a machine and say where it should live.
#include <CLI/CLI.hpp>

#include "dstk/cli.hpp"
#include "dstk/plan/plan.hpp"

int main(int argc, char** argv) {
    using namespace dstk;
    plan::PlanOptions o;

    CLI::App app{"Size a dataset against this machine (RAM, disk, GPU) and say where it should live: device, ram, "
                 "disk or none. Sizes take K M G T (powers of 1024) or KB MB GB TB (powers of 1000); counts take "
                 "K M G (powers of 1000).",
                 "dsplan"};
    app.add_option("--ram", o.ram, "RAM to plan for, e.g. 128G (default: detected MemTotal)");
    app.add_option("--disk", o.disk, "Free disk to plan for, e.g. 2T (default: detected at --dir)");
    app.add_option("--gpu-mem", o.gpu_mem, "GPU memory to plan for, e.g. 8G (default: detected free GPU memory)");
    app.add_option("--dir", o.dir,
                   "Where the dataset lives or would be written (default: the first --dataset, else .)");
    app.add_option("--dataset", o.datasets,
                   "An existing dataset directory: its fields and samples from its manifest, its disk bytes its "
                   "files'; repeatable: datasets with the same fields sized together (--dtype then asks 'what if "
                   "the input were stored as')")
        ->expected(1)
        ->multi_option_policy(CLI::MultiOptionPolicy::TakeAll);
    app.add_option("--weights", o.weights,
                   "Several --dataset as one mix: each one's weight, in their order, e.g. 2,1,1 (default: their "
                   "sizes); the mix section shows the plan dstrain builds for them")
        ->delimiter(',')
        ->check(mix_weight());
    app.add_option("--field", o.fields,
                   "A field of the samples, NAME:SHAPE:DTYPE (e.g. robs:120:f32, moves::i32 for a scalar); "
                   "repeatable; without --shape the first is the input")
        ->expected(1)
        ->multi_option_policy(CLI::MultiOptionPolicy::TakeAll);
    app.add_option("--shape", o.shape, "Per-sample shape of the input field x, e.g. 3x32x32");
    app.add_option("--dtype", o.dtype, "Input dtype: u8 i8 u16 i16 i32 i64 f16 bf16 f32 f64 (default f32)");
    app.add_option("--label-dtype", o.label_dtype, "Dtype of the label field y of --shape, or none")
        ->capture_default_str();
    app.add_option("--samples", o.samples, "Training samples, e.g. 10M (without it: capacity only)");
    app.add_option("--test", o.test, "Test samples, e.g. 10K")->capture_default_str();
    app.add_option("--batch", o.batch, "Training batch size")->capture_default_str();
    app.add_option("--prefetch", o.prefetch, "Ring slots (batches in flight to the GPU)")->capture_default_str();
    app.add_option("--model", o.model,
                   "dstrain model (ref-cnn, small-cnn, resnet9, mlp or a spec), checked against the shape; "
                   "its training footprint (dstrain's memory plan at --batch) is added to every GPU figure");
    app.add_option("--classes", o.classes, "Classes for --model, at least 2 (default: the manifest's, else 10)");
    app.add_option("--compute-rate", o.compute_rate, "Training samples/s of the GPU (from a dstrain run), e.g. 70K");
    app.add_option("--order", o.order, "Sample order: sequential, chunk or full (full reads at random)")
        ->capture_default_str();
    app.add_option("--data", o.data,
                   "Placement the epoch time is estimated for: auto (the verdict's), device, or stream (from disk, "
                   "cold page cache)")
        ->capture_default_str();
    app.add_option("--bench", o.bench, "dsbench JSON results: measured read, decode and host-to-device rates");
    app.add_option("--os-reserve", o.os_reserve, "RAM kept for the OS and other processes")->capture_default_str();
    app.add_option("--headroom", o.headroom, "Share of each budget kept free, in percent")->capture_default_str();
    app.add_flag("--table", o.table, "Print the quick-reference table: RAM sizes 16G to 1T as rows");
    app.add_flag("--check", o.check, "Exit 0 if the dataset fits (placement device, ram or disk), 3 if not");
    app.add_option("--require", o.require,
                   "With --check: the worst placement that passes: device, ram or disk "
                   "(implies --check)");
    add_output_options(app, o.out);

    return run_tool(app, argc, argv, [&] { plan::run_plan(o); });
}
