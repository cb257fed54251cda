// dsbench: measure this machine's data path (disk, page cache, PCIe, decode).
#include <CLI/CLI.hpp>

#include "dstk/bench/bench.hpp"
#include "dstk/cli.hpp"
#include "dstk/error.hpp"
#include "dstk/plot.hpp"
#include "dstk/units.hpp"

int main(int argc, char** argv) {
    namespace b = dstk::bench;
    CLI::App app{
        "Measure this machine's data path: disk and page cache reads, host-to-device transfers, decoding.\n"
        "  dsbench all DATA [--json FILE]     run the default cases (or --cases PATTERN) on a dataset or file\n"
        "  dsbench compare A.json B.json      two results side by side, with ratios (--plot FILE: as a PNG)\n"
        "  dsbench --list                     the cases",
        "dsbench"};
    app.fallthrough();
    b::BenchOptions o;
    o.command_line = dstk::command_line(argc, argv);
    bool list = false;
    std::string threads, transfer_sizes;
    app.add_flag("--list", list, "List the cases (key, description; '-' marks those outside the default set)");

    CLI::App* all = app.add_subcommand("all", "Run the default cases, or those --cases selects, on DATA");
    all->add_option("DATA", o.target,
                    "Dataset directory (reads its training inputs) or any file; optional: "
                    "transfer and conversion cases need none");
    all->add_option("--cases", o.cases,
                    "Cases to run: comma-separated globs or key prefixes (io.seq, 'io.rand.*.cold')");
    all->add_option("--json", o.json_file, "Also write the results as JSON to FILE ('-': JSON on stdout, no table)")
        ->type_name("FILE");
    all->add_flag("-f,--force", o.force, "Overwrite an existing --json FILE");
    all->add_option("--repetitions", o.settings.repeat.repetitions, "Timed repetitions per figure, at least")
        ->check(CLI::Range(1u, 1000u))
        ->capture_default_str();
    all->add_option("--min-time", o.settings.repeat.min_time, "Seconds of timed repetitions per figure, at least")
        ->check(dstk::number_in(0, 3600))
        ->capture_default_str();
    all->add_option("--threads", threads, "Thread counts swept by multi-threaded cases (default: 1,4,cores)")
        ->type_name("LIST");
    all->add_option_function<std::string>(
           "--block-size", [&](const std::string& s) { o.settings.block_bytes = dstk::parse_size(s, "--block-size"); },
           "Sequential read size (default 1M)")
        ->type_name("SIZE");
    all->add_option_function<std::string>(
           "--size", [&](const std::string& s) { o.settings.size_bytes = dstk::parse_size(s, "--size"); },
           "Bytes read per sequential pass (from the start of the file), random chunk pass and loader pass (default "
           "1G, at most the file)")
        ->type_name("SIZE");
    all->add_option_function<std::string>(
           "--batch", [&](const std::string& s) { o.settings.batch_samples = dstk::parse_count(s, "--batch"); },
           "Samples per batch read (default 256)")
        ->type_name("N");
    all->add_option_function<std::string>(
           "--chunk-size", [&](const std::string& s) { o.settings.chunk_bytes = dstk::parse_size(s, "--chunk-size"); },
           "Bytes per chunk read and per zstd chunk (default 4M)")
        ->type_name("SIZE");
    all->add_option_function<std::string>(
           "--sample-bytes", [&](const std::string& s) { o.sample_bytes = dstk::parse_size(s, "--sample-bytes"); },
           "Sample size when DATA is a plain file (default 3K: a 3x32x32 u8 image)")
        ->type_name("SIZE");
    all->add_option("--transfer-sizes", transfer_sizes, "Host-to-device transfer sizes (default 64K,1M,16M,256M)")
        ->type_name("LIST");
    all->add_flag("--drop-caches", o.settings.drop_caches,
                  "Cold passes also drop the whole page cache (/proc/sys/vm/drop_caches; root only)");
    all->add_option("--zstd-level", o.settings.zstd_level, "zstd level of the in-memory chunks (decode.zstd)")
        ->check(CLI::Range(-7, 22))
        ->capture_default_str();
    all->add_option("--seed", o.settings.seed, "Seed of the random read offsets")->capture_default_str();

    CLI::App* compare = app.add_subcommand("compare", "Print two results files side by side, with ratios B/A");
    std::string file_a, file_b;
    compare->add_option("A", file_a, "Results file (dsbench all --json)")->required();
    compare->add_option("B", file_b, "Results file to compare with A")->required();
    std::string plot;
    bool plot_force = false;
    compare
        ->add_option("--plot", plot,
                     "Also draw both as a PNG: each case's rate as bars beside the disk's and PCIe's figures "
                     "(python3 with matplotlib; the picture of python -m dstk.plot A B)")
        ->type_name("FILE");
    compare->add_flag("-f,--force", plot_force, "Overwrite an existing --plot FILE");
    app.require_subcommand(0, 1);
    dstk::add_output_options(app, o.out, /*with_json=*/false);

    return dstk::run_tool(app, argc, argv, [&] {
        if (list) {
            std::fputs(b::format_case_list(b::builtin_cases()).c_str(), stdout);
        } else if (*all) {
            if (!threads.empty()) o.settings.threads = b::parse_thread_list(threads);
            if (!transfer_sizes.empty()) o.settings.transfer_sizes = b::parse_size_list(transfer_sizes);
            b::run_bench(o);
        } else if (*compare) {
            b::run_compare(file_a, file_b, o.out);
            if (!plot.empty()) dstk::draw_plot({file_a, file_b}, plot, plot_force);
        } else {
            throw dstk::usage_error("no command given (run 'dsbench all DATA', 'dsbench compare A.json B.json' "
                                    "or 'dsbench --list')");
        }
    });
}
