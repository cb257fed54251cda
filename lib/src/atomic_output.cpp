#include "dstk/atomic_output.hpp"

#include <atomic>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <csignal>
#include <cstring>
#include <fcntl.h>
#include <set>
#include <sys/stat.h>
#include <unistd.h>

#include "dstk/env.hpp"
#include "dstk/error.hpp"
#include "dstk/fd.hpp"
#include "dstk/json.hpp"
#include "dstk/manifest.hpp"
#include "dstk/output.hpp"
#include "dstk/signals.hpp"
#include "dstk/sysinfo.hpp"
#include "dstk/units.hpp"

namespace fs = std::filesystem;

namespace dstk {
namespace {

std::atomic<int> g_tmp_counter{0};

fs::path temp_sibling(const fs::path& final_path) {
    fs::path parent = final_path.parent_path();
    if (parent.empty()) parent = ".";
    std::string name = ".";
    name += final_path.filename().string();
    name += ".tmp-" + std::to_string(::getpid()) + "-" + std::to_string(g_tmp_counter++);
    return parent / name;
}

fs::path parent_or_dot(const fs::path& p) {
    fs::path parent = p.parent_path();
    return parent.empty() ? fs::path(".") : parent;
}

// "out/" -> "out": the name a directory output is renamed to.
fs::path without_trailing_slash(fs::path p) {
    while (!p.has_filename() && p.has_parent_path() && p != p.root_path()) p = p.parent_path();
    return p;
}

void remove_quietly(const fs::path& p) {
    std::error_code ec;
    fs::remove_all(p, ec);
}

// The PID in a staging name ".NAME.tmp-PID-N" of `final_path`, 0 when `name` is not one.
pid_t staging_pid(const std::string& name, const fs::path& final_path) {
    std::string prefix = ".";
    prefix += final_path.filename().string();
    prefix += ".tmp-";
    if (name.size() <= prefix.size() || name.compare(0, prefix.size(), prefix) != 0) return 0;
    const std::string rest = name.substr(prefix.size());
    const auto dash = rest.find('-');
    if (dash == 0 || dash == std::string::npos || dash + 1 == rest.size()) return 0;
    if (rest.find_first_not_of("0123456789-") != std::string::npos || rest.find('-', dash + 1) != std::string::npos)
        return 0;
    const long long pid = std::atoll(rest.substr(0, dash).c_str());
    return pid > 0 && pid < (1ll << 31) ? static_cast<pid_t>(pid) : 0;
}

// A run killed with SIGKILL (or a crash) cannot clean up after itself: the next
// output to the same name removes what such runs staged. Only names of our
// pattern whose process is gone are touched; a live writer keeps its own.
void remove_stale_staging(const fs::path& final_path) {
    std::error_code ec;
    for (const auto& e : fs::directory_iterator(parent_or_dot(final_path), ec)) {
        const pid_t pid = staging_pid(e.path().filename().string(), final_path);
        if (pid == 0 || pid == ::getpid() || ::kill(pid, 0) == 0 || errno != ESRCH) continue;
        const auto st = e.symlink_status(ec);
        if (ec || (!fs::is_directory(st) && !fs::is_regular_file(st))) continue;
        remove_quietly(e.path());
        warning("removed '" + e.path().string() + "', staged by process " + std::to_string(pid) +
                " which no longer runs (an interrupted earlier run)");
    }
}

// ---- test hooks -------------------------------------------------------------
// Concurrency tests interleave two runs at the moment an output is put in
// place, without sleeping: with DSTK_TEST_HOLD_FIFO naming a FIFO (and
// DSTK_TEST_HOLD_AT the output's file name, when only that one is held) the
// tool writes "placing PATH" into the FIFO, then waits until the test has
// opened and closed it for writing. DSTK_TEST_NO_RENAMEAT2=1 takes the
// fallbacks of filesystems without renameat2 flags.

bool renameat2_disabled() {
    return env_flag("DSTK_TEST_NO_RENAMEAT2").value_or(false);
}

void hold_before_placing(const fs::path& final_path) {
    const std::string fifo(env_value("DSTK_TEST_HOLD_FIFO"));
    if (fifo.empty()) return;
    const std::string_view at = env_value("DSTK_TEST_HOLD_AT");
    if (!at.empty() && final_path.filename() != fs::path(at)) return;
    if (const UniqueFd w = UniqueFd::try_open(fifo, O_WRONLY)) {
        const std::string line = "placing " + final_path.string() + "\n";
        (void)!::write(w.get(), line.data(), line.size());
    }
    if (const UniqueFd r = UniqueFd::try_open(fifo, O_RDONLY)) {
        char buf[64];
        while (::read(r.get(), buf, sizeof buf) > 0) {
        }
    }
}

// ---- what may be replaced ---------------------------------------------------

// The names a dataset directory written by a dstk tool holds: dataset.json,
// the field files and parts it names, and dsgen's feature-major copies
// (images_SPLIT.bin, labels_SPLIT.bin). Read leniently (names only), so that
// a dataset whose manifest a newer check refuses can still be replaced.
std::set<std::string> dataset_entry_names(const fs::path& dir) {
    std::set<std::string> names{manifest_file_name};
    const nlohmann::json doc = parse_json(read_input_file(dir / manifest_file_name, "manifest", 64u << 20, O_NOFOLLOW));
    auto add = [&](const nlohmann::json& v) {
        if (v.is_object() && v.contains("file") && v["file"].is_string()) names.insert(v["file"]);
    };
    for (const auto& split : doc.at("splits")) {
        if (split.contains("name") && split["name"].is_string()) {
            names.insert("images_" + split["name"].get<std::string>() + ".bin");
            names.insert("labels_" + split["name"].get<std::string>() + ".bin");
        }
        for (const auto& field : split.at("fields")) {
            add(field);
            if (field.contains("parts") && field["parts"].is_array())
                for (const auto& part : field["parts"]) add(part);
        }
    }
    return names;
}

// Empty when `p` (of mode `mode`, from lstat) may be replaced by --force
// with a file or (`dir`) a directory, else why not: "is a symbolic link",
// "is a dataset that also holds 'notes.txt', ...".
std::string why_not_replaceable(const fs::path& p, mode_t mode, bool dir) {
    if (S_ISREG(mode)) return {};
    if (S_ISLNK(mode)) return "is a symbolic link";
    if (!S_ISDIR(mode)) return "is a device, pipe or socket";
    if (!dir) return "is a directory (a file output never replaces one)";
    std::error_code ec;
    fs::directory_iterator it(p, ec);
    if (ec) return "is a directory that cannot be listed (" + ec.message() + ")";
    if (it == fs::directory_iterator()) return {}; // an empty directory loses nothing
    std::error_code mec;
    if (!fs::exists(fs::symlink_status(p / manifest_file_name, mec)))
        return "is a directory but not a dataset (no " + std::string(manifest_file_name) + ")";
    std::set<std::string> names;
    try {
        names = dataset_entry_names(p);
    } catch (const std::exception& e) {
        return "is a directory whose " + std::string(manifest_file_name) + " cannot be read (" + e.what() + ")";
    }
    for (const auto& e : it) {
        const std::string name = e.path().filename().string();
        const auto st = e.symlink_status(ec);
        if (!names.count(name))
            return "is a dataset that also holds '" + name + "', which its " + std::string(manifest_file_name) +
                   " does not name";
        if (ec || !fs::is_regular_file(st)) return "is a dataset whose '" + name + "' is not a regular file";
    }
    return {};
}

[[noreturn]] void refuse_replacing(const fs::path& p, mode_t mode, bool dir, const std::string& why) {
    if (!S_ISREG(mode) && !S_ISDIR(mode))
        throw usage_error("output '" + p.string() + "' exists and " + why +
                          " (not a regular file or directory: a link, device or pipe is never replaced, --force or "
                          "not); choose another name, or - for stdout where the tool takes it");
    if (!dir) throw usage_error("output '" + p.string() + "' " + why + "; choose another name");
    throw usage_error("output '" + p.string() + "' " + why +
                      "; --force replaces only what a dstk tool wrote: move those files away, or choose another "
                      "name");
}

// ---- putting in place -------------------------------------------------------

bool is_lacking_flag(int err) {
    return err == EINVAL || err == ENOSYS || err == EOPNOTSUPP;
}

int rename_with(const fs::path& from, const fs::path& to, unsigned flags) {
    if (renameat2_disabled()) {
        errno = EINVAL;
        return -1;
    }
    return ::renameat2(AT_FDCWD, from.c_str(), AT_FDCWD, to.c_str(), flags);
}

// Renames `tmp` to `final_path` unless that name exists; false when it does.
// Without RENAME_NOREPLACE: a file is hard-linked (link fails on an existing
// name) then its temporary name unlinked; a directory takes the name by
// mkdir first (which fails on an existing name) and then replaces its own
// empty placeholder, which rename refuses once anything was put inside.
bool place_new(const fs::path& tmp, const fs::path& final_path, bool dir) {
    if (rename_with(tmp, final_path, RENAME_NOREPLACE) == 0) return true;
    if (errno == EEXIST) return false;
    if (!is_lacking_flag(errno)) throw_errno("cannot rename into", final_path.string());
    if (dir) {
        if (::mkdir(final_path.c_str(), 0700) != 0) {
            if (errno == EEXIST) return false;
            throw_errno("cannot create", final_path.string());
        }
        if (::rename(tmp.c_str(), final_path.c_str()) == 0) return true;
        if (errno == ENOTEMPTY || errno == EEXIST)
            throw usage_error("output '" + final_path.string() +
                              "' was created and filled by another process while this one was putting its output "
                              "there; nothing was replaced: choose another name");
        throw_errno("cannot rename into", final_path.string());
    }
    if (::link(tmp.c_str(), final_path.c_str()) == 0) {
        ::unlink(tmp.c_str());
        return true;
    }
    if (errno == EEXIST) return false;
    // No hard links either (FAT, some FUSE): claim the name, then rename over the claim.
    if (!UniqueFd::try_open(final_path, O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW, 0600)) {
        if (errno == EEXIST) return false;
        throw_errno("cannot create", final_path.string());
    }
    if (::rename(tmp.c_str(), final_path.c_str()) != 0) throw_errno("cannot rename into", final_path.string());
    return true;
}

// Swaps `tmp` in for the earlier output at `final_path` and checks, on what
// was swapped out, that it was one (it cannot change under us any more);
// else swaps back and refuses. Returns false when the name vanished meanwhile.
// Without RENAME_EXCHANGE the earlier output is first moved aside to `aside`.
bool replace_earlier(const fs::path& tmp, const fs::path& final_path, bool dir, fs::path& old, bool& exchanged) {
    struct stat st {};
    if (rename_with(tmp, final_path, RENAME_EXCHANGE) == 0) {
        if (::lstat(tmp.c_str(), &st) != 0) throw_errno("cannot stat", tmp.string());
        const std::string why = why_not_replaceable(tmp, st.st_mode, dir);
        if (!why.empty()) {
            if (rename_with(tmp, final_path, RENAME_EXCHANGE) != 0) throw_errno("cannot restore", final_path.string());
            refuse_replacing(final_path, st.st_mode, dir, why);
        }
        old = tmp;
        exchanged = true;
        return true;
    }
    if (errno == ENOENT) return false;
    if (!is_lacking_flag(errno)) throw_errno("cannot rename into", final_path.string());
    const fs::path aside = temp_sibling(final_path);
    if (::rename(final_path.c_str(), aside.c_str()) != 0) {
        if (errno == ENOENT) return false;
        throw_errno("cannot move aside", final_path.string());
    }
    if (::lstat(aside.c_str(), &st) != 0) throw_errno("cannot stat", aside.string());
    if (const std::string why = why_not_replaceable(aside, st.st_mode, dir); !why.empty()) {
        if (!place_new(aside, final_path, S_ISDIR(st.st_mode)))
            throw runtime_error("output '" + final_path.string() + "' " + why + " and was moved to '" + aside.string() +
                                "'; another process took its name meanwhile: move it back yourself");
        refuse_replacing(final_path, st.st_mode, dir, why);
    }
    if (!place_new(tmp, final_path, dir)) {
        throw usage_error("output '" + final_path.string() +
                          "' was written by another process while this one replaced it; the earlier output is in '" +
                          aside.string() + "', nothing was lost: choose another name");
    }
    old = aside;
    exchanged = false;
    return true;
}

// Every regular file in `dir`, then `dir` itself.
void sync_directory(const fs::path& dir) {
    for (const auto& entry : fs::directory_iterator(dir))
        if (entry.is_regular_file()) fsync_path(entry.path());
    fsync_path(dir);
}

// `base` with "-N" before its extension: model.safetensors -> model-2.safetensors.
fs::path numbered(const fs::path& base, unsigned n) {
    return base.parent_path() / (base.stem().string() + "-" + std::to_string(n) + base.extension().string());
}

} // namespace

void fsync_path(const fs::path& p) {
    const UniqueFd fd = UniqueFd::open(p, O_RDONLY, "open for fsync");
    if (::fsync(fd.get()) != 0 && errno != EINVAL && errno != EROFS) throw_errno("cannot fsync", p.string());
}

void write_all(int fd, const void* data, std::size_t len, long long offset, const fs::path& path) {
    auto p = static_cast<const char*>(data);
    while (len > 0) {
        const ssize_t n = offset < 0 ? ::write(fd, p, len) : ::pwrite(fd, p, len, offset);
        if (n < 0) {
            if (errno == EINTR) {
                throw_if_interrupted();
                continue;
            }
            throw_errno("cannot write", path.string());
        }
        p += n;
        len -= static_cast<std::size_t>(n);
        if (offset >= 0) offset += n;
    }
}

void read_all(int fd, void* data, std::size_t len, long long offset, const fs::path& path) {
    auto p = static_cast<char*>(data);
    while (len > 0) {
        const ssize_t n = offset < 0 ? ::read(fd, p, len) : ::pread(fd, p, len, offset);
        if (n < 0) {
            if (errno == EINTR) {
                throw_if_interrupted();
                continue;
            }
            throw_errno("cannot read", path.string());
        }
        if (n == 0)
            throw runtime_error("unexpected end of file in '" + path.string() + "' (" + std::to_string(len) +
                                " more bytes expected; file truncated?)");
        p += n;
        len -= static_cast<std::size_t>(n);
        if (offset >= 0) offset += n;
    }
}

void check_overwrite(const fs::path& final_path, bool force, bool directory) {
    struct stat st {};
    if (::lstat(final_path.c_str(), &st) != 0) return;
    const std::string why = why_not_replaceable(final_path, st.st_mode, directory);
    if (!S_ISREG(st.st_mode) && !S_ISDIR(st.st_mode)) refuse_replacing(final_path, st.st_mode, directory, why);
    if (!force)
        throw usage_error("output '" + final_path.string() +
                          "' already exists (refusing to overwrite it); use --force to replace it, or choose "
                          "another name");
    if (!why.empty()) refuse_replacing(final_path, st.st_mode, directory, why);
}

void check_free_disk(const fs::path& dir, std::uint64_t bytes) {
    const DiskInfo d = disk_info(dir);
    if (d.free < bytes)
        throw no_fit_error("not enough free disk at '" + dir.string() + "' (need " + format_bytes(bytes) + ", " +
                           format_bytes(d.free) + " free on " + d.mount_point +
                           "); free some space, write elsewhere, or use --force to skip this check");
}

namespace {

// The directory `o` is written in: its parent, or for an output that creates
// its directories the nearest one that exists.
fs::path writing_dir(const OutputName& o) {
    fs::path dir = parent_or_dot(o.path);
    std::error_code ec;
    while (o.creates_dirs && !fs::exists(fs::symlink_status(dir, ec)) && dir.has_relative_path() &&
           dir != dir.parent_path())
        dir = parent_or_dot(dir);
    return dir;
}

void check_writable_dir(const OutputName& o) {
    const fs::path dir = writing_dir(o);
    struct stat st {};
    std::string why, fix = "choose another path";
    if (::stat(dir.c_str(), &st) != 0) {
        const bool missing = errno == ENOENT;
        why = "directory '" + dir.string() + "' " + (missing ? "does not exist" : std::strerror(errno));
        if (missing) fix = "create it, or " + fix;
    } else if (!S_ISDIR(st.st_mode)) {
        why = "'" + dir.string() + "' is not a directory";
    } else if (::access(dir.c_str(), W_OK | X_OK) != 0) {
        why = "directory '" + dir.string() + "' is not writable: " + std::strerror(errno);
    }
    if (!why.empty()) throw usage_error("cannot write " + o.what + " '" + o.path.string() + "' (" + why + "); " + fix);
}

} // namespace

void check_output_paths(const std::vector<OutputName>& outputs) {
    std::vector<fs::path> seen;
    for (const OutputName& o : outputs) {
        std::error_code ec;
        const fs::path given = fs::absolute(without_trailing_slash(o.path));
        fs::path p = fs::weakly_canonical(given, ec); // links followed: two names of one file are one
        if (ec) p = given.lexically_normal();
        for (std::size_t i = 0; i < seen.size(); ++i)
            if (seen[i] == p)
                throw usage_error(outputs[i].what + " '" + outputs[i].path.string() + "' and " + o.what + " '" +
                                  o.path.string() +
                                  "' name the same path (one output would find the other in its place); give "
                                  "each its own");
        seen.push_back(p);
    }
    for (const OutputName& o : outputs) check_writable_dir(o);
}

AtomicOutput::AtomicOutput(fs::path final_path, Replace replace, bool directory)
    : final_(without_trailing_slash(std::move(final_path))), replace_(replace), directory_(directory) {
    if (replace_ != Replace::next_free) check_overwrite(final_, replace_ == Replace::earlier, directory_);
    remove_stale_staging(final_);
    tmp_ = temp_sibling(final_);
}

AtomicOutput::~AtomicOutput() = default;

void AtomicOutput::commit() {
    OutputSet set;
    set.add(*this);
    set.commit();
}

AtomicDir::AtomicDir(fs::path final_path, Replace replace) : AtomicOutput(std::move(final_path), replace, true) {
    register_temp_path(tmp_);
    std::error_code ec;
    if (!fs::create_directory(tmp_, ec)) {
        unregister_temp_path(tmp_);
        throw runtime_error("cannot create directory '" + tmp_.string() + "' (" + ec.message() + "); check that '" +
                            parent_or_dot(final_).string() + "' exists and is writable");
    }
}

AtomicDir::~AtomicDir() {
    if (!committed_) remove_quietly(tmp_);
    for (const fs::path& f : files_) unregister_temp_path(f);
    unregister_temp_path(tmp_);
}

fs::path AtomicDir::file(const std::string& name) {
    // The last guard against a name that would write outside the directory.
    if (name.empty() || name == "." || name == ".." || name.find('/') != std::string::npos)
        throw runtime_error("internal: '" + name + "' is not a file name inside '" + tmp_.string() + "'");
    fs::path p = tmp_ / name;
    register_temp_path(p);
    files_.push_back(p);
    return p;
}

void AtomicDir::sync() {
    sync_directory(tmp_);
}

AtomicFile::AtomicFile(fs::path final_path, Replace replace) : AtomicOutput(std::move(final_path), replace, false) {
    register_temp_path(tmp_);
    fd_ = UniqueFd::try_open(tmp_, O_WRONLY | O_CREAT | O_EXCL);
    if (!fd_) {
        const int err = errno;
        unregister_temp_path(tmp_);
        errno = err;
        throw_errno("cannot create", tmp_.string());
    }
}

AtomicFile::~AtomicFile() {
    fd_.reset();
    if (!committed_) ::unlink(tmp_.c_str());
    unregister_temp_path(tmp_);
}

void AtomicFile::write(const void* data, std::size_t len) {
    write_all(fd_.get(), data, len, -1, committed_ ? final_ : tmp_);
}

void AtomicFile::sync() {
    if (!fd_) return;
    if (::fsync(fd_.get()) != 0) throw_errno("cannot fsync", tmp_.string());
    if (!keep_open_ && ::close(fd_.release()) != 0) throw_errno("cannot close", tmp_.string());
}

namespace {

// Puts the synced `tmp` in place at `final_path` under `replace` (next_free
// may change `final_path`); `old` gets where a replaced earlier output waits.
void place(const fs::path& tmp, fs::path& final_path, fs::path& old, bool& exchanged, Replace replace, bool dir) {
    const fs::path wanted = final_path;
    hold_before_placing(final_path);
    for (unsigned n = 2;; ++n) {
        if (place_new(tmp, final_path, dir)) return;
        if (replace == Replace::earlier && replace_earlier(tmp, final_path, dir, old, exchanged)) return;
        if (replace == Replace::never)
            throw usage_error("output '" + final_path.string() +
                              "' already exists (another process wrote it while this one ran; nothing was "
                              "replaced); use --force to replace it, or choose another name");
        if (replace == Replace::next_free) {
            if (n > 10000) throw runtime_error("no free name like '" + numbered(wanted, n).string() + "'");
            final_path = numbered(wanted, n);
        }
    }
}

// Undoes place(): the output goes back to its temporary name (when it is
// still the one placed) and a replaced earlier output comes back.
void withdraw(const fs::path& tmp, const fs::path& final_path, const fs::path& old, bool exchanged, bool dir,
              ino_t ours) {
    struct stat st {};
    if (::lstat(final_path.c_str(), &st) != 0 || st.st_ino != ours) return;
    if (exchanged) {
        (void)::renameat2(AT_FDCWD, tmp.c_str(), AT_FDCWD, final_path.c_str(), RENAME_EXCHANGE);
        return;
    }
    if (::rename(final_path.c_str(), tmp.c_str()) != 0) return;
    try {
        if (!old.empty()) (void)place_new(old, final_path, dir);
    } catch (const Error&) {
    }
}

} // namespace

void OutputSet::commit() {
    for (AtomicOutput* o : outputs_) o->sync();
    std::vector<ino_t> ours;
    for (AtomicOutput* o : outputs_) {
        struct stat st {};
        if (::lstat(o->tmp_.c_str(), &st) != 0) throw_errno("cannot stat", o->tmp_.string());
        ours.push_back(st.st_ino);
    }
    std::size_t placed = 0;
    try {
        for (; placed < outputs_.size(); ++placed) {
            AtomicOutput& o = *outputs_[placed];
            place(o.tmp_, o.final_, o.old_, o.exchanged_, o.replace_, o.directory_);
        }
    } catch (...) {
        while (placed-- > 0) {
            AtomicOutput& o = *outputs_[placed];
            withdraw(o.tmp_, o.final_, o.old_, o.exchanged_, o.directory_, ours[placed]);
            o.old_.clear();
        }
        throw;
    }
    for (AtomicOutput* o : outputs_) {
        o->committed_ = true;
        if (!o->old_.empty()) remove_quietly(o->old_);
        unregister_temp_path(o->tmp_);
    }
    std::set<fs::path> parents;
    for (AtomicOutput* o : outputs_) parents.insert(parent_or_dot(o->final_));
    for (const fs::path& p : parents) fsync_path(p);
}

StagedDir::StagedDir(fs::path staged, fs::path final_path, Replace replace)
    : AtomicOutput(std::move(final_path), replace, true) {
    tmp_ = std::move(staged);
}

void StagedDir::sync() {
    sync_directory(tmp_);
}

} // namespace dstk
