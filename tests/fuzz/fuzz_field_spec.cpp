// libFuzzer target: dsplan's --field NAME:SHAPE:DTYPE parser must either
// accept a text or throw dstk::Error, never crash; an accepted field has a
// name, a per-sample size that fits 64 bits, and reads back the same.
#include <cstdint>
#include <cstdlib>
#include <string>
#include <string_view>

#include "dstk/error.hpp"
#include "dstk/plan/plan.hpp"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
    using namespace dstk::plan;
    const std::string_view text(reinterpret_cast<const char*>(data), size);
    try {
        const FieldSpec f = parse_field_spec(text);
        if (f.name.empty() || f.bytes() == 0) std::abort();
        const std::string again =
            f.name + ":" + (f.shape.dims.empty() ? "" : f.shape.str()) + ":" + std::string(dstk::dtype_name(f.dtype));
        const FieldSpec g = parse_field_spec(again);
        if (g.name != f.name || g.shape != f.shape || g.dtype != f.dtype) std::abort();
    } catch (const dstk::Error&) {
    }
    return 0;
}
