// Zip central directory and local headers of .npz archives: the fuzz input is
// the whole archive; every member offset returned must lie inside it.
#include <cstddef>
#include <cstdint>

#include "dstk/error.hpp"
#include "dstk/convert/importers.hpp"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
    try {
        const auto members = dstk::parse_zip_directory({data, size}, size, "fuzz");
        for (const auto& m : members) {
            if (m.data_offset >= size) __builtin_trap();
            try {
                const std::uint64_t at =
                    dstk::zip_data_offset({data + m.data_offset, size - m.data_offset}, m, size, "fuzz");
                if (at > size || m.compressed_bytes > size - at) __builtin_trap();
            } catch (const dstk::Error&) {
            }
        }
    } catch (const dstk::Error&) {
    }
    return 0;
}
