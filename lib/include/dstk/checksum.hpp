#pragma once
// Checksums. XXH64 (the xxHash 64-bit algorithm, seed 0, through libxxhash):
// the checksum of every dataset file, written in manifests as
// "xxh64:<16 hex digits>" and equal to what `xxhsum -H1 FILE` prints for the
// same file. CRC-32C (Castagnoli): the record checksum of TensorBoard's event
// files (TFRecord framing, dstk/run/tensorboard.hpp).
#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <string>

namespace dstk {

// Streaming XXH64; trivially copyable (the state lives inside the object).
class Xxh64 {
  public:
    explicit Xxh64(std::uint64_t seed = 0);
    void update(const void* data, std::size_t len);
    std::uint64_t digest() const;
    std::string hex() const; // "xxh64:%016x"

  private:
    alignas(8) unsigned char state_[88]; // libxxhash's XXH64_state_t (checked in checksum.cpp)
};

std::uint64_t xxh64(const void* data, std::size_t len, std::uint64_t seed = 0);
// Reads the file sequentially; throws naming the file on I/O errors.
std::string file_checksum(const std::filesystem::path& path);

// CRC-32C of `len` bytes, continuing from `crc` (0 to start).
std::uint32_t crc32c(const void* data, std::size_t len, std::uint32_t crc = 0);

} // namespace dstk
