#pragma once
// dsbench: runs the selected cases, prints a table, writes the results file;
// compares two results files.
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "dstk/bench/case.hpp"
#include "dstk/bench/results.hpp"
#include "dstk/output.hpp"

namespace dstk::bench {

struct BenchOptions {
    std::string target;                // dataset directory or file; empty: cases that need one are waived
    std::string cases;                 // --cases PATTERN; empty: the default set
    std::string json_file;             // --json FILE ("-": stdout, instead of the table)
    bool force = false;                // overwrite --json FILE
    std::uint64_t sample_bytes = 3072; // for a plain file (a 3x32x32 u8 image)
    Settings settings = default_settings();
    OutputOptions out;
    std::string command_line;
};

// "1,4,16" -> {1, 4, 16}; "64K,1M" -> sizes. Usage errors name `what`.
std::vector<unsigned> parse_thread_list(std::string_view text, std::string_view what = "--threads");
std::vector<std::uint64_t> parse_size_list(std::string_view text, std::string_view what = "--transfer-sizes");

// Runs the selected cases of `registry`: a waived or failing case is recorded
// and the others still run. Notes progress on stderr.
Results run_cases(const BenchOptions& o, const CaseRegistry& registry);
Context detect_context(const BenchOptions& o, const Target* target);

// The whole `dsbench all`: exit status 1 when a case failed, 3 when nothing
// could be measured (every case waived), else 0.
void run_bench(const BenchOptions& o);

std::string format_case_list(const CaseRegistry& registry);
std::string format_results_table(const Results& r);
std::string format_comparison(const Results& a, const Results& b, const std::string& name_a, const std::string& name_b);

void run_compare(const std::string& a, const std::string& b, const OutputOptions& out);

} // namespace dstk::bench
