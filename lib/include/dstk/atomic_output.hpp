#pragma once
// Every file or directory a tool writes goes through this header. Outputs
// appear complete or not at all: written under a temporary name in the
// destination's directory (.NAME.tmp-PID-N), fsynced, then put in place by a
// rename, and the directory fsynced. Whether the name may be replaced is
// decided at the rename itself (renameat2 RENAME_NOREPLACE / RENAME_EXCHANGE,
// or link-then-unlink and move-aside where the filesystem lacks them), not at
// start-up: another process may have written there meanwhile. Only an earlier
// output is ever replaced (a regular file, or a directory a dstk tool wrote),
// never a link, device or pipe, and nothing is written through a symlink. The
// destructor removes the temporary unless the output was put in place.
//
// Outputs that belong together (a dataset and its --report-json, a model and
// its --log-json) are put in place by one OutputSet: side files first, the
// main output last, and the ones already placed withdrawn when a later one
// cannot be.
#include <cstdint>
#include <filesystem>
#include <string>
#include <vector>

#include "dstk/fd.hpp"

namespace dstk {

// What may stand at an output's name when it is put in place.
enum class Replace {
    never,     // nothing: a name taken (even meanwhile) is a usage error (exit 2)
    earlier,   // an earlier output (--force): a regular file, or a directory a dstk tool wrote
    next_free, // nothing; a taken NAME.EXT becomes the first free NAME-2.EXT, NAME-3.EXT, ...
};
inline Replace replace_when(bool force) {
    return force ? Replace::earlier : Replace::never;
}

// The early check, before any work (the same rules apply again at the
// rename): usage error (exit 2) when `final_path` exists and !force, and,
// --force or not, when it is not an earlier output: a link, device or pipe,
// a directory where the output is a file, or a directory that holds
// anything its dataset.json does not name.
void check_overwrite(const std::filesystem::path& final_path, bool force, bool directory = false);

// An output of a run, as the early checks name it: `what` is how the user
// gave it ("--save", "the default model"), `path` where it goes (a
// directory the output writes in: "DIR/").
struct OutputName {
    std::string what;
    std::filesystem::path path;
    bool creates_dirs = false; // its missing directories are made (a checkpoint's, a TensorBoard directory)
};
// The early check of where outputs go, before any work, so that a run does not
// learn at its end that it cannot write: usage error (exit 2) when an
// output's directory does not exist (or, for one that creates its
// directories, its nearest existing ancestor) or is not a writable
// directory, and when two outputs name the same path (the second would find
// the first in its place at the rename).
void check_output_paths(const std::vector<OutputName>& outputs);

class OutputSet;

// What AtomicFile and AtomicDir share: the temporary, the rule, the placing.
class AtomicOutput {
  public:
    virtual ~AtomicOutput();
    AtomicOutput(const AtomicOutput&) = delete;
    AtomicOutput& operator=(const AtomicOutput&) = delete;

    const std::filesystem::path& tmp_path() const { return tmp_; }
    // Where the output is (or will be) put: with Replace::next_free, the
    // name actually taken once committed.
    const std::filesystem::path& final_path() const { return final_; }
    bool committed() const { return committed_; }
    // fsync, rename into place under the rule, fsync the parent directory.
    void commit();

  protected:
    AtomicOutput(std::filesystem::path final_path, Replace replace, bool directory);
    // fsyncs what the temporary holds (and closes what is still open).
    virtual void sync() = 0;

    std::filesystem::path final_, tmp_;
    Replace replace_;
    bool directory_;
    bool committed_ = false;

  private:
    friend class OutputSet;
    std::filesystem::path old_; // where a replaced earlier output waits for removal
    bool exchanged_ = false;    // old_ is tmp_ (RENAME_EXCHANGE), else a moved-aside name
};

// A directory output (a dataset).
class AtomicDir final : public AtomicOutput {
  public:
    AtomicDir(std::filesystem::path final_path, bool force) : AtomicDir(std::move(final_path), replace_when(force)) {}
    AtomicDir(std::filesystem::path final_path, Replace replace);
    ~AtomicDir() override;

    // A path inside the temporary directory, registered for signal clean-up.
    std::filesystem::path file(const std::string& name);

  private:
    void sync() override;
    std::vector<std::filesystem::path> files_; // registered for signal clean-up
};

// A single-file output.
class AtomicFile final : public AtomicOutput {
  public:
    AtomicFile(std::filesystem::path final_path, bool force) : AtomicFile(std::move(final_path), replace_when(force)) {}
    AtomicFile(std::filesystem::path final_path, Replace replace);
    ~AtomicFile() override;

    int fd() const { return fd_.get(); }
    void write(const void* data, std::size_t len); // whole write or throw
    // A file that grows in place once committed (a log, read while the run
    // goes and kept if the process is killed): commit() fsyncs but keeps the
    // descriptor, write() appends to the placed file.
    void keep_open() { keep_open_ = true; }

  private:
    void sync() override;
    UniqueFd fd_;
    bool keep_open_ = false;
};

// Outputs put in place together, in the order added (side files first, the
// main output last): all are fsynced before the first rename; when one cannot
// be put in place, those placed before it are withdrawn (an earlier output
// one of them replaced comes back) and the error is thrown.
class OutputSet {
  public:
    void add(AtomicOutput& o) { outputs_.push_back(&o); }
    void commit();

  private:
    std::vector<AtomicOutput*> outputs_;
};

// dsconvert --resume's staging directory: kept between runs (never removed
// by a failure), put in place at `final_path` as an AtomicDir is.
class StagedDir final : public AtomicOutput {
  public:
    StagedDir(std::filesystem::path staged, std::filesystem::path final_path, Replace replace);

  private:
    void sync() override;
};

void fsync_path(const std::filesystem::path& p); // file or directory
// Writes all of `len` bytes at `offset` (or appends when offset < 0); throws naming `path`.
void write_all(int fd, const void* data, std::size_t len, long long offset, const std::filesystem::path& path);
void read_all(int fd, void* data, std::size_t len, long long offset, const std::filesystem::path& path);
// Throws no_fit_error (exit 3) when the filesystem holding `dir` has less than
// `bytes` free; the message names the shortfall and suggests --force to skip.
void check_free_disk(const std::filesystem::path& dir, std::uint64_t bytes);

} // namespace dstk
