#pragma once
// O_DIRECT reading shared by the .npy and zstd-chunked readers: 4 KiB-aligned
// buffers, a descriptor proven by one read, and aligned reads that tell a
// refusal (the filesystem has no O_DIRECT for this read) from an error.
#include <cstdint>
#include <cstdlib>
#include <filesystem>
#include <memory>
#include <string>

#include "dstk/fd.hpp"

namespace dstk {

inline constexpr std::uint64_t direct_align = 4096; // O_DIRECT offsets, lengths and buffers

struct AlignedFree {
    void operator()(std::uint8_t* p) const { std::free(p); }
};
using AlignedBuffer = std::unique_ptr<std::uint8_t, AlignedFree>;

// `bytes` (a multiple of direct_align) aligned to direct_align; throws bad_alloc.
AlignedBuffer aligned_buffer(std::uint64_t bytes);

// `path` opened with O_DIRECT and proven with one aligned read; an empty
// descriptor where the filesystem refuses O_DIRECT (EINVAL, EOPNOTSUPP: the
// errno in *refused). Other failures throw naming `where`.
UniqueFd open_direct(const std::filesystem::path& path, const std::string& where, int* refused);

// Reads [start, start + len) (aligned) of `fd` into buf until at least `need`
// bytes are in. Returns 0, or the errno of a read the filesystem refused
// (EINVAL, EOPNOTSUPP). Errors throw naming `where`; a file that ends before
// `need` shrank under the reader.
int pread_direct(int fd, std::uint8_t* buf, std::uint64_t start, std::uint64_t len, std::uint64_t need,
                 const std::string& where);

} // namespace dstk
