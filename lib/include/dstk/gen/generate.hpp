#pragma once
// dsgen: write a synthetic dataset directory, out of core and deterministic
// (same options and seed, same bytes, whatever the thread count).
#include <cstdint>
#include <filesystem>
#include <optional>
#include <string>

#include "dstk/layout.hpp"
#include "dstk/output.hpp"
#include "dstk/shard.hpp"
#include "dstk/gen/synth.hpp"

namespace dstk {

struct GenerateOptions {
    std::filesystem::path out_dir;
    std::uint64_t train = 50'000, test = 10'000;
    SynthParams synth;
    bool dtype_given = false, noise_given = false;
    unsigned threads = 0;                 // 0: one per hardware thread
    Layout layout = Layout::sample_major; // feature_major: also the v28b .bin files
    bool force = false;
    // --shard I/N: only part I of each split (whole chunks of
    // generate_chunk_samples), with the records dsconvert --merge needs.
    std::optional<ShardSpec> shard;
    OutputOptions out;
    std::string command_line;
};

struct GenerateResult {
    std::filesystem::path dir;
    std::uint64_t samples = 0, bytes = 0, peak_rss = 0;
    double seconds = 0;
    unsigned threads = 0;
};

// The chunk of dsgen's work and of its --shard ranges: a fixed number of
// samples per sample size (never the thread count), so per-chunk statistics
// add up in the same order in every run.
std::uint64_t generate_chunk_samples(std::uint64_t sample_bytes);

// Fills defaults that depend on the kind (dtype, noise) and validates.
void finalize_options(GenerateOptions& o);
GenerateResult generate_dataset(const GenerateOptions& o);
// The one-line summary (text) or JSON document printed by dsgen.
std::string generate_summary(const GenerateResult& r, bool json);

} // namespace dstk
