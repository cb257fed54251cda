#pragma once
// Kernel choices that do not depend on luck: each candidate kernel of a layer
// (cuDNN's algorithms, dstk's own kernels) is timed over several repetitions,
// the median decides, near-ties go to the previous choice or to the candidate
// that won more repetitions; and the decisions persist in a choice cache, as
// TensorRT's timing cache does, so later runs on the same GPU, driver, cuDNN
// and dstk reuse them instead of timing again.
//
// The cache is one text file per device identity in the cache directory
// ($XDG_CACHE_HOME/dstk, else ~/.cache/dstk):
//
//   dstk-kernel-choices 1
//   device <identity text>
//   <key> <choice> <median ms> <runner-up median ms> <wins>/<repetitions>
//   ...
//   end <entry count>
//
// Keys and choices are single words. A file that does not parse, is
// truncated (no matching "end" line) or names another identity is ignored
// with a notice and replaced at the next store. Stores re-read the file under
// an flock, merge, and write a temporary file that is renamed into place, so
// concurrent runs never leave a torn file and keep each other's entries.
#include <cstdint>
#include <filesystem>
#include <functional>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "dstk/train/trainer.hpp"

namespace dstk::train {

// What the choices depend on besides the layer: a file for one identity is
// never used for another.
struct DeviceIdentity {
    std::string gpu;          // name, e.g. "NVIDIA H100 80GB HBM3"
    std::string compute;      // capability, e.g. "9.0"
    std::string driver;       // e.g. "12.4"
    std::string cudnn;        // e.g. "9.1.0"
    std::string dstk;         // DSTK_VERSION
    std::string kernel_set;   // bumped when dstk's own kernels change
    std::string text() const; // one line, no newline
};

// One decision: the candidate chosen, its median time, the runner-up's
// median (0 when it had none) and in how many repetitions it was fastest.
struct Choice {
    std::string kernel; // one word, e.g. "cudnn:1:tensor" or "own:tc_wgrad"
    double median_ms = 0.0, runner_up_ms = 0.0;
    unsigned wins = 0, repetitions = 0;
    bool operator==(const Choice&) const = default;
};

// A convolution operation's key: the operation ("fwd", "bwd_data",
// "bwd_filter"), precision, determinism, layout, batch, input c x h x w,
// output channels, kernel, stride, padding, the workspace bound.
struct ConvKey {
    std::string op;
    Precision precision = Precision::fp32;
    bool deterministic = false, nchw = false;
    std::uint32_t n = 0, c = 0, h = 0, w = 0, k = 0, kernel = 0, stride = 0, pad = 0;
    std::uint64_t workspace = 0;
    std::string text() const; // one word
};

// The file name of an identity's cache: a hash of its text, so that one
// directory holds the files of several GPUs or library versions side by side.
std::string choice_file_name(const DeviceIdentity& id);
// 16 hex digits naming `text` in file names and keys (FNV-1a, 64 bits).
std::string text_hash(std::string_view text);
// $XDG_CACHE_HOME/dstk, else $HOME/.cache/dstk; empty when neither is set.
std::filesystem::path default_choice_dir();

// A candidate's times over the repetitions (same count for every candidate;
// repetition r of each candidate ran in the same round).
struct CandidateTimes {
    std::string kernel;
    std::vector<double> ms;
};
struct Pick {
    std::size_t index = 0; // into the candidates
    Choice choice;
    bool near_tie = false; // another candidate's median was within the tie margin
};
// The fastest median; among candidates within `tie` (relative) of it, the
// `previous` choice if it is one of them, else the one fastest in most
// repetitions, else the lower median. Candidates without times are skipped;
// none with times: nullopt.
std::optional<Pick> pick_fastest(const std::vector<CandidateTimes>& candidates, std::string_view previous = {},
                                 double tie = 0.03);

class ChoiceCache {
  public:
    // Notices (a corrupt or foreign file, a directory that cannot be made or
    // written) go to `notice`; nothing here throws for a bad cache.
    using NoticeSink = std::function<void(const std::string&)>;
    // dir empty: an in-memory cache that loads and stores nothing.
    ChoiceCache(std::filesystem::path dir, DeviceIdentity id, NoticeSink notice);

    const std::filesystem::path& path() const { return path_; }
    std::optional<Choice> find(const std::string& key) const;
    // Records a decision; store() writes the ones put since the last store.
    void put(const std::string& key, const Choice& c);
    // Merges this cache's new decisions into the file (re-read under a lock,
    // so that concurrent writers keep each other's entries). False, with a
    // notice, where the file cannot be written.
    bool store();
    std::size_t size() const { return entries_.size(); }

  private:
    bool read_file(std::map<std::string, Choice>& into, bool quiet) const;
    std::filesystem::path dir_, path_;
    DeviceIdentity id_;
    NoticeSink notice_;
    std::map<std::string, Choice> entries_, fresh_;
};

// Serialisation, exposed for tests: parse() returns false on any malformed
// line, a missing or wrong "end" line, or a header for another identity
// (*why says which).
std::string serialise_choices(const DeviceIdentity& id, const std::map<std::string, Choice>& entries);
bool parse_choices(std::string_view text, const DeviceIdentity& id, std::map<std::string, Choice>& out,
                   std::string* why);

} // namespace dstk::train
