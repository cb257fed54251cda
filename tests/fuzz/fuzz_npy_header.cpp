// libFuzzer target: the .npy header parser must reject anything malformed with
// dstk::Error, never crash or read out of bounds, and accept what it writes.
#include <cstdint>
#include <span>

#include "dstk/error.hpp"
#include "dstk/npy.hpp"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
    try {
        const dstk::NpyHeader h = dstk::parse_npy_header(std::span<const std::uint8_t>(data, size), "fuzz.npy");
        if (h.data_offset > size) __builtin_trap();
        const std::string again = dstk::make_npy_header(h.dtype, h.shape, h.fortran_order);
        const auto* p = reinterpret_cast<const std::uint8_t*>(again.data());
        const dstk::NpyHeader h2 = dstk::parse_npy_header(std::span<const std::uint8_t>(p, again.size()), "again");
        if (h2.shape != h.shape || h2.dtype != h.dtype) __builtin_trap();
    } catch (const dstk::Error&) {
    }
    return 0;
}
