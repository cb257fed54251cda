// libFuzzer target: the model spec parser and the network planner must either
// accept a spec or throw dstk::Error, never crash; accepted specs round-trip
// (layers and heads).
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
        const ModelSpec again = parse_model_spec(canon);
        if (!(again.layers == m.layers) || !(again.heads == m.heads)) std::abort();
        // Every head a classifier of whatever width it ends with; a side input of 4 values where "side" stands.
        std::vector<Target> targets;
        for (const auto& h : m.heads) targets.push_back({h.target, dstk::DType::i32, {}, LossKind::ce, 0});
        if (targets.empty()) targets.push_back({"y", dstk::DType::i32, {}, LossKind::ce, 10});
        bool side = false;
        for (const auto& l : m.layers) side |= l.kind == LayerKind::side;
        const NetworkPlan p = plan_network(m, {3, 32, 32}, targets, side ? 4 : 0);
        if (p.layers.size() != m.layers.size() || p.heads.size() != targets.size()) std::abort();
    } catch (const dstk::Error&) {
    }
    return 0;
}
