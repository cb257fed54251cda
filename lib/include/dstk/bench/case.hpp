#pragma once
// The registry of dsbench cases. A case has a key ("io.seq.pread.cold"), a
// description, a waiver that says why it cannot run here (no GPU, no O_DIRECT
// on this filesystem, no file given), and a run function that returns one
// result per setting it sweeps. Cases live in lib/src/bench/<group>_cases.cpp;
// each group file defines one add_<group>_cases(CaseRegistry&) and registry.cpp
// lists the groups.
#include <cstdint>
#include <filesystem>
#include <functional>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "dstk/bench/measure.hpp"
#include "dstk/bench/results.hpp"
#include "dstk/manifest.hpp"
#include "dstk/output.hpp"

namespace dstk::bench {

struct Settings {
    RepeatPolicy repeat;
    std::vector<unsigned> threads;             // thread counts swept by multi-threaded cases
    std::uint64_t block_bytes = 1ull << 20;    // sequential read size
    std::uint64_t size_bytes = 1ull << 30;     // bytes read per sequential pass (clamped to the file)
    std::uint64_t batch_samples = 256;         // samples per batch read
    std::uint64_t chunk_bytes = 4ull << 20;    // bytes per chunk read / zstd chunk
    std::vector<std::uint64_t> transfer_sizes; // host-to-device transfer sizes
    bool drop_caches = false;                  // also write /proc/sys/vm/drop_caches (root only)
    int zstd_level = 3;
    std::uint64_t seed = 1;
};

Settings default_settings(); // threads {1, 4, hardware threads}, transfers 64 KiB .. 256 MiB

// The file the I/O and decode cases read: a dataset's training inputs, or any file.
struct Target {
    std::filesystem::path given; // as typed
    std::filesystem::path file;  // the file read
    std::uint64_t data_offset = 0, data_bytes = 0, file_bytes = 0;
    std::uint64_t sample_bytes = 0;
    std::optional<std::filesystem::path> dataset_dir; // when `given` is a dataset
    std::optional<FieldInfo> field;                   // the field read, for a dataset
    std::string split;                                // its split

    std::uint64_t samples() const { return sample_bytes ? data_bytes / sample_bytes : 0; }
};

// A dataset directory (reads its "train" split's input field, else the first
// split's) or a plain file with `sample_bytes`-sized samples.
Target open_target(const std::filesystem::path& path, std::uint64_t sample_bytes);

struct CaseContext {
    const Target* target = nullptr; // null when no file was given
    const Settings& settings;
    const OutputOptions& out;
};

struct Case {
    std::string key, description;
    bool in_default = true; // part of `dsbench all` without --cases
    // Why the case cannot run here, or nullopt.
    std::function<std::optional<std::string>(const CaseContext&)> waive;
    // One result per setting (the runner fills in key and description); may
    // throw: the failure is recorded and the next case runs.
    std::function<std::vector<CaseResult>(const CaseContext&)> run;
};

class CaseRegistry {
  public:
    void add(Case c); // a duplicate key is a programming error (throws std::logic_error)
    const std::vector<Case>& cases() const { return cases_; }
    // Cases whose key matches `pattern` (see key_matches); an empty pattern
    // gives the default set.
    std::vector<const Case*> select(std::string_view pattern) const;

  private:
    std::vector<Case> cases_;
};

// A comma-separated list of shell globs ("io.rand.*.cold") or key prefixes
// that end at a dot boundary ("io", "io.seq", "h2d.pinned").
bool key_matches(std::string_view key, std::string_view pattern);

// Every built-in case.
const CaseRegistry& builtin_cases();

// Helpers shared by the case groups.
std::optional<std::string> needs_target(const CaseContext& ctx);
std::string variant_threads(unsigned threads); // "threads=4"
std::string variant_size(std::uint64_t bytes); // "size=64KiB"

// The group registration functions registry.cpp calls.
void add_io_cases(CaseRegistry& reg);
void add_decode_cases(CaseRegistry& reg);
void add_transfer_cases(CaseRegistry& reg);
void add_loader_cases(CaseRegistry& reg); // loader.<placement>.<order> (lib/src/bench/loader_cases.cpp)

} // namespace dstk::bench
