#pragma once
// XXH64 (the xxHash 64-bit algorithm, seed 0): the checksum of every dataset
// file, written in manifests as "xxh64:<16 hex digits>" and equal to what
// `xxhsum -H1 FILE` prints for the same file.
#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <string>

namespace dstk {

class Xxh64 {
  public:
    explicit Xxh64(std::uint64_t seed = 0);
    void update(const void* data, std::size_t len);
    std::uint64_t digest() const;
    std::string hex() const; // "xxh64:%016x"

  private:
    std::uint64_t v_[4];
    std::uint64_t seed_;
    std::uint64_t total_ = 0;
    unsigned char buf_[32];
    std::size_t buf_len_ = 0;
};

std::uint64_t xxh64(const void* data, std::size_t len, std::uint64_t seed = 0);
// Reads the file sequentially; throws naming the file on I/O errors.
std::string file_checksum(const std::filesystem::path& path);

} // namespace dstk
