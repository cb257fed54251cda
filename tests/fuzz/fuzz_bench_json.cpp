// Fuzzes the dsbench results reader (dsbench compare, dsplan/dstrain --bench):
// any input either parses or throws dstk::Error; a parsed file re-serializes
// and parses again.
#include <cstddef>
#include <cstdint>
#include <string_view>

#include "dstk/bench/results.hpp"
#include "dstk/error.hpp"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
    const std::string_view text(reinterpret_cast<const char*>(data), size);
    try {
        const auto r = dstk::bench::parse_results(text, "fuzz");
        const auto again = dstk::bench::parse_results(dstk::bench::serialize_results(r), "fuzz-again");
        if (again.results.size() != r.results.size()) __builtin_trap();
        (void)dstk::bench::sequential_read_rate(r);
        (void)dstk::bench::pinned_h2d_rate(r);
        (void)dstk::bench::best_random_read(r, "batch");
    } catch (const dstk::Error&) {
    }
    return 0;
}
