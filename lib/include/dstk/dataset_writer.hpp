#pragma once
// Writing a dataset directory atomically: fields are streamed into .npy files
// inside a temporary directory, checksummed as they are written, and the whole
// directory is renamed into place by commit().
#include <cstdint>
#include <filesystem>
#include <memory>
#include <string>

#include "dstk/atomic_output.hpp"
#include "dstk/checksum.hpp"
#include "dstk/manifest.hpp"

#include "dstk/fd.hpp"

namespace dstk {

// Sequential writer of one .npy field file of a known sample count.
class NpyFieldWriter {
  public:
    NpyFieldWriter(std::filesystem::path path, std::string file_name, std::string field, DType dtype, Shape shape,
                   std::uint64_t samples);
    ~NpyFieldWriter();
    NpyFieldWriter(const NpyFieldWriter&) = delete;
    NpyFieldWriter& operator=(const NpyFieldWriter&) = delete;

    // Appends whole samples in order.
    void append(const void* data, std::uint64_t count);
    std::uint64_t written() const { return written_; }
    // Checks the count, closes the file; returns the manifest entry.
    FieldInfo finish();

  private:
    std::filesystem::path path_;
    FieldInfo info_;
    std::uint64_t samples_, written_ = 0;
    UniqueFd fd_;
    Xxh64 hash_;
};

class DatasetWriter {
  public:
    DatasetWriter(std::filesystem::path out_dir, bool force);

    const std::filesystem::path& tmp_dir() const { return dir_.tmp_path(); }
    // A path inside the temporary directory, registered for clean-up.
    std::filesystem::path file(const std::string& name) { return dir_.file(name); }
    std::unique_ptr<NpyFieldWriter> npy_field(const std::string& split, const std::string& field, DType dtype,
                                              const Shape& shape, std::uint64_t samples);
    // Writes dataset.json into the temporary directory.
    void write_manifest(const Manifest& manifest);
    // The directory, for an OutputSet that puts it in place with side files.
    AtomicDir& output() { return dir_; }
    // write_manifest, then the directory renamed into place.
    void commit(const Manifest& manifest);

  private:
    AtomicDir dir_;
};

} // namespace dstk
