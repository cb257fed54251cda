// CIFAR-10 batches have no header: the size is the only thing parsed. The
// input's first 8 bytes are taken as a file size.
#include <cstddef>
#include <cstdint>
#include <cstring>

#include "dstk/error.hpp"
#include "dstk/convert/importers.hpp"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
    if (size < 8) return 0;
    std::uint64_t bytes;
    std::memcpy(&bytes, data, 8);
    try {
        if (dstk::cifar_record_count(bytes, "fuzz") * dstk::cifar_record_bytes != bytes) __builtin_trap();
    } catch (const dstk::Error&) {
    }
    return 0;
}
