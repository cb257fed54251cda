// dsconvert: dtype, compression, layout and format conversion, out of core.
#include <CLI/CLI.hpp>

#include "dstk/cli.hpp"
#include "dstk/convert/convert.hpp"
#include "dstk/error.hpp"
#include "dstk/units.hpp"

#include <tuple>

namespace {

// The option texts as typed, parsed in main once CLI11 has filled them.
struct Texts {
    std::string input, from = "auto", to, shape, in_dtype, label_dtype = "i32", layout = "sample-major";
    std::string out_layout = "sample-major", chunk_samples, chunk_size, shuffle, in_layout = "auto", shard;
    std::vector<std::string> dtype, merge, concat;
};

void add_options(CLI::App& app, dstk::ConvertOptions& o, Texts& t) {
    using namespace dstk;
    app.add_option("INPUT", t.input,
                   "Input: a dataset directory, file or directory of a known format, or - (stdin: raw when "
                   "--shape/--in-dtype are given, else IDX, plain or gzip); with --benchmark, an optional file "
                   "to compress");
    app.add_option("OUTPUT", o.output, "Output: a dataset directory, or a .npy / raw file (see --to)");
    app.add_flag("--verify", o.verify_only,
                 "Re-read every file of the dataset INPUT, check sizes and checksums, "
                 "name the first bad chunk; writes nothing");
    app.add_flag(
        "--benchmark", o.benchmark,
        "Measure the conversion kernels (f32 -> bf16, f32 -> f16, u8 -> f32, u8 -> bf16) and, on INPUT's bytes, "
        "zstd-chunked compression and decompression at levels 1 and 3 (or --compress), on 1 and -T "
        "threads, in MB per wall and per CPU second; writes nothing");
    app.add_option("--from", t.from, "Input format: auto, dataset, npy, npz, raw, v28b, idx, cifar10")
        ->capture_default_str();
    app.add_option("--to", t.to,
                   "Output format: dataset, npy or raw (default: npy when OUTPUT ends in .npy, else "
                   "dataset)");
    app.add_option("--dtype", t.dtype,
                   "DTYPE: convert the input field to u8 i8 u16 i16 i32 i64 f16 bf16 f32 f64; FIELD=DTYPE: convert "
                   "that field (e.g. robs=bf16); repeatable; class labels are stored as i32")
        ->expected(1)
        ->multi_option_policy(CLI::MultiOptionPolicy::TakeAll);
    app.add_option("--scale", o.scale,
                   "Mapping out = in * SCALE + OFFSET (e.g. --scale 0.00392156862745098 for u8 "
                   "-> f32 in 0..1)")
        ->check(number_in(-unbounded, unbounded));
    app.add_option("--offset", o.offset, "Added after --scale")->check(number_in(-unbounded, unbounded));
    app.add_option("--range", o.range,
                   "Map [LO,HI] (LO:HI, or auto from a first pass) onto the output type's range "
                   "(integers) or 0..1 (floats)");
    app.add_option("--compress", o.compress,
                   "none (.npy files) or zstd[:LEVEL] (zstd-chunked files, default level "
                   "3)")
        ->capture_default_str();
    app.add_option("--chunk-samples", t.chunk_samples, "Samples per zstd chunk (counts take K, M)");
    app.add_option("--chunk-size", t.chunk_size, "Target uncompressed bytes per zstd chunk (default 4M)");
    app.add_option("--shuffle", t.shuffle,
                   "Write a globally shuffled copy with this seed (external-memory "
                   "permutation, bounded memory)");
    app.add_option("--split", o.split,
                   "Re-split the (concatenated) input, e.g. train=0.9,test=0.1 (after "
                   "--shuffle)");
    app.add_option("--select", o.select,
                   "SPLIT[/FIELD] written to a single .npy/raw OUTPUT (default: the only split, the input "
                   "field)");
    app.add_option("--shape", t.shape, "Per-sample shape of raw and v28b inputs, e.g. 3x32x32");
    app.add_option("--in-dtype", t.in_dtype, "Element type of raw inputs (required) and v28b images (default f32)");
    app.add_option("--label-dtype", t.label_dtype, "Element type of v28b labels_*.bin and of a raw --labels file")
        ->capture_default_str();
    app.add_option("--labels", o.raw.labels,
                   "Labels (field y) of an image array: .npy, .npz with one array, IDX (plain or .gz) or raw "
                   "(--label-dtype), one per sample; with raw stdin it also sets the sample count");
    auto* input = app.add_option("--input", o.raw.input,
                                 "The field (.npz array, .npy file) that is the input, e.g. positions or x_train");
    auto* label = app.add_option("--label", o.raw.label,
                                 "The field (.npz array, .npy file) that is the label, e.g. moves or y_train");
    app.add_option("--x-array", o.raw.input, "The old name of --input")->excludes(input);
    app.add_option("--y-array", o.raw.label, "The old name of --label")->excludes(label);
    app.add_option("--in-layout", t.in_layout,
                   "Layout of npy/npz/raw images: nhwc (height x width x channels, transposed to CHW), nchw, or "
                   "auto (nhwc where the last axis is 1, 3 or 4 and the others are not, with a notice)")
        ->capture_default_str();
    app.add_option("--num-classes", o.num_classes,
                   "Classes of the labels (default: the input's, else the largest label + 1)");
    app.add_option("--layout", t.layout, "Layout of a raw input: sample-major or feature-major")->capture_default_str();
    app.add_option("--out-layout", t.out_layout, "Layout of a raw OUTPUT: sample-major or feature-major")
        ->capture_default_str();
    app.add_option("--report-json", o.report_json, "Also write the conversion report (errors, bytes, time) to FILE");
    app.add_option("-T,--threads", o.threads,
                   "Worker threads (0: one per hardware thread); output is identical "
                   "whatever the count")
        ->capture_default_str();
    app.add_option("--shard", t.shard,
                   "Write only part I of N (I counted from 0) of each split: whole chunks (--chunk-samples, "
                   "--chunk-size) of consecutive samples; join the parts with --merge");
    app.add_option("--merge", t.merge,
                   "PART... OUTPUT: join the --shard parts 0..N-1, given in order, into the dataset OUTPUT "
                   "without copying samples (hard links; see --move)")
        ->expected(2, -1);
    app.add_option("--concat", t.concat,
                   "MEMBER... OUTPUT: join datasets with the same fields, dtypes and shapes, in order, into the "
                   "dataset OUTPUT (hard links where the filesystem allows, else copies; see --move)")
        ->expected(2, -1);
    app.add_flag("--dataset-field", o.dataset_field,
                 "With --concat: add an i32 field 'dataset' holding each sample's member index (0, 1, ...)");
    app.add_flag("--move", o.move,
                 "With --merge or --concat: rename the inputs' files into OUTPUT instead of hard-linking them "
                 "(filesystems without hard links); the emptied input directories are removed");
    app.add_flag("--resume", o.resume,
                 "Stage the dataset in .OUTPUT.partial/ and keep it if interrupted; run the "
                 "same command with --resume again to continue after the last complete chunk");
    app.add_flag("-f,--force", o.force, "Replace an existing OUTPUT and skip the free-disk check");
    add_output_options(app, o.out);
}

} // namespace

int main(int argc, char** argv) {
    using namespace dstk;
    ConvertOptions o;
    Texts t;
    CLI::App app{"Convert datasets between dtypes, compressions, layouts and formats, out of core: dataset "
                 "directories, .npy, .npz, raw, v28b, MNIST IDX and CIFAR-10 in; dataset directories (npy or "
                 "zstd-chunked storage), .npy and raw out.",
                 "dsconvert"};
    add_options(app, o, t);

    return run_tool(app, argc, argv, [&] {
        if (!t.merge.empty() && !t.concat.empty()) throw usage_error("give --merge or --concat, not both");
        for (auto [paths, flag, into] :
             {std::tuple{&t.merge, "--merge", &o.merge_parts}, std::tuple{&t.concat, "--concat", &o.concat_members}}) {
            if (paths->empty()) continue;
            if (!t.input.empty() || !o.output.empty())
                throw usage_error(std::string(flag) + " takes all its paths itself: dsconvert " + flag +
                                  " INPUT... OUTPUT");
            o.output = paths->back();
            into->assign(paths->begin(), paths->end() - 1);
        }
        if (!t.shard.empty()) o.shard = parse_shard(t.shard);
        o.input = t.input;
        o.from = parse_input_format(t.from);
        if (!t.to.empty()) o.to = parse_output_format(t.to);
        parse_dtype_options(t.dtype, o);
        if (!t.shape.empty()) o.raw.shape = parse_shape(t.shape, "--shape");
        if (!t.in_dtype.empty()) o.raw.dtype = parse_dtype(t.in_dtype, "--in-dtype");
        o.raw.label_dtype = parse_dtype(t.label_dtype, "--label-dtype");
        o.raw.layout = parse_layout(t.layout, "--layout");
        o.raw.in_layout = parse_in_layout(t.in_layout);
        o.out_layout = parse_layout(t.out_layout, "--out-layout");
        if (!t.chunk_samples.empty()) o.chunk_samples = parse_count(t.chunk_samples, "--chunk-samples");
        if (!t.chunk_size.empty()) o.chunk_bytes = parse_size(t.chunk_size, "--chunk-size");
        if (app.count("--chunk-samples") && o.chunk_samples == 0)
            throw usage_error("invalid --chunk-samples 0 (must be positive)");
        if (app.count("--chunk-size") && o.chunk_bytes == 0)
            throw usage_error("invalid --chunk-size 0 (must be positive)");
        if (o.chunk_samples && o.chunk_bytes) throw usage_error("give --chunk-samples or --chunk-size, not both");
        if (!t.shuffle.empty()) o.shuffle_seed = parse_count(t.shuffle, "--shuffle");
        o.command_line = command_line(argc, argv);
        run_convert(o);
    });
}
