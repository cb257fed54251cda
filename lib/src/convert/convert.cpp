// dsconvert's pipeline: source streams -> block conversion (parallel) ->
// optional external shuffle -> router over output splits -> field sinks
// (.npy, zstd-chunked, or one raw/.npy file). Every stage works on bounded
// blocks of samples.
#include "dstk/convert/convert.hpp"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <fcntl.h>
#include <fstream>
#include <functional>
#include <future>
#include <sstream>
#include <unistd.h>

#include "dstk/atomic_output.hpp"
#include "dstk/chunked_file.hpp"
#include "dstk/dataset.hpp"
#include "dstk/dataset_writer.hpp"
#include "dstk/error.hpp"
#include "dstk/npy.hpp"
#include "dstk/rng.hpp"
#include "dstk/signals.hpp"
#include "dstk/thread_pool.hpp"
#include "dstk/units.hpp"

namespace fs = std::filesystem;

namespace dstk {
namespace {

constexpr std::uint64_t block_target_bytes = 16ull << 20; // input + output bytes per block, all fields
constexpr std::uint64_t bucket_target_bytes = 64ull << 20;
constexpr std::uint64_t convert_grain = 1ull << 16; // elements per parallel conversion task

// ---- sinks ------------------------------------------------------------------

class FieldSink {
  public:
    virtual ~FieldSink() = default;
    virtual void append(const void* data, std::uint64_t count) = 0;
    virtual FieldInfo finish() = 0;
    // Samples a sink gathers before it writes (0: it writes as it goes).
    virtual std::uint64_t batch_samples() const { return 0; }
    virtual void limit_batch_samples(std::uint64_t) {}
};

// The fields of a split reach the disk together: a zstd-chunked label field
// (4-byte samples) would otherwise gather millions of samples per write while
// the images write every few thousand, and an interrupted run could resume
// only from the last point every field had written.
void align_batches(std::vector<std::unique_ptr<FieldSink>>& sinks) {
    std::uint64_t least = 0;
    for (const auto& s : sinks)
        if (const std::uint64_t b = s->batch_samples(); b && (!least || b < least)) least = b;
    if (least)
        for (auto& s : sinks) s->limit_batch_samples(least);
}

class NpySink final : public FieldSink {
  public:
    explicit NpySink(std::unique_ptr<NpyFieldWriter> w) : w_(std::move(w)) {}
    void append(const void* data, std::uint64_t count) override { w_->append(data, count); }
    FieldInfo finish() override { return w_->finish(); }

  private:
    std::unique_ptr<NpyFieldWriter> w_;
};

class ChunkedSink final : public FieldSink {
  public:
    ChunkedSink(fs::path path, FieldInfo info, int level, ThreadPool& pool, std::uint64_t keep = 0)
        : info_(std::move(info)),
          w_(keep ? ChunkedWriter::resume(std::move(path), info_.sample_bytes(), info_.chunk_samples, level, pool, keep)
                  : ChunkedWriter(std::move(path), info_.sample_bytes(), info_.chunk_samples, level, pool)) {}
    void append(const void* data, std::uint64_t count) override { w_.append(data, count); }
    std::uint64_t batch_samples() const override { return w_.batch_samples(); }
    void limit_batch_samples(std::uint64_t samples) override { w_.limit_batch_samples(samples); }
    FieldInfo finish() override {
        info_.checksum = w_.finish();
        info_.bytes = w_.file_bytes();
        return info_;
    }

  private:
    FieldInfo info_;
    ChunkedWriter w_;
};

// The .npy header of `samples` samples of `shape`.
std::string npy_header_for(DType dtype, const Shape& shape, std::uint64_t samples) {
    std::vector<std::uint64_t> dims{samples};
    dims.insert(dims.end(), shape.dims.begin(), shape.dims.end());
    return make_npy_header(dtype, dims);
}

// A .npy file written before its sample count was known (stdin) starts with
// the header of 0 samples; this puts the real header in its place. A longer
// count can push the header over a 64-byte boundary: the data then moves up
// by that much, block by block from the end (bounded memory).
void rewrite_npy_header(const fs::path& path, std::uint64_t old_len, const std::string& header,
                        std::uint64_t data_bytes) {
    if (header.size() < old_len) throw runtime_error("internal: .npy header shrank in '" + path.string() + "'");
    const int fd = ::open(path.c_str(), O_RDWR | O_CLOEXEC);
    if (fd < 0) throw_errno("cannot reopen", path.string());
    struct Closer {
        int fd;
        ~Closer() { ::close(fd); }
    } closer{fd};
    if (header.size() > old_len) {
        std::vector<std::uint8_t> buf(std::min<std::uint64_t>(data_bytes, 4ull << 20));
        for (std::uint64_t end = data_bytes; end > 0;) {
            throw_if_interrupted();
            const std::uint64_t n = std::min<std::uint64_t>(buf.size(), end), at = end - n;
            read_all(fd, buf.data(), n, static_cast<long long>(old_len + at), path);
            write_all(fd, buf.data(), n, static_cast<long long>(header.size() + at), path);
            end = at;
        }
    }
    write_all(fd, header.data(), header.size(), 0, path);
}

// A dataset's .npy field file of unknown length (stdin): provisional header,
// fixed by finish(), which then checksums the finished file.
class UnknownCountNpySink final : public FieldSink {
  public:
    UnknownCountNpySink(fs::path path, FieldInfo info) : path_(std::move(path)), info_(std::move(info)) {
        header_ = npy_header_for(info_.dtype, info_.shape, 0).size();
        fd_ = ::open(path_.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
        if (fd_ < 0) throw_errno("cannot create", path_.string());
        const std::string h = npy_header_for(info_.dtype, info_.shape, 0);
        write_all(fd_, h.data(), h.size(), 0, path_);
    }
    ~UnknownCountNpySink() override {
        if (fd_ >= 0) ::close(fd_);
    }
    void append(const void* data, std::uint64_t count) override {
        write_all(fd_, data, count * info_.sample_bytes(), static_cast<long long>(header_ + bytes_), path_);
        bytes_ += count * info_.sample_bytes();
        written_ += count;
    }
    FieldInfo finish() override {
        const std::string h = npy_header_for(info_.dtype, info_.shape, written_);
        const int fd = fd_;
        fd_ = -1;
        if (::close(fd) != 0) throw_errno("cannot close", path_.string());
        rewrite_npy_header(path_, header_, h, bytes_);
        info_.bytes = h.size() + bytes_;
        info_.checksum = file_checksum(path_);
        return info_;
    }

  private:
    fs::path path_;
    FieldInfo info_;
    int fd_ = -1;
    std::uint64_t header_ = 0, bytes_ = 0, written_ = 0;
};

// One .npy or raw file (sample-major, or feature-major for raw). With no
// known count (stdin), a .npy output gets its header at finish().
class FileSink final : public FieldSink {
  public:
    FileSink(const fs::path& out, bool force, DType dtype, const Shape& shape, std::optional<std::uint64_t> samples,
             bool npy, Layout layout)
        : file_(out, force), sample_bytes_(sample_bytes(shape, dtype)), elem_(dtype_size(dtype)),
          features_(shape.numel()), samples_(samples.value_or(0)), count_known_(samples.has_value()), npy_(npy),
          layout_(layout) {
        if (layout_ == Layout::feature_major && !count_known_)
            throw usage_error("a feature-major output needs the sample count, which stdin does not give; write a "
                              "sample-major output, or convert from a file");
        if (npy) {
            const std::string h = npy_header_for(dtype, shape, samples_);
            file_.write(h.data(), h.size());
            header_ = h.size();
        }
        info_.dtype = dtype;
        info_.shape = shape;
    }
    void append(const void* data, std::uint64_t count) override {
        if (layout_ == Layout::sample_major) {
            file_.write(data, count * sample_bytes_);
        } else {
            tmp_.resize(count * elem_);
            const auto* in = static_cast<const std::uint8_t*>(data);
            for (std::uint64_t f = 0; f < features_; ++f) {
                for (std::uint64_t s = 0; s < count; ++s)
                    std::memcpy(tmp_.data() + s * elem_, in + (s * features_ + f) * elem_, elem_);
                write_all(file_.fd(), tmp_.data(), tmp_.size(),
                          static_cast<long long>(header_ + (f * samples_ + written_) * elem_), file_.tmp_path());
            }
        }
        written_ += count;
    }
    FieldInfo finish() override {
        if (npy_ && !count_known_) {
            const std::string h = npy_header_for(info_.dtype, info_.shape, written_);
            rewrite_npy_header(file_.tmp_path(), header_, h, written_ * sample_bytes_);
            header_ = h.size();
        }
        file_.commit();
        info_.bytes = header_ + written_ * sample_bytes_;
        return info_;
    }

  private:
    AtomicFile file_;
    std::uint64_t sample_bytes_, elem_, features_, samples_;
    bool count_known_, npy_;
    Layout layout_;
    std::uint64_t header_ = 0, written_ = 0;
    std::vector<std::uint8_t> tmp_;
    FieldInfo info_;
};

// Drops what it is given: fields and splits a single-file output leaves out.
class NullSink final : public FieldSink {
  public:
    void append(const void*, std::uint64_t) override {}
    FieldInfo finish() override { return {}; }
};

// ---- resumable dataset output (--resume) ------------------------------------
//
// The output is staged in .OUTPUT.partial/ (not removed on failure) with a
// resume.json holding the conversion's settings. A rerun with the same
// settings inspects the files: complete splits are kept, the split in
// progress continues after its last complete chunk (npy: last whole sample),
// later splits start over.

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
        fd_ = ::open(path_.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644);
        if (fd_ < 0) throw_errno("cannot open", path_.string());
        if (::ftruncate(fd_, static_cast<off_t>(keep ? keep_bytes : 0)) != 0)
            throw_errno("cannot truncate", path_.string());
        if (keep == 0) {
            write_all(fd_, header.data(), header.size(), 0, path_);
            hash_.update(header.data(), header.size());
        } else {
            std::vector<std::uint8_t> buf;
            for (std::uint64_t at = 0; at < keep_bytes; at += buf.size()) {
                throw_if_interrupted();
                buf.resize(std::min<std::uint64_t>(4 << 20, keep_bytes - at));
                read_all(fd_, buf.data(), buf.size(), static_cast<long long>(at), path_);
                if (at == 0 && std::memcmp(buf.data(), header.data(), std::min(buf.size(), header.size())) != 0)
                    throw runtime_error(path_.string() + ": partial output has a different header; remove the "
                                                         "partial directory and convert again");
                hash_.update(buf.data(), buf.size());
            }
        }
        if (::lseek(fd_, static_cast<off_t>(keep_bytes), SEEK_SET) < 0) throw_errno("cannot seek", path_.string());
        bytes_ = keep_bytes;
    }
    ~ResumableNpySink() override {
        if (fd_ >= 0) ::close(fd_);
    }
    void append(const void* data, std::uint64_t count) override {
        const std::uint64_t n = count * info_.sample_bytes();
        write_all(fd_, data, n, -1, path_);
        hash_.update(data, n);
        bytes_ += n;
    }
    FieldInfo finish() override {
        const int fd = fd_;
        fd_ = -1;
        if (::close(fd) != 0) throw_errno("cannot close", path_.string());
        info_.bytes = bytes_;
        info_.checksum = hash_.hex();
        return info_;
    }

  private:
    fs::path path_;
    FieldInfo info_;
    int fd_ = -1;
    std::uint64_t bytes_ = 0;
    Xxh64 hash_;
};

class ResumableOutput {
  public:
    ResumableOutput(const fs::path& final_path, const std::string& fingerprint, bool force, const OutputOptions& out)
        : final_(final_path) {
        while (!final_.has_filename() && final_.has_parent_path() && final_ != final_.root_path())
            final_ = final_.parent_path();
        check_overwrite(final_, force);
        const fs::path parent = final_.parent_path().empty() ? fs::path(".") : final_.parent_path();
        dir_ = parent / ("." + final_.filename().string() + ".partial");
        const fs::path state = dir_ / "resume.json";
        if (fs::exists(state)) {
            std::ifstream in(state);
            const std::string saved{std::istreambuf_iterator<char>(in), {}};
            if (saved != fingerprint)
                throw usage_error("'" + dir_.string() +
                                  "' holds a partial conversion with different settings (input, "
                                  "dtype, mapping, compression, chunks or split); run the same command with --resume, "
                                  "or remove that directory");
            resuming_ = true;
            note(out, "resuming the partial conversion in " + dir_.string());
        } else {
            std::error_code ec;
            fs::create_directories(dir_, ec);
            if (ec) throw runtime_error("cannot create '" + dir_.string() + "' (" + ec.message() + ")");
            AtomicFile f(state, true);
            f.write(fingerprint.data(), fingerprint.size());
            f.commit();
        }
    }
    const fs::path& dir() const { return dir_; }
    bool resuming() const { return resuming_; }

    // Samples of `fi` already on disk in a usable state (npy: whole samples;
    // chunked: complete chunks, or all of them when the file is finished).
    std::uint64_t done(const FieldInfo& fi, std::uint64_t samples) const {
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

    std::unique_ptr<FieldSink> sink(const FieldInfo& fi, std::uint64_t samples, std::uint64_t keep, int level,
                                    ThreadPool& pool) {
        const fs::path p = dir_ / fi.file;
        if (keep == samples && samples > 0) return std::make_unique<FinishedSink>(p, fi);
        if (fi.storage == Storage::npy) return std::make_unique<ResumableNpySink>(p, fi, samples, keep);
        return std::make_unique<ChunkedSink>(p, fi, level, pool, keep);
    }

    void commit(const Manifest& m, bool force) {
        const std::string text = serialize_manifest(m);
        {
            AtomicFile f(dir_ / manifest_file_name, true);
            f.write(text.data(), text.size());
            f.commit();
        }
        fs::remove(dir_ / "resume.json");
        for (const auto& e : fs::directory_iterator(dir_))
            if (e.is_regular_file()) fsync_path(e.path());
        std::error_code ec;
        if (fs::exists(fs::symlink_status(final_, ec))) {
            check_overwrite(final_, force);
            fs::remove_all(final_);
        }
        if (::rename(dir_.c_str(), final_.c_str()) != 0) throw_errno("cannot rename into", final_.string());
        fsync_path(final_.parent_path().empty() ? fs::path(".") : final_.parent_path());
    }

  private:
    fs::path final_, dir_;
    bool resuming_ = false;
};

// ---- plan -------------------------------------------------------------------

struct FieldPlan {
    std::string name;
    DType in = DType::u8, out = DType::u8;
    Shape shape;
    ValueMapping map;
    bool convert = false;
    std::uint64_t in_bytes = 0, out_bytes = 0; // per sample
    ConversionStats stats;
};

// The manifest entry of field `p` in output split `split`: zstd-chunked
// storage with `chunk_samples` per chunk, else (0) .npy.
FieldInfo output_field(const std::string& split, const FieldPlan& p, std::uint64_t chunk_samples) {
    FieldInfo fi;
    fi.name = p.name;
    fi.dtype = p.out;
    fi.shape = p.shape;
    fi.storage = chunk_samples ? Storage::zstd_chunked : Storage::npy;
    fi.file = split + "_" + p.name + (chunk_samples ? ".zst" : ".npy");
    fi.chunk_samples = chunk_samples;
    return fi;
}

struct OutSplit {
    std::string name;
    std::uint64_t samples = 0;
    std::vector<std::unique_ptr<FieldSink>> sinks; // empty when this split is not written
    std::uint64_t written = 0;
};

// Sends consecutive samples to the output splits in order.
class Router {
  public:
    Router(std::vector<OutSplit*> outs, const std::vector<FieldPlan>& fields)
        : outs_(std::move(outs)), fields_(fields) {}
    void route(const std::vector<const std::uint8_t*>& data, std::uint64_t count) {
        std::uint64_t done = 0;
        while (done < count) {
            while (cur_ < outs_.size() && outs_[cur_]->written == outs_[cur_]->samples) ++cur_;
            if (cur_ == outs_.size()) throw runtime_error("internal: more samples than the output splits hold");
            OutSplit& o = *outs_[cur_];
            const std::uint64_t take = std::min(count - done, o.samples - o.written);
            for (std::size_t f = 0; f < o.sinks.size(); ++f)
                o.sinks[f]->append(data[f] + done * fields_[f].out_bytes, take);
            o.written += take;
            done += take;
        }
    }

  private:
    std::vector<OutSplit*> outs_;
    const std::vector<FieldPlan>& fields_;
    std::size_t cur_ = 0;
};

// Converts one block of every field on the pool; the task partition depends
// only on the block, so the stats are the same whatever the thread count.
void convert_block(std::vector<FieldPlan>& fields, const std::vector<std::vector<std::uint8_t>>& in,
                   std::vector<std::vector<std::uint8_t>>& out, std::uint64_t count, ThreadPool& pool) {
    for (std::size_t f = 0; f < fields.size(); ++f) {
        FieldPlan& p = fields[f];
        if (!p.convert) continue;
        const std::uint64_t n = count * p.shape.numel();
        out[f].resize(count * p.out_bytes);
        const std::uint64_t tasks = (n + convert_grain - 1) / convert_grain;
        std::vector<ConversionStats> part(tasks);
        const std::size_t ei = dtype_size(p.in), eo = dtype_size(p.out);
        pool.parallel_for(tasks, [&](std::uint64_t t) {
            const std::uint64_t a = t * convert_grain, b = std::min(n, a + convert_grain);
            convert_elements(p.in, p.out, in[f].data() + a * ei, out[f].data() + a * eo, b - a, p.map, part[t]);
        });
        for (const auto& s : part) p.stats.merge(s);
    }
}

// External-memory shuffle: records (all fields of a sample, converted) are
// scattered into buckets on disk by a hash of (seed, sample index), then each
// bucket is loaded and permuted in memory. Uniform, deterministic, and memory
// bounded by one bucket.
class Shuffler {
  public:
    Shuffler(const fs::path& dir, std::uint64_t seed, std::uint64_t samples, const std::vector<FieldPlan>& fields)
        : dir_(dir), seed_(seed), fields_(fields) {
        for (const auto& f : fields) record_ += f.out_bytes;
        const std::uint64_t total = checked_mul(samples, record_, "shuffle size");
        buckets_ = std::max<std::uint64_t>(1, (total + bucket_target_bytes - 1) / bucket_target_bytes);
        buffer_cap_ =
            std::max<std::uint64_t>(record_, std::min<std::uint64_t>(1 << 20, bucket_target_bytes / buckets_));
        for (std::uint64_t b = 0; b < buckets_; ++b) {
            paths_.push_back(dir_ / ("shuffle-" + std::to_string(b)));
            register_temp_path(paths_.back());
            const int fd = ::open(paths_.back().c_str(), O_RDWR | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
            if (fd < 0) throw_errno("cannot create shuffle bucket", paths_.back().string());
            fds_.push_back(fd);
        }
        buffers_.resize(buckets_);
        counts_.assign(buckets_, 0);
    }
    ~Shuffler() {
        for (std::size_t b = 0; b < fds_.size(); ++b) {
            if (fds_[b] >= 0) ::close(fds_[b]);
            ::unlink(paths_[b].c_str());
            unregister_temp_path(paths_[b]);
        }
    }
    void add(const std::vector<const std::uint8_t*>& data, std::uint64_t count) {
        std::vector<std::uint8_t> rec(record_);
        for (std::uint64_t s = 0; s < count; ++s, ++next_) {
            const std::uint64_t b = (std::uint64_t{philox(seed_, 0x5348554646ull, next_)[0]} * buckets_) >> 32;
            auto& buf = buffers_[b];
            for (std::size_t f = 0; f < fields_.size(); ++f)
                buf.insert(buf.end(), data[f] + s * fields_[f].out_bytes, data[f] + (s + 1) * fields_[f].out_bytes);
            ++counts_[b];
            if (buf.size() >= buffer_cap_) spill(b);
        }
    }
    // Emits every sample, shuffled, in blocks of at most `block` samples.
    void drain(Router& router, std::uint64_t block) {
        for (std::uint64_t b = 0; b < buckets_; ++b) spill(b);
        std::vector<std::vector<std::uint8_t>> fields(fields_.size());
        for (std::uint64_t b = 0; b < buckets_; ++b) {
            throw_if_interrupted();
            const std::uint64_t n = counts_[b];
            std::vector<std::uint8_t> all(n * record_);
            read_all(fds_[b], all.data(), all.size(), 0, paths_[b]);
            ::close(fds_[b]);
            fds_[b] = -1;
            ::unlink(paths_[b].c_str());
            std::vector<std::uint64_t> perm(n);
            for (std::uint64_t i = 0; i < n; ++i) perm[i] = i;
            CounterRng rng(seed_, 1 + b);
            for (std::uint64_t i = n; i > 1; --i) std::swap(perm[i - 1], perm[rng.below(i)]);
            for (std::uint64_t s0 = 0; s0 < n; s0 += block) {
                const std::uint64_t m = std::min(block, n - s0);
                std::vector<const std::uint8_t*> ptrs;
                for (std::size_t f = 0, at = 0; f < fields_.size(); at += fields_[f].out_bytes, ++f) {
                    fields[f].resize(m * fields_[f].out_bytes);
                    for (std::uint64_t s = 0; s < m; ++s)
                        std::memcpy(fields[f].data() + s * fields_[f].out_bytes,
                                    all.data() + perm[s0 + s] * record_ + at, fields_[f].out_bytes);
                    ptrs.push_back(fields[f].data());
                }
                router.route(ptrs, m);
            }
        }
    }

  private:
    void spill(std::uint64_t b) {
        auto& buf = buffers_[b];
        if (buf.empty()) return;
        write_all(fds_[b], buf.data(), buf.size(), -1, paths_[b]);
        buf.clear();
    }

    fs::path dir_;
    std::uint64_t seed_;
    const std::vector<FieldPlan>& fields_;
    std::uint64_t record_ = 0, buckets_ = 0, buffer_cap_ = 0, next_ = 0;
    std::vector<fs::path> paths_;
    std::vector<int> fds_;
    std::vector<std::vector<std::uint8_t>> buffers_;
    std::vector<std::uint64_t> counts_;
};

int parse_compress(const std::string& text, bool& zstd) {
    if (text == "none") {
        zstd = false;
        return 0;
    }
    zstd = true;
    if (text == "zstd") return chunked_default_level;
    if (text.rfind("zstd:", 0) == 0) {
        const std::string lv = text.substr(5);
        char* end = nullptr;
        const long v = std::strtol(lv.c_str(), &end, 10);
        if (!lv.empty() && *end == 0 && v >= zstd_min_level() && v <= zstd_max_level() && v != 0)
            return static_cast<int>(v);
        throw usage_error("invalid --compress level '" + lv + "' (zstd levels are " + std::to_string(zstd_min_level()) +
                          ".." + std::to_string(zstd_max_level()) + ", not 0); e.g. --compress zstd:3");
    }
    throw usage_error("invalid --compress '" + text + "' (expected none, zstd or zstd:LEVEL)");
}

double parse_number(const std::string& s, const std::string& what) {
    char* end = nullptr;
    const double v = std::strtod(s.c_str(), &end);
    if (s.empty() || *end != 0 || !std::isfinite(v))
        throw usage_error("invalid " + what + " '" + s + "' (not a number)");
    return v;
}

std::string field_summary(const FieldPlan& p) {
    std::string s = p.name + ": " + std::string(dtype_name(p.in));
    if (p.convert) s += " -> " + std::string(dtype_name(p.out));
    return s;
}

void write_report_file(const fs::path& path, const nlohmann::json& j, bool force) {
    AtomicFile f(path, force);
    const std::string text = j.dump(2) + "\n";
    f.write(text.data(), text.size());
    f.commit();
}

void run_verify(const ConvertOptions& o) {
    const auto start = std::chrono::steady_clock::now();
    const Dataset d = Dataset::open(o.input);
    ThreadPool pool(o.threads);
    std::uint64_t files = 0, bytes = 0;
    for (const auto& split : d.manifest().splits)
        for (const auto& field : split.fields) {
            throw_if_interrupted();
            if (field.storage == Storage::zstd_chunked) ChunkedReader(o.input / field.file).verify(&pool);
            d.reader(split.name, field.name).verify();
            ++files;
            bytes += field.bytes;
        }
    const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    if (o.out.json) {
        nlohmann::json j = {
            {"dataset", o.input.string()}, {"ok", true}, {"files", files}, {"bytes", bytes}, {"seconds", secs}};
        std::printf("%s\n", j.dump(2).c_str());
    } else {
        std::printf("%s: OK (%llu files, %s verified in %s)\n", o.input.string().c_str(),
                    static_cast<unsigned long long>(files), format_bytes(bytes).c_str(), format_duration(secs).c_str());
    }
}

} // namespace

std::vector<SplitFraction> parse_split_fractions(const std::string& text) {
    std::vector<SplitFraction> out;
    std::stringstream ss(text);
    std::string item;
    double sum = 0;
    while (std::getline(ss, item, ',')) {
        const auto eq = item.find('=');
        if (eq == std::string::npos || eq == 0)
            throw usage_error("invalid --split item '" + item + "' (expected NAME=FRACTION, e.g. train=0.9,test=0.1)");
        SplitFraction f{item.substr(0, eq), parse_number(item.substr(eq + 1), "--split fraction")};
        if (!(f.fraction > 0) || f.fraction > 1)
            throw usage_error("invalid --split fraction for '" + f.name + "' (must be in (0, 1])");
        for (const auto& g : out)
            if (g.name == f.name) throw usage_error("--split names '" + f.name + "' twice");
        sum += f.fraction;
        out.push_back(f);
    }
    if (out.empty()) throw usage_error("empty --split (expected e.g. train=0.9,test=0.1)");
    if (std::fabs(sum - 1.0) > 1e-6)
        throw usage_error("--split fractions sum to " + std::to_string(sum) + " (they must sum to 1)");
    return out;
}

void run_convert(const ConvertOptions& o) {
    if (o.verify_only) return run_verify(o);
    if (o.benchmark) return run_convert_benchmark(o);
    const auto start = std::chrono::steady_clock::now();
    if (o.output.empty()) throw usage_error("no output given (dsconvert INPUT OUTPUT, or dsconvert --verify DIR)");
    ThreadPool pool(o.threads);

    bool zstd = false;
    const int level = parse_compress(o.compress, zstd);
    OutputFormat to = o.to.value_or(OutputFormat::dataset);
    if (!o.to && o.output.extension() == ".npy") to = OutputFormat::npy;
    if (to != OutputFormat::dataset && zstd)
        throw usage_error("--compress zstd writes a dataset directory; a single " +
                          std::string(to == OutputFormat::npy ? ".npy" : "raw") + " output is uncompressed");
    if (to != OutputFormat::raw && o.out_layout == Layout::feature_major)
        throw usage_error("--out-layout feature-major is for raw outputs (--to raw); datasets are sample-major");
    const bool range_auto = o.range == "auto";
    std::optional<std::pair<double, double>> range_given;
    if (!o.range.empty() && !range_auto) {
        const auto colon = o.range.find(':', 1);
        if (colon == std::string::npos) throw usage_error("invalid --range '" + o.range + "' (expected auto or LO:HI)");
        range_given = {parse_number(o.range.substr(0, colon), "--range LO"),
                       parse_number(o.range.substr(colon + 1), "--range HI")};
        if (!(range_given->second > range_given->first))
            throw usage_error("invalid --range '" + o.range + "' (HI must be greater than LO)");
    }
    if (!o.range.empty() && (o.scale || o.offset))
        throw usage_error("--range and --scale/--offset both set the mapping; give one of them");

    Source src = open_source(o.input, o.from, o.raw, pool);
    const std::string x_name = src.manifest ? src.manifest->input_field : "x";
    // Raw stdin without --labels: the count is what arrives before the pipe ends.
    bool count_known = true;
    for (const auto& sp : src.splits) count_known &= sp.count_known;
    if (!count_known) {
        const char* why = !o.split.empty() ? "--split" : o.shuffle_seed ? "--shuffle" : o.resume ? "--resume" : nullptr;
        if (why)
            throw usage_error(std::string(why) +
                              " needs the sample count before it starts, and raw stdin gives it only at its end; "
                              "save the input to a file first, or give --labels FILE (the labels set the count)");
    }

    // Fields: every split of the source must have the same fields.
    std::vector<FieldPlan> fields;
    for (const auto& f : src.splits.front().fields) {
        FieldPlan p;
        p.name = f.name;
        p.in = p.out = f.dtype;
        p.shape = f.shape;
        fields.push_back(p);
    }
    for (const auto& sp : src.splits) {
        bool same = sp.fields.size() == fields.size();
        for (std::size_t i = 0; same && i < fields.size(); ++i)
            same = sp.fields[i].name == fields[i].name && sp.fields[i].dtype == fields[i].in &&
                   sp.fields[i].shape == fields[i].shape;
        if (!same)
            throw runtime_error(o.input.string() + ": split '" + sp.name + "' has different fields from split '" +
                                src.splits.front().name +
                                "' (a dataset's splits must share fields, dtypes and shapes)");
    }
    FieldPlan* xp = nullptr;
    for (auto& p : fields)
        if (p.name == x_name) xp = &p;
    if ((o.dtype || o.scale || o.offset || !o.range.empty()) && !xp)
        throw usage_error("the input has no field '" + x_name + "' to convert");
    if (xp) {
        if (o.dtype) xp->out = *o.dtype;
        xp->map.scale = o.scale.value_or(1.0);
        xp->map.offset = o.offset.value_or(0.0);
        if (is_float(xp->in) && !is_float(xp->out) && !o.scale && !o.offset && o.range.empty())
            throw usage_error("converting float " + std::string(dtype_name(xp->in)) + " to integer " +
                              std::string(dtype_name(xp->out)) +
                              " needs an explicit mapping (values would be clipped and rounded): give --range auto, "
                              "--range LO:HI, or --scale/--offset");
        if (range_given) xp->map = range_mapping(range_given->first, range_given->second, xp->out);
    }
    if (range_auto) {
        if (!src.rereadable) throw usage_error("--range auto reads the input twice, which stdin cannot do; give LO:HI");
        double lo = INFINITY, hi = -INFINITY;
        for (auto& sp : src.splits)
            for (auto& f : sp.fields) {
                if (f.name != x_name) continue;
                std::vector<std::uint8_t> buf;
                const std::uint64_t per =
                    std::max<std::uint64_t>(1, block_target_bytes / sample_bytes(xp->shape, xp->in));
                for (std::uint64_t s = 0; s < sp.samples; s += per) {
                    throw_if_interrupted();
                    const std::uint64_t n = std::min(per, sp.samples - s);
                    buf.resize(n * f.stream->sample_bytes());
                    f.stream->read(n, buf.data());
                    finite_range(f.dtype, buf.data(), n * f.shape.numel(), lo, hi);
                }
            }
        if (lo > hi) throw runtime_error(o.input.string() + ": --range auto found no finite value to map");
        xp->map = range_mapping(lo, hi, xp->out);
        note(o.out, "range: [" + std::to_string(lo) + ", " + std::to_string(hi) + "] -> scale " +
                        std::to_string(xp->map.scale) + ", offset " + std::to_string(xp->map.offset));
        src = open_source(o.input, o.from, o.raw, pool);
    }
    for (auto& p : fields) {
        p.convert = p.in != p.out || !p.map.identity();
        p.in_bytes = sample_bytes(p.shape, p.in);
        p.out_bytes = sample_bytes(p.shape, p.out);
    }

    // Jobs: each source split to its own output split, or everything through --split.
    std::uint64_t total_samples = 0;
    for (const auto& sp : src.splits) total_samples += sp.samples;
    std::vector<OutSplit> outs;
    if (!o.split.empty()) {
        const auto fr = parse_split_fractions(o.split);
        std::uint64_t given = 0;
        for (std::size_t i = 0; i < fr.size(); ++i) {
            OutSplit s;
            s.name = fr[i].name;
            s.samples = i + 1 == fr.size()
                            ? total_samples - given
                            : std::min<std::uint64_t>(total_samples - given,
                                                      static_cast<std::uint64_t>(std::llround(
                                                          fr[i].fraction * static_cast<double>(total_samples))));
            given += s.samples;
            outs.push_back(std::move(s));
        }
    } else {
        // An unknown count is set when the stream ends; the router never reaches it.
        for (const auto& sp : src.splits)
            outs.push_back(OutSplit{sp.name, sp.count_known ? sp.samples : ~std::uint64_t{0}, {}, 0});
    }

    // Which outputs are written.
    std::optional<std::size_t> only_split;
    std::size_t only_field = 0;
    if (to != OutputFormat::dataset) {
        std::string want_split, want_field = x_name;
        if (!o.select.empty()) {
            const auto slash = o.select.find('/');
            want_split = o.select.substr(0, slash);
            if (slash != std::string::npos) want_field = o.select.substr(slash + 1);
        } else if (outs.size() == 1) {
            want_split = outs[0].name;
        } else {
            std::string names;
            for (const auto& s : outs) names += (names.empty() ? "" : ", ") + s.name;
            throw usage_error("a single-file output holds one split, the input has " + std::to_string(outs.size()) +
                              " (" + names + "); choose one with --select SPLIT[/FIELD]");
        }
        for (std::size_t i = 0; i < outs.size(); ++i)
            if (outs[i].name == want_split) only_split = i;
        if (!only_split) throw usage_error("--select: no split '" + want_split + "' in the input");
        bool found = false;
        for (std::size_t f = 0; f < fields.size(); ++f)
            if (fields[f].name == want_field) {
                only_field = f;
                found = true;
            }
        if (!found) throw usage_error("--select: no field '" + want_field + "' in the input");
    } else if (!o.select.empty()) {
        throw usage_error("--select chooses what a single .npy/raw output holds; a dataset output keeps everything");
    }

    std::uint64_t out_bytes_estimate = 0;
    for (std::size_t i = 0; i < outs.size() && count_known; ++i)
        for (const auto& p : fields)
            if (to == OutputFormat::dataset || (only_split == i && &p == &fields[only_field]))
                out_bytes_estimate += checked_mul(outs[i].samples, p.out_bytes, "output size");
    std::uint64_t chunk_samples = o.chunk_samples;
    if (zstd && chunk_samples == 0) {
        std::uint64_t widest = 1;
        for (const auto& p : fields) widest = std::max(widest, p.out_bytes);
        const std::uint64_t target = o.chunk_bytes ? o.chunk_bytes : chunked_default_chunk_bytes;
        chunk_samples = std::max<std::uint64_t>(1, target / widest);
    }

    std::optional<DatasetWriter> writer;
    fs::path out_dir = o.output.parent_path().empty() ? fs::path(".") : o.output.parent_path();
    std::unique_ptr<ResumableOutput> resumable;
    if (o.resume) {
        if (to != OutputFormat::dataset)
            throw usage_error("--resume works for dataset outputs (a single .npy/raw file is rewritten whole)");
        if (o.shuffle_seed)
            throw usage_error("--resume cannot continue a --shuffle conversion (its buckets are not kept); run "
                              "without --resume");
        const nlohmann::json fp = {{"input", fs::absolute(o.input).lexically_normal().string()},
                                   {"from", std::string(input_format_name(src.format))},
                                   {"shape", o.raw.shape ? o.raw.shape->str() : ""},
                                   {"in_dtype", o.raw.dtype ? std::string(dtype_name(*o.raw.dtype)) : ""},
                                   {"label_dtype", std::string(dtype_name(o.raw.label_dtype))},
                                   {"layout", o.raw.layout == Layout::feature_major},
                                   {"dtype", xp ? std::string(dtype_name(xp->out)) : ""},
                                   {"scale", xp ? xp->map.scale : 1.0},
                                   {"offset", xp ? xp->map.offset : 0.0},
                                   {"compress", o.compress},
                                   {"chunk_samples", chunk_samples},
                                   {"split", o.split}};
        resumable = std::make_unique<ResumableOutput>(o.output, fp.dump() + "\n", o.force, o.out);
        out_dir = resumable->dir();
    } else if (to == OutputFormat::dataset) {
        writer.emplace(o.output, o.force);
        out_dir = writer->tmp_dir();
    } else {
        check_overwrite(o.output, o.force);
    }
    if (!zstd && !o.force) check_free_disk(out_dir, out_bytes_estimate);

    // Sinks.
    std::uint64_t resume_at = 0; // samples of the (concatenated) input already converted
    if (resumable) {
        bool current_found = false;
        for (OutSplit& s : outs) {
            std::vector<FieldInfo> infos;
            std::uint64_t keep = s.samples;
            for (const auto& p : fields) {
                const FieldInfo fi = output_field(s.name, p, zstd ? chunk_samples : 0);
                keep = std::min(keep, resumable->done(fi, s.samples));
                infos.push_back(fi);
            }
            if (current_found) keep = 0; // after the split in progress: start over
            if (keep < s.samples) current_found = true;
            for (const auto& fi : infos) s.sinks.push_back(resumable->sink(fi, s.samples, keep, level, pool));
            align_batches(s.sinks);
            s.written = keep;
            resume_at += keep;
        }
        if (resume_at > 0) note(o.out, "resuming after " + format_count(resume_at) + " samples");
    }
    for (std::size_t i = 0; i < outs.size() && !resumable; ++i) {
        OutSplit& s = outs[i];
        if (to == OutputFormat::dataset) {
            for (const auto& p : fields) {
                if (zstd) {
                    const FieldInfo fi = output_field(s.name, p, chunk_samples);
                    s.sinks.push_back(std::make_unique<ChunkedSink>(writer->file(fi.file), fi, level, pool));
                } else if (!count_known) {
                    const FieldInfo fi = output_field(s.name, p, 0);
                    s.sinks.push_back(std::make_unique<UnknownCountNpySink>(writer->file(fi.file), fi));
                } else {
                    s.sinks.push_back(
                        std::make_unique<NpySink>(writer->npy_field(s.name, p.name, p.out, p.shape, s.samples)));
                }
            }
        }
    }
    std::vector<FieldPlan> sink_fields = fields; // the fields each sink list follows
    if (to != OutputFormat::dataset) {
        const FieldPlan& p = fields[only_field];
        outs[*only_split].sinks.resize(fields.size());
        // Only the selected field gets a real sink; the others are dropped.
        for (std::size_t f = 0; f < fields.size(); ++f)
            outs[*only_split].sinks[f] =
                f == only_field ? std::unique_ptr<FieldSink>(std::make_unique<FileSink>(
                                      o.output, o.force, p.out, p.shape,
                                      count_known ? std::optional(outs[*only_split].samples) : std::nullopt,
                                      to == OutputFormat::npy, o.out_layout))
                                : std::make_unique<NullSink>();
    }
    // Splits that are not written still consume their samples.
    for (auto& s : outs)
        if (s.sinks.empty())
            for (std::size_t f = 0; f < fields.size(); ++f) s.sinks.push_back(std::make_unique<NullSink>());

    // The stream. Three stages overlap: the next block is read on its own
    // thread, this one is converted on the pool, and the previous one goes
    // through the router to the sinks (.npy writes, the copy into the zstd
    // writer, shuffle buckets) on another thread. Three input slots and two
    // conversion buffers keep the stages apart.
    std::uint64_t per_sample = 0;
    for (const auto& p : fields) per_sample += p.in_bytes + p.out_bytes;
    std::uint64_t block = std::max<std::uint64_t>(1, block_target_bytes / std::max<std::uint64_t>(1, per_sample));
    Progress progress("converting", count_known ? total_samples : 0, 0, o.out);
    using Buffers = std::vector<std::vector<std::uint8_t>>;
    Buffers in_slots[3] = {Buffers(fields.size()), Buffers(fields.size()), Buffers(fields.size())};
    Buffers conv[2] = {Buffers(fields.size()), Buffers(fields.size())};
    std::uint64_t to_skip = resume_at;
    using Emit = std::function<void(const std::vector<const std::uint8_t*>&, std::uint64_t)>;
    auto process_split = [&](SourceSplit& sp, const Emit& emit) {
        const std::uint64_t skip = std::min(to_skip, sp.samples);
        if (skip > 0) {
            for (auto& f : sp.fields) f.stream->skip(skip);
            to_skip -= skip;
            progress.add(skip, 0);
        }
        const bool known = sp.count_known;
        // Reads up to n samples of every field into a slot; returns how many
        // (fewer only at the end of a stream of unknown length, which has one field).
        auto read_into = [&](int slot, std::uint64_t n) -> std::uint64_t {
            if (!known) {
                in_slots[slot][0].resize(n * fields[0].in_bytes);
                n = sp.fields[0].stream->read_up_to(n, in_slots[slot][0].data());
                in_slots[slot][0].resize(n * fields[0].in_bytes);
                return n;
            }
            for (std::size_t f = 0; f < fields.size(); ++f) {
                in_slots[slot][f].resize(n * fields[f].in_bytes);
                sp.fields[f].stream->read(n, in_slots[slot][f].data());
            }
            return n;
        };
        auto want = [&](std::uint64_t at) { return known ? std::min(block, sp.samples - at) : block; };
        // Declared before `writing`, destroyed after it: a pending write never outlives its buffers.
        std::future<std::uint64_t> next;
        std::future<void> writing;
        int slot = 0, cslot = 0;
        std::uint64_t at = skip;
        if (!known || at < sp.samples) next = std::async(std::launch::async, read_into, 0, want(at));
        while (next.valid()) {
            throw_if_interrupted();
            const std::uint64_t n = next.get();
            if (n == 0) break;
            const int cur = slot;
            slot = (slot + 1) % 3;
            at += n;
            if (!known || at < sp.samples) next = std::async(std::launch::async, read_into, slot, want(at));
            const Buffers& in = in_slots[cur];
            convert_block(fields, in, conv[cslot], n, pool);
            std::vector<const std::uint8_t*> ptrs(fields.size());
            for (std::size_t f = 0; f < fields.size(); ++f) {
                if (!fields[f].convert) {
                    fields[f].stats.elements += n * fields[f].shape.numel();
                    fields[f].stats.bytes_in += n * fields[f].in_bytes;
                    fields[f].stats.bytes_out += n * fields[f].out_bytes;
                }
                ptrs[f] = fields[f].convert ? conv[cslot][f].data() : in[f].data();
            }
            cslot ^= 1;
            if (writing.valid()) writing.get(); // the previous block is out: its buffers are free
            writing = std::async(std::launch::async, [&emit, ptrs = std::move(ptrs), n] { emit(ptrs, n); });
            std::uint64_t in_bytes = 0;
            for (const auto& f : fields) in_bytes += n * f.in_bytes;
            progress.add(n, in_bytes); // input bytes: the rate shown is the conversion's
        }
        if (writing.valid()) writing.get();
        if (!known) {
            sp.samples = at;
            sp.count_known = true;
        }
        for (auto& f : sp.fields) f.stream->expect_end();
    };
    std::vector<OutSplit*> out_ptrs;
    for (auto& s : outs) out_ptrs.push_back(&s);
    Router router(out_ptrs, sink_fields);
    if (resumable) {
        // Say where the work is kept before run_tool reports the interruption.
        try {
            for (auto& sp : src.splits) process_split(sp, [&](const auto& d, std::uint64_t n) { router.route(d, n); });
        } catch (const Error& e) {
            if (e.code() == ExitCode::interrupted || e.code() == ExitCode::failure)
                warning("partial conversion kept in '" + resumable->dir().string() +
                        "'; run the same command with --resume to continue after its last complete chunk");
            throw;
        }
    } else if (o.shuffle_seed) {
        std::optional<AtomicDir> scratch;
        fs::path bucket_dir = out_dir;
        if (!writer) {
            scratch.emplace(o.output.string() + ".shuffle", true);
            bucket_dir = scratch->tmp_path();
        }
        Shuffler sh(bucket_dir, *o.shuffle_seed, total_samples, fields);
        for (auto& sp : src.splits) process_split(sp, [&](const auto& d, std::uint64_t n) { sh.add(d, n); });
        sh.drain(router, block);
    } else {
        for (auto& sp : src.splits) process_split(sp, [&](const auto& d, std::uint64_t n) { router.route(d, n); });
    }
    progress.finish();
    if (!count_known) {
        total_samples = src.splits.front().samples;
        outs.front().samples = total_samples;
        if (total_samples == 0)
            throw runtime_error(o.input.string() + ": no samples arrived (empty input); nothing written");
    }

    // Finish and commit.
    Manifest m;
    std::uint64_t bytes_written = 0;
    for (std::size_t i = 0; i < outs.size(); ++i) {
        SplitInfo si;
        si.name = outs[i].name;
        si.samples = outs[i].samples;
        for (std::size_t f = 0; f < outs[i].sinks.size(); ++f) {
            FieldInfo fi = outs[i].sinks[f]->finish();
            bytes_written += fi.bytes;
            si.fields.push_back(std::move(fi));
        }
        m.splits.push_back(std::move(si));
    }
    if (writer || resumable) {
        if (src.manifest) {
            m.num_classes = src.manifest->num_classes;
            m.input_field = src.manifest->input_field;
            m.label_field = src.manifest->label_field;
            if (xp && !xp->convert && !o.shuffle_seed && o.split.empty()) m.stats = src.manifest->stats;
        } else {
            m.num_classes = src.num_classes;
        }
        bool has_label = false;
        for (const auto& p : fields) has_label |= p.name == m.label_field;
        if (!has_label) m.label_field.clear();
        m.provenance.tool = "dsconvert";
        m.provenance.version = DSTK_VERSION;
        m.provenance.command_line = o.command_line;
        m.provenance.created = now_iso8601();
        m.provenance.seed = o.shuffle_seed;
        m.provenance.params["from"] = std::string(input_format_name(src.format));
        m.provenance.params["input"] = o.input.string();
        m.provenance.params["compress"] = o.compress;
        if (zstd) m.provenance.params["chunk_samples"] = std::to_string(chunk_samples);
        if (xp && xp->convert) {
            m.provenance.params["scale"] = std::to_string(xp->map.scale);
            m.provenance.params["offset"] = std::to_string(xp->map.offset);
        }
        if (resumable)
            resumable->commit(m, o.force);
        else
            writer->commit(m);
    }
    const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();

    // Report.
    std::uint64_t bytes_in = 0;
    for (const auto& p : fields) bytes_in += p.stats.bytes_in;
    nlohmann::json j;
    j["input"] = o.input.string();
    j["input_format"] = std::string(input_format_name(src.format));
    j["output"] = o.output.string();
    j["output_format"] = to == OutputFormat::dataset ? (zstd ? "dataset (zstd-chunked)" : "dataset (npy)")
                                                     : (to == OutputFormat::npy ? "npy" : "raw");
    j["samples"] = total_samples;
    j["splits"] = nlohmann::json::array();
    for (const auto& s : outs) j["splits"].push_back({{"name", s.name}, {"samples", s.samples}});
    j["fields"] = nlohmann::json::array();
    for (const auto& p : fields) {
        nlohmann::json fj = {{"name", p.name},
                             {"from", std::string(dtype_name(p.in))},
                             {"to", std::string(dtype_name(p.out))},
                             {"shape", p.shape.str()},
                             {"scale", p.map.scale},
                             {"offset", p.map.offset}};
        fj["conversion"] = p.stats.to_json();
        j["fields"].push_back(fj);
    }
    j["bytes_in"] = bytes_in;
    j["bytes_out"] = bytes_written;
    if (zstd) {
        j["compression_level"] = level;
        j["chunk_samples"] = chunk_samples;
    }
    if (o.shuffle_seed) j["shuffle_seed"] = *o.shuffle_seed;
    if (resumable) j["resumed_after_samples"] = resume_at;
    j["seconds"] = secs;
    j["threads"] = pool.size();
    j["peak_rss_bytes"] = peak_rss_bytes();
    if (!o.report_json.empty()) write_report_file(o.report_json, j, true);
    if (o.out.json) {
        std::printf("%s\n", j.dump(2).c_str());
        return;
    }
    note(o.out, "dsconvert: " + format_count(total_samples) + " samples (" + src.description + ") -> " +
                    o.output.string() + ": " + format_bytes(bytes_in) + " -> " + format_bytes(bytes_written) + " in " +
                    format_duration(secs) + " (" + format_rate(secs > 0 ? bytes_in / secs : 0) + ")");
    for (const auto& p : fields) {
        if (!p.convert) continue;
        const ConversionStats& s = p.stats;
        std::string line = "  " + field_summary(p) + ": ";
        if (!s.lossy()) {
            line += "exact";
        } else {
            char buf[200];
            std::snprintf(buf, sizeof buf, "max abs error %.6g, max rel error %.3g, %llu inexact", s.max_abs_error,
                          s.max_rel_error, static_cast<unsigned long long>(s.inexact));
            line += buf;
            if (s.clipped) line += ", " + format_count(s.clipped) + " clipped";
            if (s.overflow_inf) line += ", " + format_count(s.overflow_inf) + " overflowed to Inf";
            if (s.nan) line += ", " + format_count(s.nan) + " NaN";
        }
        line += " (" + format_bytes(s.bytes_in) + " -> " + format_bytes(s.bytes_out) + ")";
        note(o.out, line);
    }
}

} // namespace dstk
