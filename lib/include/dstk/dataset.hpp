#pragma once
// Reading a dataset directory. Dataset::open validates the manifest against
// the files (existence, sizes, npy headers, chunk indexes; every part of a
// field in parts) before any allocation; errors name the file and the
// mismatch. Each field's files are opened once, by its FieldReader
// (field_reader.hpp), which every reader of the dataset shares; the stream
// placement opens its own (data/stream_reader.hpp).
#include <cstdint>
#include <filesystem>
#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "dstk/field_reader.hpp"
#include "dstk/manifest.hpp"

namespace dstk {

class Dataset {
  public:
    static Dataset open(const std::filesystem::path& dir);

    const Manifest& manifest() const { return manifest_; }
    const std::filesystem::path& dir() const { return dir_; }
    // The field's reader, owned by the dataset; immutable and thread-safe.
    const FieldReader& reader(std::string_view split, std::string_view field) const;
    void read(std::string_view split, std::string_view field, std::uint64_t first, std::uint64_t count,
              void* dst) const;

  private:
    std::filesystem::path dir_;
    Manifest manifest_;
    std::vector<std::pair<std::string, std::unique_ptr<FieldReader>>> readers_; // "split/field"
};

// Re-reads every file, checking sizes and checksums. Throws naming the first
// bad file (and chunk, for chunked storage).
void verify_dataset(const std::filesystem::path& dir);

} // namespace dstk
