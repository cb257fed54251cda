#include "dstk/checksum.hpp"

#include <cstdio>
#include <cstring>
#include <fcntl.h>
#include <unistd.h>
#include <vector>

#include "dstk/fd.hpp"
#include "dstk/error.hpp"

// XXH64 as specified in xxHash's doc/xxhash_spec.md (section "XXH64 algorithm").
namespace dstk {
namespace {

constexpr std::uint64_t P1 = 0x9E3779B185EBCA87ull, P2 = 0xC2B2AE3D27D4EB4Full, P3 = 0x165667B19E3779F9ull,
                        P4 = 0x85EBCA77C2B2AE63ull, P5 = 0x27D4EB2F165667C5ull;

inline std::uint64_t rotl(std::uint64_t x, int r) {
    return (x << r) | (x >> (64 - r));
}
inline std::uint64_t load64(const unsigned char* p) {
    std::uint64_t v;
    std::memcpy(&v, p, 8);
    return v; // little-endian hosts only (x86-64, aarch64)
}
inline std::uint32_t load32(const unsigned char* p) {
    std::uint32_t v;
    std::memcpy(&v, p, 4);
    return v;
}
inline std::uint64_t round(std::uint64_t acc, std::uint64_t lane) {
    acc += lane * P2;
    acc = rotl(acc, 31);
    return acc * P1;
}
inline std::uint64_t merge(std::uint64_t acc, std::uint64_t v) {
    acc ^= round(0, v);
    return acc * P1 + P4;
}

} // namespace

Xxh64::Xxh64(std::uint64_t seed) : seed_(seed) {
    v_[0] = seed + P1 + P2;
    v_[1] = seed + P2;
    v_[2] = seed;
    v_[3] = seed - P1;
}

void Xxh64::update(const void* data, std::size_t len) {
    auto p = static_cast<const unsigned char*>(data);
    total_ += len;
    if (buf_len_ + len < 32) {
        std::memcpy(buf_ + buf_len_, p, len);
        buf_len_ += len;
        return;
    }
    if (buf_len_) {
        const std::size_t fill = 32 - buf_len_;
        std::memcpy(buf_ + buf_len_, p, fill);
        for (int i = 0; i < 4; ++i) v_[i] = round(v_[i], load64(buf_ + 8 * i));
        p += fill;
        len -= fill;
        buf_len_ = 0;
    }
    std::uint64_t v0 = v_[0], v1 = v_[1], v2 = v_[2], v3 = v_[3];
    while (len >= 32) {
        v0 = round(v0, load64(p));
        v1 = round(v1, load64(p + 8));
        v2 = round(v2, load64(p + 16));
        v3 = round(v3, load64(p + 24));
        p += 32;
        len -= 32;
    }
    v_[0] = v0, v_[1] = v1, v_[2] = v2, v_[3] = v3;
    std::memcpy(buf_, p, len);
    buf_len_ = len;
}

std::uint64_t Xxh64::digest() const {
    std::uint64_t acc;
    if (total_ >= 32) {
        acc = rotl(v_[0], 1) + rotl(v_[1], 7) + rotl(v_[2], 12) + rotl(v_[3], 18);
        for (int i = 0; i < 4; ++i) acc = merge(acc, v_[i]);
    } else {
        acc = seed_ + P5;
    }
    acc += total_;
    const unsigned char* p = buf_;
    std::size_t len = buf_len_;
    while (len >= 8) {
        acc ^= round(0, load64(p));
        acc = rotl(acc, 27) * P1 + P4;
        p += 8;
        len -= 8;
    }
    if (len >= 4) {
        acc ^= std::uint64_t{load32(p)} * P1;
        acc = rotl(acc, 23) * P2 + P3;
        p += 4;
        len -= 4;
    }
    while (len > 0) {
        acc ^= (*p++) * P5;
        acc = rotl(acc, 11) * P1;
        --len;
    }
    acc ^= acc >> 33;
    acc *= P2;
    acc ^= acc >> 29;
    acc *= P3;
    acc ^= acc >> 32;
    return acc;
}

std::string Xxh64::hex() const {
    char buf[32];
    std::snprintf(buf, sizeof buf, "xxh64:%016llx", static_cast<unsigned long long>(digest()));
    return buf;
}

std::uint64_t xxh64(const void* data, std::size_t len, std::uint64_t seed) {
    Xxh64 h(seed);
    h.update(data, len);
    return h.digest();
}

std::string file_checksum(const std::filesystem::path& path) {
    const UniqueFd fd = UniqueFd::open(path, O_RDONLY, "open");
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

} // namespace dstk
