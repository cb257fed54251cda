#pragma once
// The state of one dsconvert run, passed through its stages in order:
// check_settings -> open_input -> plan_fields -> scan_range -> shard_source ->
// plan_output_splits -> select_single_output -> prepare_output -> make_sinks
// -> stream_input -> commit_output -> report.
#include <cstdint>
#include <filesystem>
#include <map>
#include <memory>
#include <optional>
#include <utility>
#include <vector>

#include "dstk/convert/convert.hpp"
#include "dstk/dataset_writer.hpp"
#include "dstk/thread_pool.hpp"
#include "field_plan.hpp"
#include "resumable.hpp"

namespace dstk::convert {

// Blocks hold about this many input + output bytes, all fields together.
inline constexpr std::uint64_t block_target_bytes = 16ull << 20;

// The options, checked and resolved before any input is opened.
struct Settings {
    OutputFormat to = OutputFormat::dataset;
    bool zstd = false;
    int level = 0;
    bool range_auto = false;
    std::optional<std::pair<double, double>> range_given;
    std::vector<SplitFraction> split; // --split, empty without it
};
Settings check_settings(const ConvertOptions& o);
// The modes (convert, --verify, --benchmark, --merge, --concat) and the
// options that go with them only.
void check_modes(const ConvertOptions& o);

struct Job {
    Job(const ConvertOptions& options, Settings s) : o(options), settings(std::move(s)), pool(options.threads) {}
    const ConvertOptions& o;
    Settings settings;
    ThreadPool pool;

    Source src;
    std::string x_name;      // the input field, which --dtype and the mapping apply to ("": none)
    std::string y_name;      // the label field ("": none)
    bool count_known = true; // false: raw stdin without labels, counted when it ends
    std::vector<FieldPlan> fields;
    std::optional<std::size_t> x_index;
    FieldPlan* x() { return x_index ? &fields[*x_index] : nullptr; }

    std::uint64_t total_samples = 0;
    std::vector<OutSplit> outs;
    std::optional<std::size_t> only_split; // single-file outputs: what they hold
    std::size_t only_field = 0;

    std::uint64_t chunk_samples = 0; // zstd-chunked outputs
    // --shard: the chunk its ranges are cut at, and per source split the
    // whole split's samples and where this part's range starts.
    std::uint64_t shard_chunk = 0;
    std::vector<SampleRange> shard_ranges;
    std::vector<std::uint64_t> shard_totals;
    // --shard: the rows of per-channel sums of each field with statistics (ShardSplit::field_chunk_sums).
    std::size_t stats_split = 0;
    std::map<std::string, std::shared_ptr<std::vector<std::vector<double>>>> stats_rows;
    std::optional<DatasetWriter> writer;
    std::unique_ptr<ResumableOutput> resumable;
    std::optional<AtomicFile> report_file; // --report-json, put in place just before OUTPUT
    std::filesystem::path out_dir;
    std::uint64_t resume_at = 0; // samples of the (concatenated) input already converted
    std::uint64_t bytes_written = 0;
    // The output's class count and where it came from (the manifest's
    // provenance param num_classes_from), for the report.
    std::optional<std::uint32_t> classes;
    std::string classes_from;
};

// Every split of the source must have the same fields; each field's output
// dtype, mapping and statistics are planned (plan_fields.cpp).
void plan_fields(Job& job);
// "positions i8[12x8x8], moves i32, results i8": the fields, for messages.
std::string fields_text(const std::vector<FieldPlan>& fields);
void stream_input(Job& job);
// The report: --report-json's file written (not yet in place), the summary returned.
nlohmann::json write_report(Job& job, double seconds);
// --report-json then OUTPUT put in place together (the report withdrawn when OUTPUT cannot be).
void place_outputs(Job& job);
// After the stream: labels in 0 .. 2^31-1 and below --num-classes; the class count.
std::optional<std::uint32_t> check_labels(const Job& job);
// What was converted, on stderr (or --json on stdout), once everything is in place.
void print_report(Job& job, const nlohmann::json& summary, double seconds);
void run_verify(const ConvertOptions& o);

} // namespace dstk::convert
