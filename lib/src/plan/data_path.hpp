#pragma once
// dsplan --dataset: the data path dstrain would build for this dataset with
// the same --data, --order, --batch, --prefetch and --bench, from the one
// planning entrance (data::plan_training), printed as dstrain prints it.
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

#include <nlohmann/json_fwd.hpp>

#include "dstk/data/source_plan.hpp"
#include "dstk/plan/plan.hpp"

namespace dstk::plan {

// The training split's plan for one --dataset; none without one (or with
// several), or where --dtype asks about a copy that does not exist yet. `model_bytes`: the model's footprint
// (--model), which auto placement leaves free on the GPU.
std::optional<data::SourcePlan> data_path_plan(const PlanOptions& o, std::optional<std::uint64_t> model_bytes);
void print_data_path(const data::SourcePlan& p);
// dsplan's flag for a data-path setting (the library's messages name settings).
std::string plan_flag_of(std::string_view setting);

} // namespace dstk::plan
