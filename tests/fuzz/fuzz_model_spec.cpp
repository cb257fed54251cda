// libFuzzer target: the model spec parser and the network planner must either
// accept a spec or throw dstk::Error, never crash; accepted specs round-trip.
#include <cstdint>
#include <cstdlib>
#include <string_view>

#include "dstk/error.hpp"
#include "dstk/train/model.hpp"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
    using namespace dstk::train;
    const std::string_view text(reinterpret_cast<const char*>(data), size);
    try {
        const ModelSpec m = parse_model_spec(text);
        const std::string canon = to_spec_string(m);
        if (!(parse_model_spec(canon).layers == m.layers)) std::abort();
        const NetworkPlan p = plan_network(m, {3, 32, 32}, 10);
        if (p.layers.size() != m.layers.size()) std::abort();
    } catch (const dstk::Error&) {
    }
    return 0;
}
