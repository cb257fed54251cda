#include "sinks.hpp"

#include <algorithm>
#include <cstring>
#include <fcntl.h>
#include <unistd.h>

#include "dstk/atomic_output.hpp"
#include "dstk/channel_stats.hpp"
#include "dstk/checksum.hpp"
#include "dstk/error.hpp"
#include "dstk/fd.hpp"
#include "dstk/field_reader.hpp"
#include "dstk/npy.hpp"
#include "dstk/signals.hpp"

namespace fs = std::filesystem;

namespace dstk::convert {

// The .npy header of `samples` samples of `shape`.
std::string npy_header_for(DType dtype, const Shape& shape, std::uint64_t samples) {
    std::vector<std::uint64_t> dims{samples};
    dims.insert(dims.end(), shape.dims.begin(), shape.dims.end());
    return make_npy_header(dtype, dims);
}

namespace {

class NpySink final : public FieldSink {
  public:
    explicit NpySink(std::unique_ptr<NpyFieldWriter> w) : w_(std::move(w)) {}
    void append(const void* data, std::uint64_t count) override { w_->append(data, count); }
    FieldInfo finish() override { return w_->finish(); }

  private:
    std::unique_ptr<NpyFieldWriter> w_;
};

// A .npy file written before its sample count was known (stdin) starts with
// the header of 0 samples; this puts the real header in its place. A longer
// count can push the header over a 64-byte boundary: the data then moves up
// by that much, block by block from the end (bounded memory).
void rewrite_npy_header(const fs::path& path, std::uint64_t old_len, const std::string& header,
                        std::uint64_t data_bytes) {
    if (header.size() < old_len) throw runtime_error("internal: .npy header shrank in '" + path.string() + "'");
    const UniqueFd file = UniqueFd::open(path, O_RDWR, "cannot reopen");
    const int fd = file.get();
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
        fd_ = UniqueFd::open(path_, O_WRONLY | O_CREAT | O_TRUNC, "cannot create");
        const std::string h = npy_header_for(info_.dtype, info_.shape, 0);
        write_all(fd_.get(), h.data(), h.size(), 0, path_);
    }
    void append(const void* data, std::uint64_t count) override {
        write_all(fd_.get(), data, count * info_.sample_bytes(), static_cast<long long>(header_ + bytes_), path_);
        bytes_ += count * info_.sample_bytes();
        written_ += count;
    }
    FieldInfo finish() override {
        const std::string h = npy_header_for(info_.dtype, info_.shape, written_);
        if (::close(fd_.release()) != 0) throw_errno("cannot close", path_.string());
        rewrite_npy_header(path_, header_, h, bytes_);
        info_.bytes = h.size() + bytes_;
        info_.checksum = file_checksum(path_);
        return info_;
    }

  private:
    fs::path path_;
    FieldInfo info_;
    UniqueFd fd_;
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
        info_.bytes = header_ + written_ * sample_bytes_;
        return info_;
    }
    AtomicOutput* staged_output() override { return &file_; }

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

// OUTPUT '-': the file's bytes in order on stdout (sample-major only: a pipe
// cannot seek).
class StdoutSink final : public FieldSink {
  public:
    StdoutSink(DType dtype, const Shape& shape, std::optional<std::uint64_t> samples, bool npy, Layout layout)
        : sample_bytes_(sample_bytes(shape, dtype)) {
        if (layout == Layout::feature_major)
            throw usage_error("--out-layout feature-major cannot be written to stdout (it needs to seek); give a file");
        if (npy && !samples)
            throw usage_error("a .npy on stdout needs the sample count in its header before the data, which raw "
                              "stdin gives only at its end; write --to raw, or give --labels FILE");
        if (npy) {
            const std::string h = npy_header_for(dtype, shape, *samples);
            write_all(STDOUT_FILENO, h.data(), h.size(), -1, "<stdout>");
            header_ = h.size();
        }
        info_.dtype = dtype;
        info_.shape = shape;
    }
    void append(const void* data, std::uint64_t count) override {
        write_all(STDOUT_FILENO, data, count * sample_bytes_, -1, "<stdout>");
        written_ += count;
    }
    FieldInfo finish() override {
        info_.bytes = header_ + written_ * sample_bytes_;
        return info_;
    }

  private:
    std::uint64_t sample_bytes_, header_ = 0, written_ = 0;
    FieldInfo info_;
};

// The statistics of what passes through, in rows of spec.row_samples.
class StatsSink final : public FieldSink {
  public:
    StatsSink(std::unique_ptr<FieldSink> inner, DType dtype, const Shape& shape, StatsSinkSpec spec)
        : inner_(std::move(inner)), dtype_(dtype), shape_(shape), spec_(std::move(spec)), sums_(stats_channels(shape)),
          row_(2 * sums_.channels(), 0.0), filled_(spec_.keep % spec_.row_samples) {}
    void append(const void* data, std::uint64_t count) override {
        add(data, count);
        inner_->append(data, count);
    }
    std::uint64_t batch_samples() const override { return inner_->batch_samples(); }
    void limit_batch_samples(std::uint64_t samples) override { inner_->limit_batch_samples(samples); }
    FieldInfo finish() override {
        FieldInfo fi = inner_->finish();
        if (filled_ > 0) end_row();
        if (spec_.keep > 0) add_kept(fi);
        if (samples_ == 0) return fi;
        std::string why;
        const double per_channel = static_cast<double>(shape_.numel() / sums_.channels());
        fi.stats = usable_stats(sums_.stats(static_cast<double>(samples_) * per_channel), why);
        if (!fi.stats && spec_.notice) spec_.notice("no statistics written for field " + fi.name + ": " + why);
        return fi;
    }

  private:
    void add(const void* data, std::uint64_t count) {
        const auto* p = static_cast<const std::uint8_t*>(data);
        const std::uint64_t sb = sample_bytes(shape_, dtype_);
        while (count > 0) {
            const std::uint64_t take = std::min(count, spec_.row_samples - filled_);
            add_channel_sums(row_, p, take, dtype_, shape_);
            p += take * sb;
            count -= take;
            filled_ += take;
            samples_ += take;
            if (filled_ == spec_.row_samples) end_row();
        }
    }
    void end_row() {
        sums_.add(row_);
        if (spec_.rows) spec_.rows->push_back(row_);
        std::fill(row_.begin(), row_.end(), 0.0);
        filled_ = 0;
    }
    // --resume: the samples written by the interrupted run, read back (its
    // rows after the others': the statistics equal a single run's to
    // rounding).
    void add_kept(const FieldInfo& fi) {
        const SplitInfo split{spec_.split, spec_.split_samples, {}};
        const auto reader = open_field_reader(spec_.dir, split, fi);
        std::vector<std::uint8_t> buf;
        for (std::uint64_t at = 0; at < spec_.keep; at += spec_.row_samples) {
            throw_if_interrupted();
            const std::uint64_t n = std::min(spec_.row_samples, spec_.keep - at);
            buf.resize(n * fi.sample_bytes());
            reader->read(at, n, buf.data());
            add(buf.data(), n);
            if (filled_ > 0) end_row();
        }
    }

    std::unique_ptr<FieldSink> inner_;
    DType dtype_;
    Shape shape_;
    StatsSinkSpec spec_;
    ChannelSums sums_;
    std::vector<double> row_;
    std::uint64_t filled_ = 0, samples_ = 0;
};

} // namespace

void align_batches(std::vector<std::unique_ptr<FieldSink>>& sinks) {
    std::uint64_t least = 0;
    for (const auto& s : sinks)
        if (const std::uint64_t b = s->batch_samples(); b && (!least || b < least)) least = b;
    if (least)
        for (auto& s : sinks) s->limit_batch_samples(least);
}

std::unique_ptr<FieldSink> make_npy_sink(std::unique_ptr<NpyFieldWriter> writer) {
    return std::make_unique<NpySink>(std::move(writer));
}

std::unique_ptr<FieldSink> make_unknown_count_npy_sink(fs::path path, FieldInfo info) {
    return std::make_unique<UnknownCountNpySink>(std::move(path), std::move(info));
}

std::unique_ptr<FieldSink> make_file_sink(const fs::path& out, bool force, DType dtype, const Shape& shape,
                                          std::optional<std::uint64_t> samples, bool npy, Layout layout) {
    if (out == "-") return std::make_unique<StdoutSink>(dtype, shape, samples, npy, layout);
    return std::make_unique<FileSink>(out, force, dtype, shape, samples, npy, layout);
}

std::unique_ptr<FieldSink> make_null_sink() {
    return std::make_unique<NullSink>();
}

std::unique_ptr<FieldSink> make_stats_sink(std::unique_ptr<FieldSink> inner, DType dtype, const Shape& shape,
                                           StatsSinkSpec spec) {
    return std::make_unique<StatsSink>(std::move(inner), dtype, shape, std::move(spec));
}

} // namespace dstk::convert
