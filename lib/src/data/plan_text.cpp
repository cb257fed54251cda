// A SourcePlan in words and as JSON: what every caller prints the same way.
#include <nlohmann/json.hpp>

#include "dstk/data/source_plan.hpp"
#include "dstk/units.hpp"

namespace dstk::data {
namespace {

std::string type_text(DType t, const Shape& s) {
    return std::string(dtype_name(t)) + (s.dims.empty() ? "" : "[" + s.str() + "]");
}

std::string order_text(const SourceConfig& c) {
    std::string t = "order " + std::string(order_name(c.order.kind));
    if (c.order.kind == Order::chunk)
        t += " (" + format_count(c.order.chunk_samples) + " samples x " + std::to_string(c.order.window_chunks) +
             " chunks per window)";
    else if (c.order.kind == Order::sequential)
        t += " (chunks of " + format_count(c.order.chunk_samples) + " samples)";
    return t;
}

std::string fields_text(const SourcePlan& p) {
    std::string t;
    for (const BatchField& f : p.fields)
        t += (t.empty() ? "fields " : " + ") + f.name + " " + type_text(f.dtype, f.shape);
    return t;
}

std::string memory_text(const SourcePlan& p) {
    std::string t = "host " + format_bytes(p.host_bytes);
    if (p.config.placement == Placement::stream)
        t += " (ring " + format_bytes(p.host.ring) + " + window cache " + format_bytes(p.host.cache) + " + buffers " +
             format_bytes(p.host.other) + ")";
    else if (p.config.device.backend == Backend::cpu)
        t += " (the split in host memory)";
    else
        t += p.config.placement == Placement::managed ? " (the split in managed memory)" : " (staging)";
    return t + ", " + (p.config.device.backend == Backend::cuda ? "GPU " : "batches ") + format_bytes(p.device_bytes);
}

} // namespace

std::vector<std::string> describe(const SourcePlan& p) {
    const SourceConfig& c = p.config;
    std::vector<std::string> lines;
    lines.push_back("data path: " + std::string(placement_name(c.placement)) + " on " + device_name(c.device) + ", " +
                    order_text(c) + ", batch " + std::to_string(c.batch) + ", " + format_count(p.batches) +
                    " batches per epoch");
    std::string io = fields_text(p) + " (" + format_bytes(p.sample_bytes) + " a sample, lead " + p.lead_field + ")";
    if (c.placement == Placement::stream)
        io += ", readers " + std::to_string(c.readers) + ", prefetch " + std::to_string(c.prefetch) + ", O_DIRECT " +
              (c.direct ? "on" : "off");
    else if (c.placement == Placement::managed)
        io += ", prefetch " + std::to_string(c.prefetch) + ", " + std::string(managed_policy_name(c.managed_policy));
    lines.push_back("data path: " + io);
    lines.push_back("data path: " + memory_text(p));
    return lines;
}

nlohmann::json plan_json(const SourcePlan& p) {
    const SourceConfig& c = p.config;
    nlohmann::json fields = nlohmann::json::array();
    for (const BatchField& f : p.fields)
        fields.push_back({{"name", f.name}, {"dtype", dtype_name(f.dtype)}, {"shape", f.shape.dims}});
    return {{"dataset", p.dataset.string()},
            {"split", p.split},
            {"fields", fields},
            {"lead_field", p.lead_field},
            {"placement", placement_name(c.placement)},
            {"placement_why", p.placement_why},
            {"device", device_name(c.device)},
            {"order", order_name(c.order.kind)},
            {"seed", c.order.seed},
            {"chunk_samples", c.order.chunk_samples},
            {"window_chunks", c.order.window_chunks},
            {"batch", c.batch},
            {"batches_per_epoch", p.batches},
            {"samples", p.samples},
            {"sample_bytes", p.sample_bytes},
            {"split_bytes", p.split_bytes},
            {"readers", c.readers},
            {"prefetch", c.prefetch},
            {"direct", c.direct},
            {"direct_why", p.direct_why},
            {"host_bytes", p.host_bytes},
            {"host_ring_bytes", p.host.ring},
            {"host_cache_bytes", p.host.cache},
            {"host_buffer_bytes", p.host.other},
            {"device_bytes", p.device_bytes},
            {"tuning", p.tuning},
            {"notes", p.notes},
            {"warnings", p.warnings}};
}

} // namespace dstk::data
