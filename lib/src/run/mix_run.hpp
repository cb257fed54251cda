#pragma once
// dstrain on a mix: several datasets with the same fields trained as one
// (DESIGN.md; data/mix.hpp, mix_plan.hpp, mix_source.hpp). The datasets are
// the positional DATASET arguments (two or more), or one mix.json:
//
//   {"members": [{"path": "s0", "weight": 2, "placement": "device"},
//                {"path": "/data/s1", "weight": 1}]}
//
// (paths relative to the file's folder; weight and placement optional, the
// weights all or none; man dstk-format(5)). --weights and --placement, where
// given, win over the file. The first member stands for the mix wherever one
// dataset's facts are read (fields, dtypes, shapes, classes); statistics are
// the mix's (mix_field_norm). The test split is a mix of the members' test
// splits, every sample once, where every member has one.
//
// Checkpoints store the members (key, path, weight) and, mid-epoch, the
// segments of the epoch's order (Checkpoint::mix); a resume with other
// weights or members continues that epoch with MixOrder::resumed, saying
// what changed, one line per member.
#include <cstdint>
#include <filesystem>
#include <optional>
#include <string>
#include <vector>

#include "dstk/data/mix_plan.hpp"
#include "dstk/data/mix_source.hpp"
#include "dstk/dataset.hpp"
#include "dstk/run/options.hpp"

namespace dstk::run {

struct MixRun {
    std::vector<std::filesystem::path> paths;
    std::vector<Dataset> members;
    std::vector<double> weights; // empty: the members' sizes
    std::vector<data::MixPlacement> placements;
    data::MixPlan plan;
    std::optional<data::MixPlan> eval;
    data::MixSource* train = nullptr;      // the session's train_src
    std::optional<data::MixOrder> resumed; // --resume mid-epoch: the epoch's order from the checkpoint

    std::vector<const Dataset*> pointers() const;
    // The members as MixOrder takes them, before any plan (weights, sizes, keys).
    std::vector<data::MixMember> order_members() const;
    std::vector<std::uint64_t> draws() const; // each member's per fresh epoch (mix_quotas)
    std::uint64_t positions() const;          // a fresh epoch's samples
};

// The mix the options name; nullopt for one dataset directory. Usage errors
// (exit 2): --weights or --placement without a mix, a bad mix.json (naming
// the file, the member and the key), a member that is not a dataset.
std::optional<MixRun> open_mix(const TrainOptions& e, const DataOptions& d);

} // namespace dstk::run
