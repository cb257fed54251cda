// libFuzzer target: the dataset.json parser must reject anything malformed with
// dstk::Error, never crash, and round-trip whatever it accepts.
#include <cstdint>
#include <string_view>

#include "dstk/error.hpp"
#include "dstk/manifest.hpp"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
    const std::string_view text(reinterpret_cast<const char*>(data), size);
    try {
        const dstk::Manifest m = dstk::parse_manifest(text, "fuzz.json");
        const dstk::Manifest again = dstk::parse_manifest(dstk::serialize_manifest(m), "again.json");
        if (again.splits.size() != m.splits.size()) __builtin_trap();
        for (const auto& s : m.splits)
            for (const auto& f : s.fields) (void)dstk::checked_sample_total(f, s.samples);
    } catch (const dstk::Error&) {
    }
    return 0;
}
