#pragma once
// Reading a dataset directory. Dataset::open validates the manifest against
// the files (existence, sizes, npy headers) before any mmap or allocation;
// errors name the file and the mismatch.
#include <cstdint>
#include <filesystem>
#include <memory>
#include <string>
#include <string_view>

#include "dstk/manifest.hpp"

namespace dstk {

// Random access to one field of one split, at sample granularity. Thread-safe.
class FieldReader {
  public:
    virtual ~FieldReader() = default;
    // Copies samples [first, first + count) into dst (count * sample_bytes bytes).
    virtual void read(std::uint64_t first, std::uint64_t count, void* dst) const = 0;
    // Re-reads the whole file and checks its size and checksum against the
    // manifest; throws naming the file (and the first bad chunk where the
    // storage has chunks).
    virtual void verify() const;
    const FieldInfo& info() const { return info_; }
    const std::filesystem::path& path() const { return path_; }
    std::uint64_t samples() const { return samples_; }
    std::uint64_t sample_bytes() const { return info_.sample_bytes(); }

  protected:
    FieldReader(std::filesystem::path path, FieldInfo info, std::uint64_t samples)
        : path_(std::move(path)), info_(std::move(info)), samples_(samples) {}
    // Throws a usage-level runtime error when [first, first + count) is outside the split.
    void check_range(std::uint64_t first, std::uint64_t count) const;

  private:
    std::filesystem::path path_;
    FieldInfo info_;
    std::uint64_t samples_;
};

// Opens the right reader for the field's storage.
std::unique_ptr<FieldReader> open_field_reader(const std::filesystem::path& dir, const SplitInfo& split,
                                               const FieldInfo& field);

class Dataset {
  public:
    static Dataset open(const std::filesystem::path& dir);

    const Manifest& manifest() const { return manifest_; }
    const std::filesystem::path& dir() const { return dir_; }
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
