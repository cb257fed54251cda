#pragma once
// dsplan with several --dataset: the datasets as one mix (issue 25's seeds
// table). For each member its training split as u8, bf16 and f32 (the input
// field stored so, the other fields as they are) and, for each of those
// dtypes, whether it is kept in RAM: the members are taken in the order in
// which data::plan_mix keeps them (rows read per byte, most first) while
// their sum fits the RAM budget. Then the hybrid plan dstrain would build
// (data::plan_mix, with the RAM budget as its host budget) and the epoch it
// takes: the streamed members' reads share the disk, the copies share the
// host-to-device link, and the GPU trains every draw; the epoch takes the
// slowest of the three (estimate_epoch's rule, summed over the members).
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json_fwd.hpp>

#include "dstk/data/mix_plan.hpp"
#include "dstk/plan/plan.hpp"

namespace dstk::plan {

struct MixMemberSizes {
    std::string name;
    std::uint64_t train = 0, draws = 0; // samples of the split, draws per epoch
    double share = 0;                   // of the epoch's draws
    std::vector<std::uint64_t> bytes;   // per dtype of MixReport::dtypes: the training split in memory
    std::vector<bool> in_ram;           // per dtype: kept in RAM under the budget
};

struct MixReport {
    std::vector<DType> dtypes; // u8, bf16, f32
    std::vector<MixMemberSizes> members;
    std::vector<std::uint64_t> total; // per dtype
    std::uint64_t ram_budget = 0;
    data::MixPlan plan;     // what dstrain builds (the members' dtypes as stored)
    std::string plan_error; // why there is no plan (the mix cannot train as asked), else empty
    // The epoch of that plan: the first reads every host-kept member from
    // disk, the next ones read it from the page cache.
    EpochEstimate first_epoch, next_epochs;
};

// Several --dataset (the training split of each): the report; none for one.
std::optional<MixReport> mix_report(const PlanOptions& o, const std::vector<NamedData>& members, const Budgets& b,
                                    const Rates& rates, double compute_rate, std::optional<std::uint64_t> model_bytes);
void print_mix_report(const MixReport& r);
nlohmann::json mix_report_json(const MixReport& r);

} // namespace dstk::plan
