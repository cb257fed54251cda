#include "dstk/convert/importers.hpp"

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <fcntl.h>
#include <map>
#include <poll.h>
#include <sys/stat.h>
#include <unistd.h>
#include <zlib.h>

#include "dstk/atomic_output.hpp"
#include "dstk/chunked_file.hpp"
#include "dstk/dataset.hpp"
#include "dstk/error.hpp"
#include "dstk/npy.hpp"
#include "dstk/signals.hpp"
#include "dstk/thread_pool.hpp"
#include "dstk/units.hpp"

namespace fs = std::filesystem;

namespace dstk {
namespace {

constexpr std::uint64_t io_block = 4ull << 20;

[[noreturn]] void bad_input(const std::string& source, const std::string& why) {
    throw runtime_error(source + ": " + why);
}

std::uint32_t be32(const std::uint8_t* p) {
    return (std::uint32_t{p[0]} << 24) | (std::uint32_t{p[1]} << 16) | (std::uint32_t{p[2]} << 8) | p[3];
}
std::uint16_t le16(const std::uint8_t* p) {
    return static_cast<std::uint16_t>(p[0] | (p[1] << 8));
}
std::uint32_t le32(const std::uint8_t* p) {
    return std::uint32_t{p[0]} | (std::uint32_t{p[1]} << 8) | (std::uint32_t{p[2]} << 16) | (std::uint32_t{p[3]} << 24);
}
std::uint64_t le64(const std::uint8_t* p) {
    return std::uint64_t{le32(p)} | (std::uint64_t{le32(p + 4)} << 32);
}

// An open file descriptor shared by the streams that read one file.
struct File {
    int fd = -1;
    fs::path path;
    std::uint64_t bytes = 0;
    explicit File(fs::path p) : path(std::move(p)) {
        fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
        if (fd < 0) throw_errno("cannot open input", path.string());
        struct stat st {};
        if (::fstat(fd, &st) != 0) throw_errno("cannot stat", path.string());
        if (S_ISDIR(st.st_mode)) bad_input(path.string(), "is a directory where a file was expected");
        if (!S_ISREG(st.st_mode))
            bad_input(path.string(),
                      "is not a regular file (pipes and devices are read only as IDX: --from idx, or '-')");
        bytes = static_cast<std::uint64_t>(st.st_size);
        ::posix_fadvise(fd, 0, 0, POSIX_FADV_SEQUENTIAL);
    }
    ~File() { ::close(fd); }
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

// One field of a dataset directory; chunked fields decode chunks on the pool.
class DatasetField final : public FieldStream {
  public:
    DatasetField(std::shared_ptr<Dataset> d, const fs::path& dir, const SplitInfo& split, const FieldInfo& field,
                 ThreadPool& pool)
        : d_(std::move(d)), reader_(&d_->reader(split.name, field.name)), sample_bytes_(field.sample_bytes()),
          pool_(&pool) {
        if (field.storage == Storage::zstd_chunked) chunked_ = std::make_unique<ChunkedReader>(dir / field.file);
    }
    void read(std::uint64_t count, void* dst) override {
        if (chunked_)
            chunked_->read(pos_, count, dst, pool_);
        else
            reader_->read(pos_, count, dst);
        pos_ += count;
    }
    void skip(std::uint64_t count) override { pos_ += count; }
    std::uint64_t sample_bytes() const override { return sample_bytes_; }

  private:
    std::shared_ptr<Dataset> d_;
    const FieldReader* reader_;
    std::unique_ptr<ChunkedReader> chunked_;
    std::uint64_t sample_bytes_, pos_ = 0;
    ThreadPool* pool_;
};

// CIFAR-10 records across batch files: either the label (as i32) or the pixels.
class CifarField final : public FieldStream {
  public:
    CifarField(std::vector<std::shared_ptr<File>> files, bool labels) : files_(std::move(files)), labels_(labels) {}
    void read(std::uint64_t count, void* dst) override {
        auto* out = static_cast<std::uint8_t*>(dst);
        while (count > 0) {
            if (file_ >= files_.size()) bad_input(files_.back()->path.string(), "fewer records than expected");
            const File& f = *files_[file_];
            const std::uint64_t in_file = f.bytes / cifar_record_bytes;
            const std::uint64_t take = std::min({count, in_file - record_, std::uint64_t{1024}});
            buf_.resize(take * cifar_record_bytes);
            read_all(f.fd, buf_.data(), buf_.size(), static_cast<long long>(record_ * cifar_record_bytes), f.path);
            for (std::uint64_t r = 0; r < take; ++r) {
                const std::uint8_t* rec = buf_.data() + r * cifar_record_bytes;
                if (labels_) {
                    const std::int32_t label = rec[0];
                    if (label > 9)
                        bad_input(f.path.string(), "record " + std::to_string(record_ + r) + " has label " +
                                                       std::to_string(label) + " (CIFAR-10 labels are 0..9)");
                    std::memcpy(out, &label, 4);
                    out += 4;
                } else {
                    std::memcpy(out, rec + 1, cifar_record_bytes - 1);
                    out += cifar_record_bytes - 1;
                }
            }
            record_ += take;
            count -= take;
            if (record_ == in_file) {
                ++file_;
                record_ = 0;
            }
        }
    }
    std::uint64_t sample_bytes() const override { return labels_ ? 4 : cifar_record_bytes - 1; }

  private:
    std::vector<std::shared_ptr<File>> files_;
    bool labels_;
    std::size_t file_ = 0;
    std::uint64_t record_ = 0;
    std::vector<std::uint8_t> buf_;
};

bool is_little_endian() {
    const std::uint16_t x = 1;
    std::uint8_t b;
    std::memcpy(&b, &x, 1);
    return b == 1;
}

std::string lower(std::string s) {
    std::transform(s.begin(), s.end(), s.begin(), [](unsigned char c) { return std::tolower(c); });
    return s;
}

bool ends_with(std::string_view s, std::string_view suffix) {
    return s.size() >= suffix.size() && s.substr(s.size() - suffix.size()) == suffix;
}

std::string split_for_prefix(std::string prefix) {
    prefix = lower(prefix);
    if (prefix == "t10k" || prefix == "test") return "test";
    if (prefix == "val" || prefix == "valid" || prefix == "validation") return "val";
    return prefix.empty() ? "train" : prefix;
}

Shape sample_shape(const std::vector<std::uint64_t>& dims, const std::string& source) {
    if (dims.empty()) bad_input(source, "a 0-d array has no samples (need at least one dimension)");
    return Shape{std::vector<std::uint64_t>(dims.begin() + 1, dims.end())};
}

// ---- .npy -------------------------------------------------------------

// The C-order-to-Fortran feature permutation of a per-sample shape.
std::vector<std::uint64_t> fortran_feature_order(const Shape& s) {
    if (s.dims.size() <= 1) return {};
    const std::uint64_t n = s.numel();
    std::vector<std::uint64_t> order(n);
    std::vector<std::uint64_t> idx(s.dims.size(), 0);
    for (std::uint64_t c = 0; c < n; ++c) {
        std::uint64_t f = 0, stride = 1;
        for (std::size_t k = 0; k < idx.size(); ++k) {
            f += idx[k] * stride;
            stride *= s.dims[k];
        }
        order[c] = f;
        for (std::size_t k = idx.size(); k-- > 0;) {
            if (++idx[k] < s.dims[k]) break;
            idx[k] = 0;
        }
    }
    return order;
}

SourceField npy_field_from(std::shared_ptr<File> f, const NpyHeader& h, std::uint64_t offset, std::string name,
                           const std::string& source) {
    SourceField sf;
    sf.name = std::move(name);
    sf.dtype = h.dtype;
    sf.shape = sample_shape(h.shape, source);
    const std::uint64_t samples = h.shape[0];
    const std::uint64_t sb = sample_bytes(sf.shape, sf.dtype);
    if (checked_add(offset, h.data_bytes(), "file size") > f->bytes)
        bad_input(source, "header says " + std::to_string(h.data_bytes()) + " bytes of data (shape " +
                              Shape{h.shape}.str() + " of " + h.descr + ") but the file holds " +
                              std::to_string(f->bytes - std::min(f->bytes, offset)) + " (file truncated?)");
    const std::size_t swap = h.big_endian == is_little_endian() ? dtype_size(h.dtype) : 0;
    if (h.fortran_order && samples > 1 && sf.shape.numel() > 1)
        sf.stream = std::make_unique<FeatureMajorField>(f, offset, samples, sf.shape.numel(), dtype_size(h.dtype), swap,
                                                        fortran_feature_order(sf.shape));
    else
        sf.stream =
            std::make_unique<BytesField>(std::make_unique<FileRegion>(f, offset, offset + samples * sb), sb, swap);
    return sf;
}

Source open_npy(const fs::path& path) {
    auto f = std::make_shared<File>(path);
    const NpyHeader h = read_npy_header_fd(f->fd, path.string());
    if (h.data_offset + h.data_bytes() != f->bytes)
        bad_input(path.string(), "header (shape " + Shape{h.shape}.str() + " of " + h.descr + ", " +
                                     std::to_string(h.data_bytes()) + " bytes) disagrees with the file size (" +
                                     std::to_string(f->bytes - std::min(f->bytes, h.data_offset)) +
                                     " data bytes; file truncated?)");
    Source s;
    s.format = InputFormat::npy;
    s.description = ".npy file";
    SourceSplit split;
    split.name = "train";
    split.fields.push_back(npy_field_from(f, h, h.data_offset, "x", path.string()));
    split.samples = h.shape.empty() ? 0 : h.shape[0];
    s.splits.push_back(std::move(split));
    return s;
}

// ---- .npz ---------------------------------------------------------------

// "x_train" -> (train, x); "train_y" -> (train, y); anything else -> (train, name).
std::pair<std::string, std::string> npz_split_field(std::string name) {
    if (ends_with(name, ".npy")) name.resize(name.size() - 4);
    static const char* splits[] = {"train", "test", "val", "valid", "validation"};
    for (const char* sp : splits) {
        const std::string s = sp;
        if (ends_with(name, "_" + s) && name.size() > s.size() + 1)
            return {split_for_prefix(s), name.substr(0, name.size() - s.size() - 1)};
        if (name.rfind(s + "_", 0) == 0 && name.size() > s.size() + 1)
            return {split_for_prefix(s), name.substr(s.size() + 1)};
    }
    return {"train", name};
}

Source open_npz(const fs::path& path) {
    auto f = std::make_shared<File>(path);
    const std::string where = path.string();
    const std::uint64_t tail_bytes = std::min<std::uint64_t>(f->bytes, 1 << 20);
    const auto tail = f->read_at(f->bytes - tail_bytes, tail_bytes);
    std::vector<ZipMember> members = parse_zip_directory(tail, f->bytes, where);
    Source s;
    s.format = InputFormat::npz;
    s.description = ".npz archive";
    std::map<std::string, SourceSplit> splits;
    std::vector<std::string> order;
    auto add = [&](const std::string& member, SourceField sf, std::uint64_t samples) {
        auto [split, field] = npz_split_field(member);
        sf.name = field;
        SourceSplit& sp = splits[split];
        if (sp.name.empty()) {
            order.push_back(split);
            sp.name = split;
            sp.samples = samples;
        } else if (sp.samples != samples) {
            bad_input(where + ":" + member, "has " + std::to_string(samples) +
                                                " samples but the other arrays of split '" + split + "' have " +
                                                std::to_string(sp.samples));
        }
        for (const auto& other : sp.fields)
            if (other.name == sf.name)
                bad_input(where, "two arrays map to field '" + sf.name + "' of split '" + split + "'");
        sp.fields.push_back(std::move(sf));
    };
    for (ZipMember& m : members) {
        if (!ends_with(m.name, ".npy")) continue;
        const std::uint64_t lh_bytes =
            std::min<std::uint64_t>(f->bytes - std::min(f->bytes, m.data_offset), 30 + 65535 * 2);
        m.data_offset = zip_data_offset(f->read_at(m.data_offset, lh_bytes), m, f->bytes, where);
        const std::string source = where + ":" + m.name;
        std::unique_ptr<ByteStream> bytes;
        NpyHeader h;
        if (m.method == 0) {
            // The .npy header is at most 10 + 2^32 bytes; read it in growing pieces.
            std::uint64_t want = std::min<std::uint64_t>(m.uncompressed_bytes, 4096);
            for (;;) {
                const auto head = f->read_at(m.data_offset, want);
                try {
                    h = parse_npy_header(head, source);
                    break;
                } catch (const Error&) {
                    if (want >= std::min<std::uint64_t>(m.uncompressed_bytes, 1ull << 32)) throw;
                    want = std::min<std::uint64_t>(m.uncompressed_bytes, want * 16);
                }
            }
            if (h.data_offset + h.data_bytes() != m.uncompressed_bytes)
                bad_input(source, "array header disagrees with the member size");
            if (h.shape.empty()) bad_input(source, "a 0-d array has no samples");
            add(m.name, npy_field_from(f, h, m.data_offset + h.data_offset, "", source), h.shape[0]);
            continue;
        }
        if (m.method != 8)
            bad_input(source, "compression method " + std::to_string(m.method) +
                                  " is not supported (numpy writes stored or deflated members)");
        auto in = std::make_unique<InflateStream>(f, m);
        std::vector<std::uint8_t> head(10);
        if (m.uncompressed_bytes < 10) bad_input(source, "member too short for a .npy header");
        in->read(head.data(), 10);
        const std::uint64_t hlen = head[6] == 1 ? le16(head.data() + 8) : 0;
        std::uint64_t total = 10 + hlen;
        if (head[6] >= 2) {
            head.resize(12);
            in->read(head.data() + 10, 2);
            total = 12 + le32(head.data() + 8);
        }
        if (total > m.uncompressed_bytes) bad_input(source, ".npy header longer than the member");
        const std::size_t have = head.size();
        head.resize(total);
        in->read(head.data() + have, total - have);
        h = parse_npy_header(head, source);
        if (h.shape.empty()) bad_input(source, "a 0-d array has no samples");
        if (h.data_offset + h.data_bytes() != m.uncompressed_bytes)
            bad_input(source, "array header (" + std::to_string(h.data_bytes()) +
                                  " data bytes) disagrees with the member size");
        if (h.fortran_order && h.shape.size() > 1 && h.count() > h.shape[0])
            bad_input(source, "Fortran-order arrays inside a compressed .npz cannot be streamed; save it with "
                              "np.savez (stored) or as .npy");
        SourceField sf;
        sf.dtype = h.dtype;
        sf.shape = sample_shape(h.shape, source);
        const std::size_t swap = h.big_endian == is_little_endian() ? dtype_size(h.dtype) : 0;
        sf.stream = std::make_unique<BytesField>(std::move(in), sample_bytes(sf.shape, sf.dtype), swap);
        add(m.name, std::move(sf), h.shape[0]);
    }
    if (order.empty()) bad_input(where, "holds no .npy arrays");
    for (const std::string& name : order) s.splits.push_back(std::move(splits[name]));
    return s;
}

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

Source open_v28b(const fs::path& dir, const RawInputOptions& raw) {
    if (!raw.shape)
        throw usage_error("v28b input '" + dir.string() +
                          "' needs --shape (the per-sample shape of images_*.bin, e.g. --shape 3x32x32)");
    const DType dtype = raw.dtype.value_or(DType::f32);
    Source s;
    s.format = InputFormat::v28b;
    s.description = "v28b feature-major .bin files";
    std::vector<fs::path> images;
    for (const auto& e : fs::directory_iterator(dir)) {
        const std::string n = e.path().filename().string();
        if (n.rfind("images_", 0) == 0 && ends_with(n, ".bin")) images.push_back(e.path());
    }
    std::sort(images.begin(), images.end());
    if (images.empty()) bad_input(dir.string(), "holds no images_*.bin files");
    for (const fs::path& ip : images) {
        const std::string stem = ip.filename().string().substr(7, ip.filename().string().size() - 11);
        const fs::path lp = dir / ("labels_" + stem + ".bin");
        if (!fs::exists(lp)) bad_input(ip.string(), "has no matching " + lp.filename().string());
        auto lf = std::make_shared<File>(lp);
        auto imf = std::make_shared<File>(ip);
        SourceSplit split;
        split.name = split_for_prefix(stem);
        split.samples = whole_samples(*lf, dtype_size(raw.label_dtype), "labels");
        const std::uint64_t want = checked_mul(split.samples, sample_bytes(*raw.shape, dtype), "image bytes");
        if (imf->bytes != want)
            bad_input(ip.string(), "has " + std::to_string(imf->bytes) + " bytes but " + std::to_string(split.samples) +
                                       " labels of " + raw.shape->str() + " " + std::string(dtype_name(dtype)) +
                                       " images need " + std::to_string(want) +
                                       " (wrong --shape/--in-dtype, or a file truncated?)");
        split.fields.push_back(raw_field(imf, "x", dtype, *raw.shape, Layout::feature_major, split.samples));
        split.fields.push_back(raw_field(lf, "y", raw.label_dtype, Shape{}, Layout::sample_major, split.samples));
        s.splits.push_back(std::move(split));
    }
    return s;
}

// ---- IDX ------------------------------------------------------------------

std::unique_ptr<GzStream> open_idx_stream(const fs::path& path) {
    if (path == "-") return std::make_unique<GzStream>(STDIN_FILENO, "<stdin>", false);
    const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
    if (fd < 0) throw_errno("cannot open input", path.string());
    return std::make_unique<GzStream>(fd, path.string(), true);
}

IdxHeader read_idx_header(GzStream& in, const std::string& source) {
    std::uint8_t head[4 + 4 * 255];
    in.read(head, 4);
    (void)parse_idx_header({head, 4}, source); // the magic, before trusting the dimension count
    const unsigned ndim = head[3];
    in.read(head + 4, 4ull * ndim);
    return parse_idx_header({head, 4 + 4ull * ndim}, source);
}

// Labels are small: loaded whole and widened to i32.
std::vector<std::uint8_t> load_idx_labels(const fs::path& path, std::uint64_t& samples, std::uint32_t& classes) {
    auto in = open_idx_stream(path);
    const IdxHeader h = read_idx_header(*in, path.string());
    if (h.dtype != DType::u8 || h.dims.size() != 1)
        bad_input(path.string(), "is not an IDX label file (expected 1-d unsigned bytes)");
    samples = h.dims[0];
    std::vector<std::uint8_t> raw(samples);
    in->read(raw.data(), samples);
    if (!in->at_end()) bad_input(path.string(), "has data after its " + std::to_string(samples) + " labels");
    std::vector<std::uint8_t> out(samples * 4);
    std::uint32_t top = 0;
    for (std::uint64_t i = 0; i < samples; ++i) {
        const std::int32_t v = raw[i];
        top = std::max<std::uint32_t>(top, raw[i]);
        std::memcpy(out.data() + 4 * i, &v, 4);
    }
    classes = samples ? top + 1 : 0;
    return out;
}

SourceField idx_images(const fs::path& path, std::uint64_t& samples) {
    auto in = open_idx_stream(path);
    const IdxHeader h = read_idx_header(*in, path.string());
    SourceField sf;
    sf.name = "x";
    sf.dtype = h.dtype;
    sf.shape = sample_shape(h.dims, path.string());
    if (sf.shape.dims.size() == 2) sf.shape.dims.insert(sf.shape.dims.begin(), 1); // HxW images as 1xHxW
    samples = h.dims[0];
    (void)checked_mul(samples, sample_bytes(sf.shape, sf.dtype), "IDX data size");
    sf.stream = std::make_unique<BytesField>(std::move(in), sample_bytes(sf.shape, sf.dtype),
                                             is_little_endian() ? dtype_size(h.dtype) : 0);
    return sf;
}

// "t10k-images-idx3-ubyte.gz" -> ("t10k", images)
bool idx_name(const std::string& file, std::string& prefix, bool& images) {
    for (const char* kind : {"-images", "-labels"}) {
        const auto at = file.find(kind);
        if (at != std::string::npos && file.find("idx", at) != std::string::npos) {
            prefix = file.substr(0, at);
            images = std::string(kind) == "-images";
            return true;
        }
    }
    return false;
}

Source open_idx_dir(const fs::path& dir) {
    std::map<std::string, std::pair<fs::path, fs::path>> pairs; // prefix -> (images, labels)
    for (const auto& e : fs::directory_iterator(dir)) {
        std::string prefix;
        bool images = false;
        if (!e.is_regular_file() || !idx_name(e.path().filename().string(), prefix, images)) continue;
        (images ? pairs[prefix].first : pairs[prefix].second) = e.path();
    }
    Source s;
    s.format = InputFormat::idx;
    s.description = "MNIST-style IDX files";
    std::uint32_t classes = 0;
    for (const auto& [prefix, p] : pairs) {
        if (p.first.empty()) continue;
        SourceSplit split;
        split.name = split_for_prefix(prefix);
        split.fields.push_back(idx_images(p.first, split.samples));
        if (!p.second.empty()) {
            std::uint64_t labels = 0;
            std::uint32_t c = 0;
            auto data = load_idx_labels(p.second, labels, c);
            if (labels != split.samples)
                bad_input(p.second.string(), "has " + std::to_string(labels) + " labels but " +
                                                 p.first.filename().string() + " has " + std::to_string(split.samples) +
                                                 " images");
            classes = std::max(classes, c);
            SourceField y;
            y.name = "y";
            y.dtype = DType::i32;
            y.stream = std::make_unique<MemoryField>(std::move(data), 4);
            split.fields.push_back(std::move(y));
        }
        s.splits.push_back(std::move(split));
    }
    if (s.splits.empty()) bad_input(dir.string(), "holds no *-images-idx*-ubyte[.gz] files");
    // train before test, as a user lists them.
    std::stable_sort(s.splits.begin(), s.splits.end(), [](const SourceSplit& a, const SourceSplit& b) {
        return (a.name == "train") > (b.name == "train");
    });
    if (classes) s.num_classes = classes;
    return s;
}

Source open_idx_file(const fs::path& path) {
    Source s;
    s.format = InputFormat::idx;
    s.description = "IDX file";
    s.rereadable = path != "-";
    std::string prefix;
    bool images = true;
    SourceSplit split;
    split.name = idx_name(path.filename().string(), prefix, images) ? split_for_prefix(prefix) : "train";
    split.fields.push_back(idx_images(path, split.samples));
    s.splits.push_back(std::move(split));
    return s;
}

// --labels FILE: field y of a single-split raw or IDX-file source. Images
// from stdin take their split name from an IDX-style label file name
// (t10k-labels-idx1-ubyte.gz: test).
void attach_labels(Source& s, const fs::path& images, const fs::path& labels) {
    SourceSplit& split = s.splits.front();
    std::string prefix;
    bool is_images = false;
    if (images == "-" && idx_name(labels.filename().string(), prefix, is_images) && !is_images)
        split.name = split_for_prefix(prefix);
    std::uint64_t count = 0;
    std::uint32_t classes = 0;
    auto data = load_idx_labels(labels, count, classes);
    if (!split.count_known) {
        split.samples = count; // stdin images: the labels give the count
        split.count_known = true;
    } else if (count != split.samples) {
        bad_input(labels.string(), "has " + std::to_string(count) + " labels but the images have " +
                                       std::to_string(split.samples) + " samples");
    }
    SourceField y;
    y.name = "y";
    y.dtype = DType::i32;
    y.stream = std::make_unique<MemoryField>(std::move(data), 4);
    split.fields.push_back(std::move(y));
    if (classes) s.num_classes = classes;
}

// ---- CIFAR-10 -----------------------------------------------------------

Source open_cifar(const fs::path& path) {
    Source s;
    s.format = InputFormat::cifar10;
    s.description = "CIFAR-10 binary batches";
    s.num_classes = 10;
    std::vector<fs::path> train, test;
    fs::path dir = path;
    if (fs::is_directory(path) && fs::exists(path / "cifar-10-batches-bin")) dir = path / "cifar-10-batches-bin";
    if (fs::is_directory(dir)) {
        for (const auto& e : fs::directory_iterator(dir)) {
            const std::string n = e.path().filename().string();
            if (n.rfind("data_batch_", 0) == 0 && ends_with(n, ".bin")) train.push_back(e.path());
            if (n == "test_batch.bin") test.push_back(e.path());
        }
        std::sort(train.begin(), train.end());
    } else {
        (path.filename().string() == "test_batch.bin" ? test : train).push_back(path);
    }
    for (auto* list : {&train, &test}) {
        if (list->empty()) continue;
        std::vector<std::shared_ptr<File>> files;
        SourceSplit split;
        split.name = list == &train ? "train" : "test";
        for (const fs::path& p : *list) {
            files.push_back(std::make_shared<File>(p));
            split.samples += cifar_record_count(files.back()->bytes, p.string());
        }
        SourceField x, y;
        x.name = "x";
        x.dtype = DType::u8;
        x.shape = Shape{{3, 32, 32}};
        x.stream = std::make_unique<CifarField>(files, false);
        y.name = "y";
        y.dtype = DType::i32;
        y.stream = std::make_unique<CifarField>(files, true);
        split.fields.push_back(std::move(x));
        split.fields.push_back(std::move(y));
        s.splits.push_back(std::move(split));
    }
    if (s.splits.empty()) bad_input(path.string(), "holds no data_batch_*.bin or test_batch.bin");
    return s;
}

// ---- dataset directory --------------------------------------------------

Source open_dataset_dir(const fs::path& dir, ThreadPool& pool) {
    auto d = std::make_shared<Dataset>(Dataset::open(dir));
    Source s;
    s.format = InputFormat::dataset;
    s.description = "dataset directory";
    s.manifest = d->manifest();
    s.num_classes = d->manifest().num_classes;
    for (const SplitInfo& sp : d->manifest().splits) {
        SourceSplit split;
        split.name = sp.name;
        split.samples = sp.samples;
        for (const FieldInfo& fi : sp.fields) {
            SourceField f;
            f.name = fi.name;
            f.dtype = fi.dtype;
            f.shape = fi.shape;
            f.stream = std::make_unique<DatasetField>(d, dir, sp, fi, pool);
            split.fields.push_back(std::move(f));
        }
        s.splits.push_back(std::move(split));
    }
    return s;
}

bool has_file_starting(const fs::path& dir, std::string_view prefix, std::string_view suffix = "") {
    for (const auto& e : fs::directory_iterator(dir)) {
        const std::string n = e.path().filename().string();
        if (n.rfind(prefix, 0) == 0 && ends_with(n, suffix)) return true;
    }
    return false;
}

InputFormat detect_format(const fs::path& path) {
    if (path == "-") return InputFormat::idx;
    std::error_code ec;
    const auto st = fs::status(path, ec);
    if (ec || !fs::exists(st))
        throw runtime_error("cannot open input '" + path.string() + "' (" +
                            (ec ? ec.message() : std::string("No such file or directory")) + ")");
    if (fs::is_directory(st)) {
        if (fs::exists(path / manifest_file_name)) return InputFormat::dataset;
        if (fs::exists(path / "cifar-10-batches-bin") || has_file_starting(path, "data_batch_", ".bin") ||
            fs::exists(path / "test_batch.bin"))
            return InputFormat::cifar10;
        if (has_file_starting(path, "images_", ".bin")) return InputFormat::v28b;
        for (const auto& e : fs::directory_iterator(path)) {
            std::string prefix;
            bool images = false;
            if (idx_name(e.path().filename().string(), prefix, images)) return InputFormat::idx;
        }
        throw usage_error("cannot tell the format of directory '" + path.string() +
                          "' (no dataset.json, CIFAR-10 batches, v28b or IDX files); give --from");
    }
    const std::string name = lower(path.filename().string());
    if (ends_with(name, ".npy")) return InputFormat::npy;
    if (ends_with(name, ".npz")) return InputFormat::npz;
    if (name == "test_batch.bin" || name.rfind("data_batch_", 0) == 0) return InputFormat::cifar10;
    File f(path);
    std::uint8_t head[4] = {0, 0, 0, 0};
    if (f.bytes >= 4) read_all(f.fd, head, 4, 0, path);
    if (head[0] == 0x93 && std::memcmp(head + 1, "NUM", 3) == 0) return InputFormat::npy;
    if (head[0] == 'P' && head[1] == 'K') return InputFormat::npz;
    if ((head[0] == 0x1f && head[1] == 0x8b) || name.find("idx") != std::string::npos ||
        (head[0] == 0 && head[1] == 0 && head[2] >= 0x08 && head[2] <= 0x0E))
        return InputFormat::idx;
    return InputFormat::raw;
}

} // namespace

void FieldStream::skip(std::uint64_t count) {
    std::vector<std::uint8_t> scratch;
    const std::uint64_t per = std::max<std::uint64_t>(1, io_block / std::max<std::uint64_t>(1, sample_bytes()));
    while (count > 0) {
        const std::uint64_t n = std::min(count, per);
        scratch.resize(n * sample_bytes());
        read(n, scratch.data());
        count -= n;
    }
}

std::string_view input_format_name(InputFormat f) {
    switch (f) {
    case InputFormat::automatic:
        return "auto";
    case InputFormat::dataset:
        return "dataset";
    case InputFormat::npy:
        return "npy";
    case InputFormat::npz:
        return "npz";
    case InputFormat::raw:
        return "raw";
    case InputFormat::v28b:
        return "v28b";
    case InputFormat::idx:
        return "idx";
    case InputFormat::cifar10:
        return "cifar10";
    }
    return "?";
}

InputFormat parse_input_format(std::string_view name) {
    for (InputFormat f : {InputFormat::automatic, InputFormat::dataset, InputFormat::npy, InputFormat::npz,
                          InputFormat::raw, InputFormat::v28b, InputFormat::idx, InputFormat::cifar10})
        if (input_format_name(f) == name) return f;
    throw usage_error("unknown input format '" + std::string(name) +
                      "' (expected auto, dataset, npy, npz, raw, v28b, idx or cifar10)");
}

Layout parse_layout(std::string_view name) {
    if (name == "sample-major") return Layout::sample_major;
    if (name == "feature-major") return Layout::feature_major;
    throw usage_error("unknown layout '" + std::string(name) + "' (expected sample-major or feature-major)");
}

void byteswap_elements(void* data, std::uint64_t count, std::size_t elem_bytes) {
    auto* p = static_cast<std::uint8_t*>(data);
    for (std::uint64_t i = 0; i < count; ++i, p += elem_bytes) std::reverse(p, p + elem_bytes);
}

IdxHeader parse_idx_header(std::span<const std::uint8_t> bytes, const std::string& source) {
    if (bytes.size() < 4) bad_input(source, "too short for an IDX header");
    if (bytes[0] != 0 || bytes[1] != 0)
        bad_input(source, "wrong magic (an IDX file starts with two zero bytes; is it gzipped or another format?)");
    IdxHeader h;
    switch (bytes[2]) {
    case 0x08:
        h.dtype = DType::u8;
        break;
    case 0x09:
        h.dtype = DType::i8;
        break;
    case 0x0B:
        h.dtype = DType::i16;
        break;
    case 0x0C:
        h.dtype = DType::i32;
        break;
    case 0x0D:
        h.dtype = DType::f32;
        break;
    case 0x0E:
        h.dtype = DType::f64;
        break;
    default:
        bad_input(source, "unknown IDX element type 0x" + std::to_string(bytes[2]));
    }
    const unsigned ndim = bytes[3];
    if (ndim == 0) bad_input(source, "IDX header has no dimensions");
    if (bytes.size() == 4) return h; // magic only: the caller reads the dimensions next
    if (bytes.size() < 4 + 4ull * ndim) bad_input(source, "IDX header is cut short");
    std::uint64_t total = dtype_size(h.dtype);
    for (unsigned k = 0; k < ndim; ++k) {
        h.dims.push_back(be32(bytes.data() + 4 + 4 * k));
        if (h.dims.back() == 0 && k > 0) bad_input(source, "IDX dimension " + std::to_string(k) + " is 0");
        if (h.dims.back() != 0 && total > (std::uint64_t{1} << 62) / h.dims.back())
            bad_input(source, "IDX dimensions overflow");
        total *= std::max<std::uint64_t>(1, h.dims.back());
    }
    h.data_offset = 4 + 4ull * ndim;
    return h;
}

std::vector<ZipMember> parse_zip_directory(std::span<const std::uint8_t> tail, std::uint64_t file_bytes,
                                           const std::string& source) {
    if (tail.size() < 22 || tail.size() > file_bytes) bad_input(source, "too short for a zip archive (.npz)");
    const std::uint64_t tail_start = file_bytes - tail.size();
    std::size_t eocd = tail.size() - 22 + 1;
    while (eocd-- > 0)
        if (le32(tail.data() + eocd) == 0x06054b50 && eocd + 22 + le16(tail.data() + eocd + 20) == tail.size()) break;
    if (eocd == static_cast<std::size_t>(-1))
        bad_input(source, "no zip end-of-directory record (not an .npz archive, or truncated)");
    const std::uint8_t* e = tail.data() + eocd;
    std::uint64_t entries = le16(e + 10), cd_size = le32(e + 12), cd_offset = le32(e + 16);
    if ((entries == 0xFFFF || cd_size == 0xFFFFFFFF || cd_offset == 0xFFFFFFFF) && eocd >= 20 &&
        le32(e - 20) == 0x07064b50) {
        const std::uint64_t z64 = le64(e - 20 + 8);
        // (z64 + 56 can wrap around: compare what is left after z64 instead)
        if (z64 < tail_start || z64 > file_bytes || file_bytes - z64 < 56)
            bad_input(source, "zip64 end record is out of range");
        const std::uint8_t* z = tail.data() + (z64 - tail_start);
        if (le32(z) != 0x06064b50) bad_input(source, "zip64 end record has the wrong signature");
        entries = le64(z + 32);
        cd_size = le64(z + 40);
        cd_offset = le64(z + 48);
    }
    if (cd_offset > file_bytes || cd_size > file_bytes - cd_offset || cd_offset < tail_start)
        bad_input(source, "zip central directory is out of range (archive truncated?)");
    std::vector<ZipMember> out;
    const std::uint8_t* p = tail.data() + (cd_offset - tail_start);
    const std::uint8_t* end = p + cd_size;
    for (std::uint64_t i = 0; i < entries; ++i) {
        if (end - p < 46 || le32(p) != 0x02014b50) bad_input(source, "zip central directory entry is malformed");
        ZipMember m;
        m.method = le16(p + 10);
        m.crc32 = le32(p + 16);
        m.compressed_bytes = le32(p + 20);
        m.uncompressed_bytes = le32(p + 24);
        const std::size_t name_len = le16(p + 28), extra_len = le16(p + 30), comment_len = le16(p + 32);
        m.data_offset = le32(p + 42);
        if (static_cast<std::size_t>(end - p) < 46 + name_len + extra_len + comment_len)
            bad_input(source, "zip central directory entry is cut short");
        m.name.assign(reinterpret_cast<const char*>(p + 46), name_len);
        const std::uint8_t* x = p + 46 + name_len;
        const std::uint8_t* xend = x + extra_len;
        while (xend - x >= 4) {
            const std::uint16_t tag = le16(x), len = le16(x + 2);
            if (xend - x - 4 < len) break;
            if (tag == 0x0001) { // zip64: only the fields that overflowed are present, in order
                const std::uint8_t* v = x + 4;
                const std::uint8_t* vend = v + len;
                auto take = [&](std::uint64_t& field) {
                    if (field != 0xFFFFFFFF) return;
                    if (vend - v < 8) bad_input(source, "zip64 extra field is cut short");
                    field = le64(v);
                    v += 8;
                };
                take(m.uncompressed_bytes);
                take(m.compressed_bytes);
                take(m.data_offset);
            }
            x += 4 + len;
        }
        if (m.data_offset >= file_bytes || m.compressed_bytes > file_bytes)
            bad_input(source, "zip member '" + m.name + "' is outside the archive (truncated?)");
        out.push_back(std::move(m));
        p += 46 + name_len + extra_len + comment_len;
    }
    return out;
}

std::uint64_t zip_data_offset(std::span<const std::uint8_t> local_header, const ZipMember& m, std::uint64_t file_bytes,
                              const std::string& source) {
    if (local_header.size() < 30 || le32(local_header.data()) != 0x04034b50)
        bad_input(source, "zip member '" + m.name + "' has no local header (archive corrupted)");
    const std::uint64_t data =
        m.data_offset + 30 + le16(local_header.data() + 26) + std::uint64_t{le16(local_header.data() + 28)};
    if (data > file_bytes || m.compressed_bytes > file_bytes - data)
        bad_input(source, "zip member '" + m.name + "' extends past the end of the archive (truncated?)");
    if (m.method == 0 && m.compressed_bytes != m.uncompressed_bytes)
        bad_input(source, "stored zip member '" + m.name + "' has different stored and original sizes");
    return data;
}

std::uint64_t cifar_record_count(std::uint64_t file_bytes, const std::string& source) {
    if (file_bytes == 0 || file_bytes % cifar_record_bytes != 0)
        bad_input(source, std::to_string(file_bytes) + " bytes is not a whole number of CIFAR-10 records of " +
                              std::to_string(cifar_record_bytes) + " bytes (truncated, or not a CIFAR-10 batch?)");
    return file_bytes / cifar_record_bytes;
}

Source open_source(const fs::path& path, InputFormat format, const RawInputOptions& raw, ThreadPool& pool) {
    // stdin cannot be sniffed and put back: IDX unless the user described raw samples.
    if (format == InputFormat::automatic && path == "-" && (raw.shape || raw.dtype)) format = InputFormat::raw;
    if (format == InputFormat::automatic) format = detect_format(path);
    if (path == "-" && format != InputFormat::idx && format != InputFormat::raw)
        throw usage_error("stdin ('-') can only be read as raw or IDX (--from raw|idx)");
    if (raw.shape && format != InputFormat::raw && format != InputFormat::v28b)
        throw usage_error("--shape describes raw and v28b inputs only; '" + path.string() + "' is " +
                          std::string(input_format_name(format)));
    if (!raw.labels.empty()) {
        const bool idx_file = format == InputFormat::idx && (path == "-" || !fs::is_directory(path));
        if (format != InputFormat::raw && !idx_file)
            throw usage_error("--labels gives the labels of raw or IDX-file images; '" + path.string() + "' is " +
                              std::string(input_format_name(format)) +
                              (format == InputFormat::idx ? " (a directory pairs its own label files)" : ""));
        if (raw.labels == "-" && path == "-") throw usage_error("--labels - : stdin already carries the images");
        Source s = format == InputFormat::raw ? open_raw(path, raw) : open_idx_file(path);
        attach_labels(s, path, raw.labels);
        return s;
    }
    switch (format) {
    case InputFormat::dataset:
        return open_dataset_dir(path, pool);
    case InputFormat::npy:
        return open_npy(path);
    case InputFormat::npz:
        return open_npz(path);
    case InputFormat::raw:
        return open_raw(path, raw);
    case InputFormat::v28b:
        return open_v28b(path, raw);
    case InputFormat::idx:
        return path != "-" && fs::is_directory(path) ? open_idx_dir(path) : open_idx_file(path);
    case InputFormat::cifar10:
        return open_cifar(path);
    case InputFormat::automatic:
        break;
    }
    throw usage_error("cannot tell the format of '" + path.string() + "'; give --from");
}

} // namespace dstk
