#pragma once
// Outputs appear complete or not at all: written under a temporary name in the
// destination's directory, fsynced, renamed into place, and the directory
// fsynced. The destructor removes the temporary unless commit() ran.
#include <filesystem>
#include <string>

#include "dstk/fd.hpp"

namespace dstk {

// Refuses (usage error, exit 2) when `final_path` exists and !force.
// Also refuses, --force or not, a link, device or pipe: only regular files and
// directories are ever replaced.
void check_overwrite(const std::filesystem::path& final_path, bool force);
// Refuses (usage error) a non-empty directory without a dataset.json: a
// dataset output replaces only a directory a dstk tool wrote.
void check_replaceable_dir(const std::filesystem::path& dir);

// A directory output (a dataset).
class AtomicDir {
  public:
    AtomicDir(std::filesystem::path final_path, bool force);
    ~AtomicDir();
    AtomicDir(const AtomicDir&) = delete;
    AtomicDir& operator=(const AtomicDir&) = delete;

    const std::filesystem::path& tmp_path() const { return tmp_; }
    const std::filesystem::path& final_path() const { return final_; }
    // A path inside the temporary directory, registered for signal clean-up.
    std::filesystem::path file(const std::string& name);
    // fsync every file and the directory, rename into place (replacing an old
    // output when force), fsync the parent.
    void commit();

  private:
    std::filesystem::path final_, tmp_;
    bool force_, committed_ = false;
};

// A single-file output.
class AtomicFile {
  public:
    AtomicFile(std::filesystem::path final_path, bool force);
    ~AtomicFile();
    AtomicFile(const AtomicFile&) = delete;
    AtomicFile& operator=(const AtomicFile&) = delete;

    int fd() const { return fd_.get(); }
    const std::filesystem::path& tmp_path() const { return tmp_; }
    void write(const void* data, std::size_t len); // whole write or throw
    void commit();

  private:
    std::filesystem::path final_, tmp_;
    UniqueFd fd_;
    bool committed_ = false;
};

void fsync_path(const std::filesystem::path& p); // file or directory
// Writes all of `len` bytes at `offset` (or appends when offset < 0); throws naming `path`.
void write_all(int fd, const void* data, std::size_t len, long long offset, const std::filesystem::path& path);
void read_all(int fd, void* data, std::size_t len, long long offset, const std::filesystem::path& path);
// Throws no_fit_error (exit 3) when the filesystem holding `dir` has less than
// `bytes` free; the message names the shortfall and suggests --force to skip.
void check_free_disk(const std::filesystem::path& dir, std::uint64_t bytes);

} // namespace dstk
