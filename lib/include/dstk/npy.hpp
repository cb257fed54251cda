#pragma once
// NumPy .npy headers: format versions 1.0, 2.0 and 3.0 read; 1.0 written (2.0
// when the header needs more than 65535 bytes). The header is padded so the
// data starts on a 64-byte boundary.
#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <span>
#include <string>
#include <vector>

#include "dstk/dtype.hpp"

namespace dstk {

struct NpyHeader {
    std::string descr;       // as written: "<f4", "|u1", ">i4"
    DType dtype = DType::u8; // the element type, ignoring byte order
    bool big_endian = false; // data needs a byte swap on this machine
    bool fortran_order = false;
    std::vector<std::uint64_t> shape;
    std::uint64_t data_offset = 0; // bytes before the array data
    int major_version = 1;

    std::uint64_t count() const;      // product of shape, checked
    std::uint64_t data_bytes() const; // count * dtype size, checked
};

// Parses a header from the first bytes of a file (at least 10; the whole
// header must be there: read_npy_header reads as much as needed). Throws
// Error(failure) naming `source` on anything malformed.
NpyHeader parse_npy_header(std::span<const std::uint8_t> bytes, const std::string& source);
NpyHeader read_npy_header(const std::filesystem::path& path);
NpyHeader read_npy_header_fd(int fd, const std::string& source);

std::string make_npy_header(DType dtype, const std::vector<std::uint64_t>& shape, bool fortran_order = false);

} // namespace dstk
