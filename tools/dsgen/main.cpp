// dsgen: synthetic datasets, learnable, deterministic, larger than RAM.
#include <cstdio>

#include <CLI/CLI.hpp>

#include "dstk/cli.hpp"
#include "dstk/gen/generate.hpp"
#include "dstk/units.hpp"

int main(int argc, char** argv) {
    using namespace dstk;
    GenerateOptions o;
    std::string train = "50K", test = "10K", shape = "3x32x32", dtype, kind = "images", layout = "sample-major", shard;

    CLI::App app{"Generate a synthetic dataset directory (dataset.json + .npy files), deterministically and out of "
                 "core.",
                 "dsgen"};
    app.add_option("OUT_DIR", o.out_dir, "Dataset directory to create")->required();
    app.add_option("--train", train, "Training samples (counts take K, M, G = powers of 1000)")->capture_default_str();
    app.add_option("--test", test, "Test samples")->capture_default_str();
    app.add_option("--shape", shape, "Per-sample shape, e.g. 3x32x32 (images: CxHxW or HxW)")->capture_default_str();
    app.add_option("--dtype", dtype,
                   "Stored dtype: u8, bf16, f16, f32 (default u8 for images and bytes, f32 for "
                   "tabular; tabular also takes f64)");
    app.add_option("--classes", o.synth.classes, "Number of classes")->capture_default_str();
    app.add_option("--kind", kind, "images (learnable), tabular (Gaussian mixture) or bytes (random)")
        ->capture_default_str();
    app.add_option("--noise", o.synth.noise,
                   "Noise standard deviation (default 0.25 for images on a 0..1 scale, 1.0 "
                   "for tabular); higher is harder");
    app.add_option("--seed", o.synth.seed, "Seed: same options and seed give the same bytes")->capture_default_str();
    app.add_option("-T,--threads", o.threads, "Worker threads (0: one per hardware thread)")->capture_default_str();
    app.add_option("--layout", layout,
                   "sample-major, or feature-major to also write the v28b column-major "
                   "images_<split>.bin (f32) and labels_<split>.bin (i32); the old spellings sample and feature "
                   "are deprecated")
        ->capture_default_str();
    app.add_option("--shard", shard,
                   "Write only part I of N (I counted from 0) of each split, whole chunks of consecutive samples; "
                   "join the parts with dsconvert --merge");
    app.add_flag("-f,--force", o.force, "Replace an existing OUT_DIR and skip the free-disk check");
    add_output_options(app, o.out);

    return run_tool(app, argc, argv, [&] {
        o.train = parse_count(train, "--train");
        o.test = parse_count(test, "--test");
        o.synth.shape = parse_shape(shape, "--shape");
        o.synth.kind = parse_synth_kind(kind);
        o.dtype_given = !dtype.empty();
        if (o.dtype_given) o.synth.dtype = parse_dtype(dtype, "--dtype");
        o.noise_given = app.count("--noise") > 0;
        o.layout = parse_layout(layout, "--layout");
        if (!shard.empty()) o.shard = parse_shard(shard);
        o.command_line = command_line(argc, argv);
        finalize_options(o);
        const GenerateResult r = generate_dataset(o);
        // --json is the result, on stdout; the text summary is a note (silenced by -q), as dsconvert's.
        const std::string summary = generate_summary(r, o.out.json);
        if (o.out.json)
            std::fputs(summary.c_str(), stdout);
        else
            note(o.out, summary.substr(0, summary.size() - 1));
    });
}
