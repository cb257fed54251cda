// libFuzzer target: the dataset.json parser must reject anything malformed with
// dstk::Error, never crash, and round-trip whatever it accepts.
#include <cstddef>
#include <cstdint>
#include <string_view>

#include "dstk/error.hpp"
#include "dstk/manifest.hpp"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
    const std::string_view text(reinterpret_cast<const char*>(data), size);
    try {
        const dstk::Manifest m = dstk::parse_manifest(text, "fuzz.json");
        const dstk::Manifest again = dstk::parse_manifest(dstk::serialize_manifest(m), "again.json");
        if (again.splits.size() != m.splits.size() || again.shard.has_value() != m.shard.has_value()) __builtin_trap();
        for (std::size_t i = 0; i < m.splits.size(); ++i)
            for (std::size_t j = 0; j < m.splits[i].fields.size(); ++j) {
                const auto& f = m.splits[i].fields[j];
                (void)dstk::checked_sample_total(f, m.splits[i].samples);
                // A field in parts keeps its parts, in order; a single-file field stays one.
                const auto& g = again.splits[i].fields[j];
                if (g.parts.size() != f.parts.size() || g.file != f.file) __builtin_trap();
                for (std::size_t k = 0; k < f.parts.size(); ++k)
                    if (g.parts[k].file != f.parts[k].file || g.parts[k].samples != f.parts[k].samples)
                        __builtin_trap();
            }
    } catch (const dstk::Error&) {
    }
    return 0;
}
