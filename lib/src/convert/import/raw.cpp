// Raw binary samples (sample- or feature-major), from a file or a pipe.
#include "formats.hpp"

#include <poll.h>

namespace dstk::import {

// ---- raw and v28b -------------------------------------------------------

// Raw samples from a pipe (stdin): no seek, no size, so the count is what
// arrives; a pipe that ends inside a sample is an error.
class PipeField final : public FieldStream {
  public:
    PipeField(int fd, std::string source, std::uint64_t sample_bytes)
        : fd_(fd), source_(std::move(source)), sample_bytes_(sample_bytes) {}
    void read(std::uint64_t count, void* dst) override {
        const std::uint64_t got = read_up_to(count, dst);
        if (got < count)
            bad_input(source_, "ends after " + std::to_string(samples_) + " samples, " + std::to_string(count - got) +
                                   " fewer than expected (input cut short, or the labels count more samples?)");
    }
    std::uint64_t read_up_to(std::uint64_t max, void* dst) override {
        auto* p = static_cast<std::uint8_t*>(dst);
        const std::uint64_t want = max * sample_bytes_;
        std::uint64_t have = 0;
        while (have < want && !eof_) {
            // This runs on the read-ahead thread, which a signal may not
            // interrupt: wait with a timeout so that Ctrl-C is seen even
            // while the writer of the pipe is silent.
            pollfd pfd{fd_, POLLIN, 0};
            const int ready = ::poll(&pfd, 1, 200);
            if (ready < 0 && errno != EINTR) throw_errno("cannot wait for", source_);
            throw_if_interrupted();
            if (ready <= 0) continue;
            const ssize_t n = ::read(fd_, p + have, std::min<std::uint64_t>(want - have, 1u << 30));
            if (n < 0 && (errno == EINTR || errno == EAGAIN)) continue;
            if (n < 0) throw_errno("cannot read", source_);
            if (n == 0) eof_ = true;
            have += static_cast<std::uint64_t>(n);
        }
        if (have % sample_bytes_ != 0)
            bad_input(source_, "ends inside sample " + std::to_string(samples_ + have / sample_bytes_) + " (" +
                                   std::to_string(have % sample_bytes_) + " of its " + std::to_string(sample_bytes_) +
                                   " bytes; input cut short, or wrong --shape/--in-dtype?)");
        samples_ += have / sample_bytes_;
        return have / sample_bytes_;
    }
    void expect_end() override {
        std::uint8_t c;
        ssize_t n;
        do {
            n = ::read(fd_, &c, 1);
        } while (n < 0 && errno == EINTR && (throw_if_interrupted(), true));
        if (n > 0)
            bad_input(source_, "holds more data than the " + std::to_string(samples_) +
                                   " samples the labels give (wrong --labels file, or wrong --shape/--in-dtype?)");
    }
    std::uint64_t sample_bytes() const override { return sample_bytes_; }

  private:
    int fd_;
    std::string source_;
    std::uint64_t sample_bytes_, samples_ = 0;
    bool eof_ = false;
};

SourceField raw_field(std::shared_ptr<File> f, std::string name, DType dtype, const Shape& shape, Layout layout,
                      std::uint64_t samples) {
    SourceField sf;
    sf.name = std::move(name);
    sf.dtype = dtype;
    sf.shape = shape;
    const std::uint64_t sb = sample_bytes(shape, dtype);
    if (layout == Layout::feature_major)
        sf.stream = std::make_unique<FeatureMajorField>(f, 0, samples, shape.numel(), dtype_size(dtype), 0,
                                                        std::vector<std::uint64_t>{});
    else
        sf.stream = std::make_unique<BytesField>(std::make_unique<FileRegion>(f, 0, samples * sb), sb);
    return sf;
}

std::uint64_t whole_samples(const File& f, std::uint64_t sb, const std::string& what) {
    if (f.bytes % sb != 0)
        bad_input(f.path.string(), std::to_string(f.bytes) + " bytes is not a whole number of " + what + " of " +
                                       std::to_string(sb) + " bytes (wrong --shape/--in-dtype, or file truncated?)");
    return f.bytes / sb;
}

Source open_raw(const fs::path& path, const RawInputOptions& raw) {
    if (!raw.shape || !raw.dtype)
        throw usage_error("raw input '" + path.string() +
                          "' needs --shape and --in-dtype (it does not describe itself), e.g. --shape 3x32x32 "
                          "--in-dtype u8");
    Source s;
    s.format = InputFormat::raw;
    s.description = "raw binary";
    SourceSplit split;
    split.name = "train";
    const std::uint64_t sb = sample_bytes(*raw.shape, *raw.dtype);
    if (path == "-") {
        if (raw.layout == Layout::feature_major)
            throw usage_error("feature-major raw input cannot be read from stdin (it needs random access); give a "
                              "file");
        s.description = "raw binary from stdin";
        s.rereadable = false;
        SourceField x;
        x.name = "x";
        x.dtype = *raw.dtype;
        x.shape = *raw.shape;
        x.stream = std::make_unique<PipeField>(STDIN_FILENO, "<stdin>", sb);
        split.fields.push_back(std::move(x));
        split.count_known = false;
    } else {
        auto f = std::make_shared<File>(path);
        split.samples = whole_samples(*f, sb, "samples");
        split.fields.push_back(raw_field(f, "x", *raw.dtype, *raw.shape, raw.layout, split.samples));
    }
    s.splits.push_back(std::move(split));
    return s;
}

} // namespace dstk::import
