// The zstd-chunked index frame: the first 8 input bytes give the file size,
// the rest is the frame. An accepted index must describe chunks inside the file.
#include <cstddef>
#include <cstdint>
#include <cstring>

#include "dstk/chunked_file.hpp"
#include "dstk/error.hpp"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
    if (size < 8) return 0;
    std::uint64_t file_bytes;
    std::memcpy(&file_bytes, data, 8);
    try {
        const dstk::ChunkIndex ix = dstk::parse_chunk_index({data + 8, size - 8}, file_bytes, "fuzz");
        for (const auto& c : ix.chunks)
            if (c.offset + c.compressed_bytes > file_bytes) __builtin_trap();
    } catch (const dstk::Error&) {
    }
    return 0;
}
