#include "dstk/checksum.hpp"

#include <array>
#include <cstdio>
#include <fcntl.h>
#include <unistd.h>
#include <vector>

#define XXH_STATIC_LINKING_ONLY // XXH64_state_t's size, to keep the state inside Xxh64
#include <xxhash.h>

#include "dstk/error.hpp"
#include "dstk/fd.hpp"

namespace dstk {
namespace {

static_assert(sizeof(XXH64_state_t) <= 88 && alignof(XXH64_state_t) <= 8, "Xxh64::state_ is too small");

XXH64_state_t* state_of(unsigned char* s) {
    return reinterpret_cast<XXH64_state_t*>(s);
}
const XXH64_state_t* state_of(const unsigned char* s) {
    return reinterpret_cast<const XXH64_state_t*>(s);
}

// The reflected Castagnoli polynomial 0x1EDC6F41, one byte at a time: the
// records it checks are a few hundred bytes.
constexpr std::array<std::uint32_t, 256> crc32c_table = [] {
    std::array<std::uint32_t, 256> t{};
    for (std::uint32_t i = 0; i < 256; ++i) {
        std::uint32_t c = i;
        for (int k = 0; k < 8; ++k) c = (c & 1) ? (c >> 1) ^ 0x82F63B78u : c >> 1;
        t[i] = c;
    }
    return t;
}();

} // namespace

Xxh64::Xxh64(std::uint64_t seed) {
    XXH64_reset(state_of(state_), seed);
}

void Xxh64::update(const void* data, std::size_t len) {
    XXH64_update(state_of(state_), data, len);
}

std::uint64_t Xxh64::digest() const {
    return XXH64_digest(state_of(state_));
}

std::string Xxh64::hex() const {
    char buf[32];
    std::snprintf(buf, sizeof buf, "xxh64:%016llx", static_cast<unsigned long long>(digest()));
    return buf;
}

std::uint64_t xxh64(const void* data, std::size_t len, std::uint64_t seed) {
    return XXH64(data, len, seed);
}

std::string file_checksum(const std::filesystem::path& path) {
    const UniqueFd fd = open_input_file(path, "file");
    posix_fadvise(fd.get(), 0, 0, POSIX_FADV_SEQUENTIAL);
    std::vector<unsigned char> buf(4 << 20);
    Xxh64 h;
    for (;;) {
        const ssize_t n = ::read(fd.get(), buf.data(), buf.size());
        if (n < 0) {
            if (errno == EINTR) continue;
            throw_errno("cannot read", path.string());
        }
        if (n == 0) break;
        h.update(buf.data(), static_cast<std::size_t>(n));
    }
    return h.hex();
}

std::uint32_t crc32c(const void* data, std::size_t len, std::uint32_t crc) {
    auto p = static_cast<const unsigned char*>(data);
    crc = ~crc;
    for (std::size_t i = 0; i < len; ++i) crc = crc32c_table[(crc ^ p[i]) & 0xFF] ^ (crc >> 8);
    return ~crc;
}

} // namespace dstk
