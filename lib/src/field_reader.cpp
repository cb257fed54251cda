#include "dstk/field_reader.hpp"

#include <fcntl.h>

#include <utility>
#include <vector>

#include "dstk/atomic_output.hpp"
#include "dstk/chunked_file.hpp"
#include "dstk/error.hpp"
#include "field_files.hpp"

namespace fs = std::filesystem;

namespace dstk {
namespace {

// Reads .npy storage with pread: no mmap, so a file that shrinks under us
// gives an error, not a SIGBUS.
class NpyFieldReader final : public FieldReader {
  public:
    NpyFieldReader(std::vector<FileSpec> files, const FieldInfo& field, std::uint64_t samples)
        : FieldReader(files.at(0).path, field, samples), files_(std::move(files)) {
        for (const FileSpec& f : files_.files()) {
            UniqueFd fd = open_field_file(f, O_RDONLY);
            offsets_.push_back(validate_npy_file(fd.get(), f, field));
            fds_.push_back(std::move(fd));
        }
    }

    void read(std::uint64_t first, std::uint64_t count, void* dst, ThreadPool*) const override {
        check_range(first, count);
        auto* out = static_cast<std::uint8_t*>(dst);
        files_.each(first, count, [&](std::size_t i, std::uint64_t in, std::uint64_t n, std::uint64_t done) {
            read_all(fds_[i].get(), out + done * sample_bytes(), n * sample_bytes(),
                     static_cast<long long>(offsets_[i] + in * sample_bytes()), files_[i].path);
        });
    }

    void verify(ThreadPool*) const override {
        for (const FileSpec& f : files_.files()) verify_file(f);
    }

  private:
    FilePieces files_;
    std::vector<UniqueFd> fds_;
    std::vector<std::uint64_t> offsets_; // of each file's data
};

// Reads zstd-chunked storage: each file's chunk index is checked against the
// manifest at open.
class ChunkedFieldReader final : public FieldReader {
  public:
    ChunkedFieldReader(std::vector<FileSpec> files, const FieldInfo& field, std::uint64_t samples)
        : FieldReader(files.at(0).path, field, samples), files_(std::move(files)) {
        for (const FileSpec& f : files_.files()) {
            require_file(f); // names a missing or short part as such
            readers_.push_back(open_chunked_part(f, field));
        }
    }

    void read(std::uint64_t first, std::uint64_t count, void* dst, ThreadPool* pool) const override {
        check_range(first, count);
        auto* out = static_cast<std::uint8_t*>(dst);
        files_.each(first, count, [&](std::size_t i, std::uint64_t in, std::uint64_t n, std::uint64_t done) {
            readers_[i]->read(in, n, out + done * sample_bytes(), pool);
        });
    }

    // Chunk by chunk first, so that a corruption is reported with its chunk.
    void verify(ThreadPool* pool) const override {
        for (std::size_t i = 0; i < files_.size(); ++i) {
            readers_[i]->verify(pool);
            verify_file(files_[i]);
        }
    }

  private:
    FilePieces files_;
    std::vector<std::unique_ptr<ChunkedReader>> readers_;
};

} // namespace

std::unique_ptr<ChunkedReader> open_chunked_part(const FileSpec& f, const FieldInfo& field) {
    auto r = std::make_unique<ChunkedReader>(f.path);
    check_file_bytes(r->file_bytes(), f);
    if (r->samples() != f.samples || r->sample_bytes() != field.sample_bytes() ||
        r->chunk_samples() != field.chunk_samples)
        throw runtime_error(f.where + ": chunk index (" + std::to_string(r->samples()) + " samples of " +
                            std::to_string(r->sample_bytes()) + " bytes, " + std::to_string(r->chunk_samples()) +
                            " per chunk) disagrees with " + manifest_file_name + " (" + std::to_string(f.samples) +
                            " samples of " + std::to_string(field.sample_bytes()) + " bytes, " +
                            std::to_string(field.chunk_samples) + " per chunk)" + redo_dataset);
    return r;
}

void check_sample_range(const fs::path& path, std::uint64_t samples, std::uint64_t first, std::uint64_t count) {
    if (first > samples || count > samples - first)
        throw runtime_error("read of samples [" + std::to_string(first) + ", " + std::to_string(first + count) +
                            ") is outside '" + path.string() + "' (" + std::to_string(samples) + " samples)");
}

void FieldReader::check_range(std::uint64_t first, std::uint64_t count) const {
    check_sample_range(path_, samples_, first, count);
}

std::unique_ptr<FieldReader> open_field_reader(const fs::path& dir, const SplitInfo& split, const FieldInfo& field) {
    std::vector<FileSpec> files = field_files(dir, split, field);
    switch (field.storage) {
    case Storage::npy:
        return std::make_unique<NpyFieldReader>(std::move(files), field, split.samples);
    case Storage::zstd_chunked:
        return std::make_unique<ChunkedFieldReader>(std::move(files), field, split.samples);
    }
    throw runtime_error(files.front().where + ": unknown storage");
}

} // namespace dstk
