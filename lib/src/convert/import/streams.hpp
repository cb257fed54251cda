#pragma once
// The building blocks of dsconvert's importers: files, byte streams (file
// regions, gzip, deflated zip members) and the field streams made of them
// (whole samples, byte-swapped where needed; feature-major transposed).
#include <algorithm>
#include <cerrno>
#include <cstring>
#include <fcntl.h>
#include <filesystem>
#include <memory>
#include <string>
#include <string_view>
#include <sys/stat.h>
#include <unistd.h>
#include <vector>
#include <zlib.h>

#include "dstk/atomic_output.hpp"
#include "dstk/convert/importers.hpp"
#include "dstk/error.hpp"
#include "dstk/fd.hpp"
#include "dstk/signals.hpp"
#include "dstk/units.hpp"

namespace dstk::import {

namespace fs = std::filesystem;

inline constexpr std::uint64_t io_block = 4ull << 20;

[[noreturn]] inline void bad_input(const std::string& source, const std::string& why) {
    throw runtime_error(source + ": " + why);
}

inline std::uint32_t be32(const std::uint8_t* p) {
    return (std::uint32_t{p[0]} << 24) | (std::uint32_t{p[1]} << 16) | (std::uint32_t{p[2]} << 8) | p[3];
}
inline std::uint16_t le16(const std::uint8_t* p) {
    return static_cast<std::uint16_t>(p[0] | (p[1] << 8));
}
inline std::uint32_t le32(const std::uint8_t* p) {
    return std::uint32_t{p[0]} | (std::uint32_t{p[1]} << 8) | (std::uint32_t{p[2]} << 16) | (std::uint32_t{p[3]} << 24);
}
inline std::uint64_t le64(const std::uint8_t* p) {
    return std::uint64_t{le32(p)} | (std::uint64_t{le32(p + 4)} << 32);
}

// An open file descriptor shared by the streams that read one file.
struct File {
    UniqueFd owner;
    int fd = -1;
    fs::path path;
    std::uint64_t bytes = 0;
    explicit File(fs::path p) : path(std::move(p)) {
        owner = open_input_file(path, "input");
        fd = owner.get();
        struct stat st {};
        if (::fstat(fd, &st) != 0) throw_errno("cannot stat", path.string());
        bytes = static_cast<std::uint64_t>(st.st_size);
        ::posix_fadvise(fd, 0, 0, POSIX_FADV_SEQUENTIAL);
    }
    File(const File&) = delete;
    File& operator=(const File&) = delete;
    std::vector<std::uint8_t> read_at(std::uint64_t offset, std::uint64_t n) const {
        std::vector<std::uint8_t> b(n);
        read_all(fd, b.data(), n, static_cast<long long>(offset), path);
        return b;
    }
};

// Sequential bytes, from a file region, a gzip stream or a deflated zip member.
class ByteStream {
  public:
    virtual ~ByteStream() = default;
    virtual void read(void* dst, std::uint64_t n) = 0;
};

class FileRegion final : public ByteStream {
  public:
    FileRegion(std::shared_ptr<File> f, std::uint64_t offset, std::uint64_t end)
        : f_(std::move(f)), pos_(offset), end_(end) {}
    void read(void* dst, std::uint64_t n) override {
        if (n > end_ - pos_)
            bad_input(f_->path.string(),
                      "ends early (" + std::to_string(n - (end_ - pos_)) + " more bytes expected; file truncated?)");
        read_all(f_->fd, dst, n, static_cast<long long>(pos_), f_->path);
        pos_ += n;
    }
    void seek(std::uint64_t pos) { pos_ = pos; }

  private:
    std::shared_ptr<File> f_;
    std::uint64_t pos_, end_;
};

// gzip or plain bytes through zlib's gzread (it passes plain files through).
class GzStream final : public ByteStream {
  public:
    GzStream(int fd, std::string source, bool owns) : source_(std::move(source)) {
        const int dup = owns ? fd : ::dup(fd);
        gz_ = ::gzdopen(dup, "rb");
        if (!gz_) throw runtime_error("cannot read '" + source_ + "' (zlib could not open it)");
        ::gzbuffer(gz_, 1 << 20);
    }
    ~GzStream() override { ::gzclose(gz_); }
    void read(void* dst, std::uint64_t n) override {
        auto* p = static_cast<char*>(dst);
        while (n > 0) {
            const unsigned want = static_cast<unsigned>(std::min<std::uint64_t>(n, 1u << 30));
            const int got = ::gzread(gz_, p, want);
            if (got < 0) {
                int err = 0;
                const char* msg = ::gzerror(gz_, &err);
                bad_input(source_, std::string("cannot decompress (") + msg + "; gzip data corrupted?)");
            }
            if (got == 0) {
                int err = 0;
                const char* msg = ::gzerror(gz_, &err);
                bad_input(source_, std::string("ends early") + (err ? std::string(" (") + msg + ")" : "") + "; " +
                                       std::to_string(n) + " more bytes expected (gzip stream cut short?)");
            }
            p += got;
            n -= static_cast<std::uint64_t>(got);
        }
    }
    // True when no byte is left (a stream longer than its header says is an error).
    bool at_end() {
        char c;
        return ::gzread(gz_, &c, 1) == 0;
    }

  private:
    gzFile gz_ = nullptr;
    std::string source_;
};

// A raw-deflate zip member, CRC-checked when its last byte has been read.
class InflateStream final : public ByteStream {
  public:
    InflateStream(std::shared_ptr<File> f, const ZipMember& m)
        : f_(std::move(f)), pos_(m.data_offset), left_(m.compressed_bytes), out_left_(m.uncompressed_bytes),
          crc_want_(m.crc32), source_(f_->path.string() + ":" + m.name) {
        std::memset(&z_, 0, sizeof z_);
        if (::inflateInit2(&z_, -MAX_WBITS) != Z_OK) throw runtime_error("zlib inflateInit2 failed");
        in_.resize(1 << 20);
    }
    ~InflateStream() override { ::inflateEnd(&z_); }
    void read(void* dst, std::uint64_t n) override {
        if (n > out_left_) bad_input(source_, "member ends early (" + std::to_string(n) + " bytes expected)");
        auto* p = static_cast<std::uint8_t*>(dst);
        const std::uint64_t total = n;
        while (n > 0) {
            if (z_.avail_in == 0 && left_ > 0) {
                const std::uint64_t take = std::min<std::uint64_t>(left_, in_.size());
                read_all(f_->fd, in_.data(), take, static_cast<long long>(pos_), f_->path);
                pos_ += take;
                left_ -= take;
                z_.next_in = in_.data();
                z_.avail_in = static_cast<uInt>(take);
            }
            z_.next_out = p;
            z_.avail_out = static_cast<uInt>(std::min<std::uint64_t>(n, 1u << 30));
            const int r = ::inflate(&z_, Z_NO_FLUSH);
            const std::uint64_t got = static_cast<std::uint64_t>(z_.next_out - p);
            p += got;
            n -= got;
            if (r == Z_STREAM_END && n > 0) bad_input(source_, "deflate stream ends early (archive truncated?)");
            if (r != Z_OK && r != Z_STREAM_END && !(r == Z_BUF_ERROR && got > 0))
                bad_input(source_, std::string("cannot inflate (") +
                                       (z_.msg ? z_.msg : "zlib error " + std::to_string(r)) +
                                       "; archive corrupted or truncated?)");
        }
        crc_ = ::crc32_z(crc_, static_cast<const Bytef*>(dst), total);
        out_left_ -= total;
        if (out_left_ == 0 && crc_ != crc_want_) bad_input(source_, "CRC-32 mismatch (archive corrupted)");
    }

  private:
    std::shared_ptr<File> f_;
    std::uint64_t pos_, left_, out_left_;
    std::uint32_t crc_want_, crc_ = 0;
    std::string source_;
    z_stream z_;
    std::vector<std::uint8_t> in_;
};

// Whole samples from a byte stream, byte-swapped when the source is big-endian.
class BytesField final : public FieldStream {
  public:
    BytesField(std::unique_ptr<ByteStream> in, std::uint64_t sample_bytes, std::size_t swap_elem = 0)
        : in_(std::move(in)), sample_bytes_(sample_bytes), swap_elem_(swap_elem) {}
    void read(std::uint64_t count, void* dst) override {
        in_->read(dst, count * sample_bytes_);
        if (swap_elem_ > 1) byteswap_elements(dst, count * sample_bytes_ / swap_elem_, swap_elem_);
    }
    std::uint64_t sample_bytes() const override { return sample_bytes_; }

  private:
    std::unique_ptr<ByteStream> in_;
    std::uint64_t sample_bytes_;
    std::size_t swap_elem_;
};

// Samples already in memory (small label arrays).
class MemoryField final : public FieldStream {
  public:
    MemoryField(std::vector<std::uint8_t> data, std::uint64_t sample_bytes)
        : data_(std::move(data)), sample_bytes_(sample_bytes) {}
    void read(std::uint64_t count, void* dst) override {
        std::memcpy(dst, data_.data() + pos_, count * sample_bytes_);
        pos_ += count * sample_bytes_;
    }
    void skip(std::uint64_t count) override { pos_ += count * sample_bytes_; }
    std::uint64_t sample_bytes() const override { return sample_bytes_; }

  private:
    std::vector<std::uint8_t> data_;
    std::uint64_t sample_bytes_, pos_ = 0;
};

// A feature-major region: feature f of sample n at (f * samples + n) *
// elem_bytes. Read in blocks: one pread per feature, then a cache-blocked
// transpose; `order` maps C-order feature indices to stored ones (Fortran
// .npy files with more than one feature dimension).
class FeatureMajorField final : public FieldStream {
  public:
    FeatureMajorField(std::shared_ptr<File> f, std::uint64_t offset, std::uint64_t samples, std::uint64_t features,
                      std::size_t elem_bytes, std::size_t swap_elem, std::vector<std::uint64_t> order)
        : f_(std::move(f)), offset_(offset), samples_(samples), features_(features), elem_(elem_bytes),
          swap_(swap_elem), order_(std::move(order)) {}
    void read(std::uint64_t count, void* dst) override {
        if (count > samples_ - pos_) bad_input(f_->path.string(), "read past the last sample");
        tmp_.resize(count * features_ * elem_);
        for (std::uint64_t f = 0; f < features_; ++f) {
            const std::uint64_t stored = order_.empty() ? f : order_[f];
            read_all(f_->fd, tmp_.data() + f * count * elem_, count * elem_,
                     static_cast<long long>(offset_ + (stored * samples_ + pos_) * elem_), f_->path);
        }
        auto* out = static_cast<std::uint8_t*>(dst);
        constexpr std::uint64_t tile = 64;
        for (std::uint64_t f0 = 0; f0 < features_; f0 += tile)
            for (std::uint64_t s0 = 0; s0 < count; s0 += tile)
                for (std::uint64_t f = f0; f < std::min(features_, f0 + tile); ++f)
                    for (std::uint64_t s = s0; s < std::min(count, s0 + tile); ++s)
                        std::memcpy(out + (s * features_ + f) * elem_, tmp_.data() + (f * count + s) * elem_, elem_);
        if (swap_ > 1) byteswap_elements(dst, count * features_, swap_);
        pos_ += count;
    }
    void skip(std::uint64_t count) override { pos_ += count; }
    std::uint64_t sample_bytes() const override { return features_ * elem_; }

  private:
    std::shared_ptr<File> f_;
    std::uint64_t offset_, samples_, features_;
    std::size_t elem_, swap_;
    std::vector<std::uint64_t> order_;
    std::uint64_t pos_ = 0;
    std::vector<std::uint8_t> tmp_;
};

inline bool is_little_endian() {
    const std::uint16_t x = 1;
    std::uint8_t b;
    std::memcpy(&b, &x, 1);
    return b == 1;
}

inline std::string lower(std::string s) {
    std::transform(s.begin(), s.end(), s.begin(), [](unsigned char c) { return std::tolower(c); });
    return s;
}

inline bool ends_with(std::string_view s, std::string_view suffix) {
    return s.size() >= suffix.size() && s.substr(s.size() - suffix.size()) == suffix;
}

inline std::string split_for_prefix(std::string prefix) {
    prefix = lower(prefix);
    if (prefix == "t10k" || prefix == "test") return "test";
    if (prefix == "val" || prefix == "valid" || prefix == "validation") return "val";
    return prefix.empty() ? "train" : prefix;
}

inline Shape sample_shape(const std::vector<std::uint64_t>& dims, const std::string& source) {
    if (dims.empty()) bad_input(source, "a 0-d array has no samples (need at least one dimension)");
    return Shape{std::vector<std::uint64_t>(dims.begin() + 1, dims.end())};
}

} // namespace dstk::import
