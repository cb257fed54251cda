#pragma once
// dsbench's results file (`dsbench all DATA --json FILE`), read back by dsplan
// (`--bench FILE`), dstrain (`--bench FILE`) and `dsbench compare`. The schema
// is documented in man/dsbench.1 (section JSON SCHEMA); schema_version changes
// whenever a field changes meaning or disappears.
#include <cstdint>
#include <filesystem>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

namespace dstk::bench {

inline constexpr int results_schema_version = 1;

// One measured quantity over the timed repetitions. Rates are per repetition,
// so median/min/max are the median, slowest and fastest repetition (for
// latencies: the percentile over every timed operation of every repetition).
struct Metric {
    std::string unit; // "B/s", "samples/s", "ops/s", "elements/s", "us"
    double median = 0, min = 0, max = 0;
    // (max - min) / median, in percent: how much repetitions disagreed.
    double spread_pct() const { return median > 0 ? 100.0 * (max - min) / median : 0.0; }
};

enum class CaseStatus { ok, waived, failed };
std::string_view status_name(CaseStatus s); // "ok", "waived", "failed"

// The result of one case at one setting (a case sweeping thread counts or
// transfer sizes gives one result per setting).
struct CaseResult {
    std::string key;     // "io.seq.pread.cold"
    std::string variant; // "threads=4", "size=256KiB", or "" for a case with one setting
    std::string description;
    CaseStatus status = CaseStatus::ok;
    std::string reason;       // why waived or failed
    nlohmann::json params;    // settings of this measurement (object)
    unsigned repetitions = 0; // timed repetitions, after the warm-up
    std::map<std::string, Metric> metrics;

    const Metric* metric(std::string_view name) const;
};

// Where and how the figures were measured.
struct Context {
    std::string dstk_version, command_line, date; // date: ISO 8601 UTC
    std::string host, kernel, cpu_model;
    unsigned logical_cores = 0, physical_cores = 0, numa_nodes = 1;
    std::uint64_t ram_total_bytes = 0, ram_available_bytes = 0;
    // The file measured (empty when no target was given).
    std::string target, file, filesystem, mount_point, block_device;
    std::uint64_t file_bytes = 0, sample_bytes = 0;
    bool built_with_cuda = false;
    std::string gpu_name, gpu_status; // gpu_status: why there is no GPU, else ""
    std::uint64_t gpu_memory_bytes = 0, gpu_free_bytes = 0;
    int pcie_generation = 0, pcie_width = 0;
    std::string driver_version, cuda_runtime_version, cudnn_version;
    nlohmann::json settings; // the options of the run (object)
};

struct Results {
    int schema_version = results_schema_version;
    Context context;
    std::vector<CaseResult> results;

    // The result with this key and variant ("" matches a case's only or first result).
    const CaseResult* find(std::string_view key, std::string_view variant = "") const;
};

// Throws Error(failure) naming `source` and what is wrong.
Results parse_results(std::string_view json_text, const std::string& source);
Results load_results(const std::filesystem::path& file);
nlohmann::json results_to_json(const Results& r);
std::string serialize_results(const Results& r); // pretty JSON, trailing newline

// The figures other tools plan with, in bytes per second (median), when the
// file holds them with status ok.
//  - sequential_read_rate: a cold sequential read of the dataset file
//    (io.seq.pread.cold; else io.seq.direct; else io.seq.pread.warm).
//  - pinned_h2d_rate: h2d.pinned at the largest transfer size measured.
std::optional<double> sequential_read_rate(const Results& r);
std::optional<double> pinned_h2d_rate(const Results& r);

// Random reads at "sample", "batch" or "chunk" granularity with pread from a
// cold cache (io.rand.<granularity>.pread.cold): the thread count that gave
// the highest rate, with that rate and its p99 latency.
struct RandomReadFigure {
    unsigned threads = 0;
    double rate = 0;           // B/s
    double latency_p99_us = 0; // one read, microseconds
};
std::optional<RandomReadFigure> best_random_read(const Results& r, std::string_view granularity);

// A --threads sweep's rate where a reader runs `threads` threads: the result
// of case `key` (status ok) at the largest thread count measured that is at
// most `threads`, else at the smallest measured. dsplan times dstrain's chunk
// reads (io.rand.chunk.pread.cold) and zstd decoding (decode.zstd.chunked,
// decode.zstd) at the thread count dstrain uses.
struct ThreadedRate {
    unsigned threads = 0;
    double rate = 0; // B/s, median
};
std::optional<ThreadedRate> rate_at_threads(const Results& r, std::string_view key, unsigned threads);

} // namespace dstk::bench
