#include "resumable.hpp"

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <fcntl.h>
#include <set>
#include <sys/stat.h>
#include <unistd.h>

#include "dstk/atomic_output.hpp"
#include "dstk/checksum.hpp"
#include "dstk/error.hpp"
#include "dstk/fd.hpp"
#include "dstk/npy.hpp"
#include "dstk/signals.hpp"
#include "dstk/thread_pool.hpp"

namespace fs = std::filesystem;

namespace dstk::convert {
namespace {

// A field file finished by an earlier run.
class FinishedSink final : public FieldSink {
  public:
    FinishedSink(fs::path path, FieldInfo info) : path_(std::move(path)), info_(std::move(info)) {}
    void append(const void*, std::uint64_t) override {
        throw runtime_error("internal: samples sent to the finished file '" + path_.string() + "'");
    }
    FieldInfo finish() override {
        info_.bytes = fs::file_size(path_);
        info_.checksum = file_checksum(path_);
        return info_;
    }

  private:
    fs::path path_;
    FieldInfo info_;
};

// An .npy field file that can be reopened after `keep` samples.
class ResumableNpySink final : public FieldSink {
  public:
    ResumableNpySink(fs::path path, FieldInfo info, std::uint64_t samples, std::uint64_t keep)
        : path_(std::move(path)), info_(std::move(info)) {
        std::vector<std::uint64_t> dims{samples};
        dims.insert(dims.end(), info_.shape.dims.begin(), info_.shape.dims.end());
        const std::string header = make_npy_header(info_.dtype, dims);
        const std::uint64_t keep_bytes = header.size() + keep * info_.sample_bytes();
        fd_ = UniqueFd::open(path_, O_RDWR | O_CREAT | O_NOFOLLOW, "cannot open");
        if (::ftruncate(fd_.get(), static_cast<off_t>(keep ? keep_bytes : 0)) != 0)
            throw_errno("cannot truncate", path_.string());
        if (keep == 0) {
            write_all(fd_.get(), header.data(), header.size(), 0, path_);
            hash_.update(header.data(), header.size());
        } else {
            std::vector<std::uint8_t> buf;
            for (std::uint64_t at = 0; at < keep_bytes; at += buf.size()) {
                throw_if_interrupted();
                buf.resize(std::min<std::uint64_t>(4 << 20, keep_bytes - at));
                read_all(fd_.get(), buf.data(), buf.size(), static_cast<long long>(at), path_);
                if (at == 0 && std::memcmp(buf.data(), header.data(), std::min(buf.size(), header.size())) != 0)
                    throw runtime_error(path_.string() + ": partial output has a different header; remove the "
                                                         "partial directory and convert again");
                hash_.update(buf.data(), buf.size());
            }
        }
        if (::lseek(fd_.get(), static_cast<off_t>(keep_bytes), SEEK_SET) < 0)
            throw_errno("cannot seek", path_.string());
        bytes_ = keep_bytes;
    }
    void append(const void* data, std::uint64_t count) override {
        const std::uint64_t n = count * info_.sample_bytes();
        write_all(fd_.get(), data, n, -1, path_);
        hash_.update(data, n);
        bytes_ += n;
    }
    FieldInfo finish() override {
        if (::close(fd_.release()) != 0) throw_errno("cannot close", path_.string());
        info_.bytes = bytes_;
        info_.checksum = hash_.hex();
        return info_;
    }

  private:
    fs::path path_;
    FieldInfo info_;
    UniqueFd fd_;
    std::uint64_t bytes_ = 0;
    Xxh64 hash_;
};

} // namespace

ResumableOutput::ResumableOutput(const fs::path& final_path, const std::string& fingerprint, bool force,
                                 const OutputOptions& out, const std::vector<std::string>& field_files)
    : final_(final_path), fingerprint_(fingerprint) {
    while (!final_.has_filename() && final_.has_parent_path() && final_ != final_.root_path())
        final_ = final_.parent_path();
    check_overwrite(final_, force, true);
    const fs::path parent = final_.parent_path().empty() ? fs::path(".") : final_.parent_path();
    dir_ = parent / ("." + final_.filename().string() + ".partial");
    const fs::path state = dir_ / "resume.json";
    std::error_code ec;
    const bool staged = fs::exists(fs::symlink_status(dir_, ec));
    if (staged) check_entries({});
    if (fs::exists(fs::symlink_status(state, ec))) {
        const std::string saved = read_input_file(state, "resume state", 1 << 20, O_NOFOLLOW);
        if (saved != fingerprint)
            throw usage_error("'" + dir_.string() +
                              "' holds a partial conversion with different settings (input, "
                              "dtype, mapping, compression, chunks or split); run the same command with --resume, "
                              "or remove that directory");
        resuming_ = true;
    }
    if (staged) check_entries(field_files);
    if (resuming_) {
        note(out, "resuming the partial conversion in " + dir_.string());
    } else {
        fs::create_directories(dir_, ec);
        if (ec) throw runtime_error("cannot create '" + dir_.string() + "' (" + ec.message() + ")");
        keep_for_resume();
    }
}

// With no `field_files`, only the directory itself and resume.json are checked.
void ResumableOutput::check_entries(const std::vector<std::string>& field_files) const {
    const std::string fix = "; --resume continues only what dsconvert staged there: remove '" + dir_.string() +
                            "' (rm -r) and convert again";
    struct stat st {};
    if (::lstat(dir_.c_str(), &st) != 0) throw_errno("cannot stat", dir_.string());
    if (!S_ISDIR(st.st_mode) || st.st_uid != ::geteuid())
        throw usage_error("'" + dir_.string() + "' is not a directory of this user" + fix);
    std::set<std::string> ours(field_files.begin(), field_files.end());
    ours.insert({"resume.json", manifest_file_name});
    for (const auto& e : fs::directory_iterator(dir_)) {
        const std::string name = e.path().filename().string();
        // The temporary of resume.json or dataset.json of a run killed by SIGKILL: the next one removes it.
        const bool staging = name.rfind(".resume.json.tmp-", 0) == 0 || name.rfind(".dataset.json.tmp-", 0) == 0;
        if (field_files.empty() && name != "resume.json") continue;
        if (::lstat(e.path().c_str(), &st) != 0) throw_errno("cannot stat", e.path().string());
        const char* what = !ours.count(name) && !staging ? "not a file dsconvert writes there"
                           : S_ISLNK(st.st_mode)         ? "a symbolic link"
                           : !S_ISREG(st.st_mode)        ? "not a regular file"
                           : st.st_uid != ::geteuid()    ? "owned by another user"
                                                         : nullptr;
        if (what) throw usage_error("'" + e.path().string() + "' is " + what + fix);
    }
}

void ResumableOutput::keep_for_resume() {
    AtomicFile f(dir_ / "resume.json", true);
    f.write(fingerprint_.data(), fingerprint_.size());
    f.commit();
}

std::uint64_t ResumableOutput::done(const FieldInfo& fi, std::uint64_t samples) const {
    if (!resuming_) return 0;
    const fs::path p = dir_ / fi.file;
    std::error_code ec;
    const auto size = fs::file_size(p, ec);
    if (ec) return 0;
    if (fi.storage == Storage::zstd_chunked) {
        try {
            ChunkedReader r(p);
            if (r.samples() == samples && r.sample_bytes() == fi.sample_bytes() &&
                r.chunk_samples() == fi.chunk_samples)
                return samples;
        } catch (const Error&) {
        }
        return std::min(samples, ChunkedWriter::complete_samples(p, fi.sample_bytes(), fi.chunk_samples));
    }
    std::vector<std::uint64_t> dims{samples};
    dims.insert(dims.end(), fi.shape.dims.begin(), fi.shape.dims.end());
    const std::uint64_t header = make_npy_header(fi.dtype, dims).size();
    return size < header ? 0 : std::min(samples, (size - header) / fi.sample_bytes());
}

std::unique_ptr<FieldSink> ResumableOutput::sink(const FieldInfo& fi, std::uint64_t samples, std::uint64_t keep,
                                                 int level, ThreadPool& pool) {
    const fs::path p = dir_ / fi.file;
    if (keep == samples && samples > 0) return std::make_unique<FinishedSink>(p, fi);
    if (fi.storage == Storage::npy) return std::make_unique<ResumableNpySink>(p, fi, samples, keep);
    return std::make_unique<ChunkedSink>(p, fi, level, pool, keep);
}

void ResumableOutput::stage(const Manifest& m, bool force) {
    staged_.emplace(dir_, final_, replace_when(force)); // checks OUTPUT again while resume.json is there
    const std::string text = serialize_manifest(m);
    {
        AtomicFile f(dir_ / manifest_file_name, true);
        f.write(text.data(), text.size());
        f.commit();
    }
    fs::remove(dir_ / "resume.json");
}

} // namespace dstk::convert
