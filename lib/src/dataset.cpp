#include "dstk/dataset.hpp"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include "dstk/atomic_output.hpp"
#include "dstk/chunked_file.hpp"
#include "dstk/checksum.hpp"
#include "dstk/error.hpp"
#include "dstk/fd.hpp"
#include "dstk/npy.hpp"
#include "dstk/units.hpp"

namespace fs = std::filesystem;

namespace dstk {
namespace {

// Reads samples of an uncompressed .npy file with pread: no mmap, so a file
// that shrinks under us gives an error, not a SIGBUS.
class NpyFieldReader final : public FieldReader {
  public:
    NpyFieldReader(const fs::path& path, const SplitInfo& split, const FieldInfo& field)
        : FieldReader(path, field, split.samples), fd_(UniqueFd::open(path, O_RDONLY, "open dataset file")) {
        validate(split, field, path.string());
    }

    void read(std::uint64_t first, std::uint64_t count, void* dst) const override {
        check_range(first, count);
        const std::uint64_t sb = sample_bytes();
        read_all(fd_.get(), dst, count * sb, static_cast<long long>(data_offset_ + first * sb), path());
    }

  private:
    void validate(const SplitInfo& split, const FieldInfo& field, const std::string& where) {
        struct stat st {};
        if (::fstat(fd_.get(), &st) != 0) throw_errno("cannot stat", where);
        const auto size = static_cast<std::uint64_t>(st.st_size);
        const std::string redo = "; re-create the dataset (dsgen/dsconvert) or restore the file";
        if (size != field.bytes)
            throw runtime_error(where + ": file has " + std::to_string(size) + " bytes but " + manifest_file_name +
                                " says " + std::to_string(field.bytes) +
                                (size < field.bytes ? " (file truncated?)" : "") + redo);
        const NpyHeader h = read_npy_header_fd(fd_.get(), where);
        const bool dtype_ok = h.dtype == field.dtype || (field.dtype == DType::bf16 && h.dtype == DType::u16);
        if (!dtype_ok)
            throw runtime_error(where + ": .npy dtype '" + h.descr + "' disagrees with " + manifest_file_name + " (" +
                                std::string(dtype_name(field.dtype)) + ")" + redo);
        if (h.big_endian || h.fortran_order)
            throw runtime_error(where + ": dataset .npy files must be little-endian and C order" + redo);
        std::vector<std::uint64_t> expect{split.samples};
        expect.insert(expect.end(), field.shape.dims.begin(), field.shape.dims.end());
        if (h.shape != expect) {
            Shape got{std::vector<std::uint64_t>(h.shape.begin(), h.shape.end())};
            Shape want{expect};
            throw runtime_error(where + ": .npy shape " + got.str() + " disagrees with " + manifest_file_name + " (" +
                                want.str() + ": " + std::to_string(split.samples) + " samples of " + field.shape.str() +
                                ")" + redo);
        }
        const std::uint64_t data = checked_sample_total(field, split.samples);
        if (h.data_offset + data != size)
            throw runtime_error(where + ": header and data size disagree with the file size (" +
                                std::to_string(h.data_offset) + " + " + std::to_string(data) +
                                " != " + std::to_string(size) + ")" + redo);
        data_offset_ = h.data_offset;
    }

    UniqueFd fd_;
    std::uint64_t data_offset_ = 0;
};

// Reads a zstd-chunked field: the chunk index is checked against the manifest
// at open; reads decode the chunks they touch (chunked_file.hpp).
class ChunkedFieldReader final : public FieldReader {
  public:
    ChunkedFieldReader(const fs::path& path, const SplitInfo& split, const FieldInfo& field)
        : FieldReader(path, field, split.samples), chunks_(path) {
        const std::string where = path.string();
        const std::string redo = "; re-create the dataset (dsgen/dsconvert) or restore the file";
        if (chunks_.file_bytes() != field.bytes)
            throw runtime_error(where + ": file has " + std::to_string(chunks_.file_bytes()) + " bytes but " +
                                manifest_file_name + " says " + std::to_string(field.bytes) + redo);
        if (chunks_.samples() != split.samples || chunks_.sample_bytes() != field.sample_bytes() ||
            chunks_.chunk_samples() != field.chunk_samples)
            throw runtime_error(where + ": chunk index (" + std::to_string(chunks_.samples()) + " samples of " +
                                std::to_string(chunks_.sample_bytes()) + " bytes, " +
                                std::to_string(chunks_.chunk_samples()) + " per chunk) disagrees with " +
                                manifest_file_name + " (" + std::to_string(split.samples) + " samples of " +
                                std::to_string(field.sample_bytes()) + " bytes, " +
                                std::to_string(field.chunk_samples) + " per chunk)" + redo);
    }

    void read(std::uint64_t first, std::uint64_t count, void* dst) const override {
        check_range(first, count);
        chunks_.read(first, count, dst);
    }

    // Chunk by chunk first, so that a corruption is reported with its chunk.
    void verify() const override {
        chunks_.verify();
        FieldReader::verify();
    }

  private:
    ChunkedReader chunks_;
};

} // namespace

void FieldReader::check_range(std::uint64_t first, std::uint64_t count) const {
    if (first > samples_ || count > samples_ - first)
        throw runtime_error("read of samples [" + std::to_string(first) + ", " + std::to_string(first + count) +
                            ") is outside '" + path_.string() + "' (" + std::to_string(samples_) + " samples)");
}

void FieldReader::verify() const {
    std::error_code ec;
    const auto size = fs::file_size(path_, ec);
    if (ec) throw runtime_error("cannot stat '" + path_.string() + "' (" + ec.message() + ")");
    if (size != info_.bytes)
        throw runtime_error(path_.string() + ": file has " + std::to_string(size) + " bytes but the manifest says " +
                            std::to_string(info_.bytes) + "; re-create the dataset");
    if (info_.checksum.empty()) return;
    const std::string sum = file_checksum(path_);
    if (sum != info_.checksum)
        throw runtime_error(path_.string() + ": checksum " + sum + " does not match the manifest's " + info_.checksum +
                            " (file corrupted or modified); re-create the dataset");
}

std::unique_ptr<FieldReader> open_field_reader(const fs::path& dir, const SplitInfo& split, const FieldInfo& field) {
    const fs::path path = dir / field.file;
    switch (field.storage) {
    case Storage::npy:
        return std::make_unique<NpyFieldReader>(path, split, field);
    case Storage::zstd_chunked:
        return std::make_unique<ChunkedFieldReader>(path, split, field);
    }
    throw runtime_error(path.string() + ": unknown storage");
}

Dataset Dataset::open(const fs::path& dir) {
    Dataset d;
    d.dir_ = dir;
    d.manifest_ = load_manifest(dir);
    for (const auto& split : d.manifest_.splits)
        for (const auto& field : split.fields)
            d.readers_.emplace_back(split.name + "/" + field.name, open_field_reader(dir, split, field));
    return d;
}

const FieldReader& Dataset::reader(std::string_view split, std::string_view field) const {
    const SplitInfo& s = manifest_.split(split);
    (void)s.field(field); // names what exists when absent
    const std::string key = std::string(split) + "/" + std::string(field);
    for (const auto& [k, r] : readers_)
        if (k == key) return *r;
    throw runtime_error("no reader for " + key);
}

void Dataset::read(std::string_view split, std::string_view field, std::uint64_t first, std::uint64_t count,
                   void* dst) const {
    reader(split, field).read(first, count, dst);
}

void verify_dataset(const fs::path& dir) {
    const Dataset d = Dataset::open(dir);
    for (const auto& split : d.manifest().splits)
        for (const auto& field : split.fields) d.reader(split.name, field.name).verify();
}

} // namespace dstk
