// IDX header parser: any bytes give a header or an Error, never a crash.
#include <cstddef>
#include <cstdint>

#include "dstk/error.hpp"
#include "dstk/convert/importers.hpp"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
    try {
        const dstk::IdxHeader h = dstk::parse_idx_header({data, size}, "fuzz");
        if (h.data_offset > size && size > 4) __builtin_trap();
    } catch (const dstk::Error&) {
    }
    return 0;
}
