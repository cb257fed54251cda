#pragma once
// dsconvert --resume: the output is staged in .OUTPUT.partial/ (not removed
// on failure) with a resume.json holding the conversion's settings. A rerun
// with the same settings inspects the files: complete splits are kept, the
// split in progress continues after its last complete chunk (npy: last whole
// sample), later splits start over.
#include <cstdint>
#include <filesystem>
#include <memory>
#include <optional>
#include <string>

#include "dstk/atomic_output.hpp"
#include "dstk/manifest.hpp"
#include "dstk/output.hpp"
#include "sinks.hpp"

namespace dstk::convert {

// The output staged in .OUTPUT.partial/ with the settings in resume.json.
// An existing staging directory is trusted only when every entry is a
// regular file of this user named as dsconvert names what it writes there
// (resume.json, dataset.json, `field_files`): anything else (a symlink
// planted to redirect a write, another user's file) is refused.
class ResumableOutput {
  public:
    ResumableOutput(const std::filesystem::path& final_path, const std::string& fingerprint, bool force,
                    const OutputOptions& out, const std::vector<std::string>& field_files);
    const std::filesystem::path& dir() const { return dir_; }
    bool resuming() const { return resuming_; }

    // Samples of `fi` already on disk in a usable state (npy: whole samples;
    // chunked: complete chunks, or all of them when the file is finished).
    std::uint64_t done(const FieldInfo& fi, std::uint64_t samples) const;
    std::unique_ptr<FieldSink> sink(const FieldInfo& fi, std::uint64_t samples, std::uint64_t keep, int level,
                                    ThreadPool& pool);
    // Writes the manifest; output() then puts the directory in place. When
    // that fails, keep_for_resume() makes it resumable again.
    void stage(const Manifest& m, bool force);
    AtomicOutput& output() { return *staged_; }
    void keep_for_resume();

  private:
    void check_entries(const std::vector<std::string>& field_files) const;
    std::filesystem::path final_, dir_;
    std::string fingerprint_;
    bool resuming_ = false;
    std::optional<StagedDir> staged_;
};

} // namespace dstk::convert
