#include "plan/data_path.hpp"

#include <cstdio>
#include <string>

#include "dstk/dataset.hpp"

namespace dstk::plan {

std::string plan_flag_of(std::string_view setting) {
    if (setting == "placement") return "--data";
    if (setting == "host_mem") return "--ram"; // a mix's host budget is the RAM budget
    if (setting == "order" || setting == "batch" || setting == "prefetch" || setting == "bench" || setting == "weights")
        return "--" + std::string(setting);
    return std::string(setting);
}

std::optional<data::SourcePlan> data_path_plan(const PlanOptions& o, std::optional<std::uint64_t> model_bytes) {
    if (o.datasets.size() != 1) return std::nullopt; // several datasets: a mix, planned per member (issue 25)
    const Dataset ds = Dataset::open(o.datasets.front());
    const Manifest& m = ds.manifest();
    const SplitInfo* train = m.find("train");
    // dstrain trains on the input and label roles: without them it builds no data path.
    if (!train || train->samples == 0 || !train->find(m.input_field) || !train->find(m.label_field))
        return std::nullopt;
    if (!o.dtype.empty() && parse_dtype(o.dtype, "--dtype") != train->field(m.input_field).dtype) return std::nullopt;
    data::SourceRequest r;
    r.placement = data::parse_placement(o.data, "--data");
    r.device = data::default_device();
    r.rows = r.device.backend == Backend::cuda; // as dstrain's cuda trainer reads them (Trainer::reads_rows)
    r.order = data::parse_order(o.order, "--order");
    r.batch = o.batch;
    // As dstrain: --prefetch given wins over --bench's tuning.
    if (o.bench.empty() || o.prefetch != PlanOptions{}.prefetch) r.prefetch = o.prefetch;
    r.bench = o.bench;
    r.reserved_device_bytes = model_bytes.value_or(0);
    r.names = plan_flag_of;
    return data::plan_training(ds, r, "test", data::machine_facts(r.device)).train;
}

void print_data_path(const data::SourcePlan& p) {
    std::printf("data path (as dstrain builds it for split '%s')\n", p.split.c_str());
    for (const std::string& line : data::describe(p)) std::printf("  %s\n", line.c_str());
    std::printf("  placement: %s\n", p.placement_why.c_str());
    if (!p.direct_why.empty()) std::printf("  %s\n", p.direct_why.c_str());
    for (const std::string& line : p.tuning) std::printf("  %s\n", line.c_str());
    for (const std::string& line : p.warnings) std::printf("  warning: %s\n", line.c_str());
}

} // namespace dstk::plan
