#pragma once
// The batch source of a mix (mix.hpp, mix_plan.hpp): one BatchSource over
// the members' own sources, in the order of a MixOrder.
//
// Global batch g is the mix's positions [g*B, (g+1)*B). Member m's draws are
// consecutive samples of its own source's epoch order (each member source is
// built with batch B, drop_last off, the mix's seed and epoch). Each member
// batch is copied into the member's staging, a ring of 2B rows per field, and
// released at once (a source has one batch outstanding); the mix's batch is
// then gathered from the staging rows at its positions, one gather per field
// (a memcpy per row on the cpu backend; on cuda one gather kernel per field
// over an uploaded table of rows, on the stream batches are read on, after the
// copies). A batch's draws of a member span at most B of its positions and a
// member batch adds at most B, so 2B rows always hold what a batch needs.
//
// Data parallel: rank r of W takes global batches k*W + r (RankSlice), and
// reads every member batch up to them, keeping only its own rows: each rank
// reads the whole mix (W times the reads of one rank, none of it shared).
// The order is a pure function of (seed, epoch) and of the segments, so the
// batches are the same whatever the readers, prefetch or placements.
//
// start_epoch(epoch, first_batch) positions member m at its draws before the
// batch, taken(first_position): its source starts at that batch of its own
// order and skips the rows before. The fields named `dataset` (int32) and
// `index` (int64) hold each row's member and its row in that member's split.
#include <cstdint>
#include <memory>
#include <vector>

#include "dstk/data/batch_source.hpp"
#include "dstk/data/mix.hpp"
#include "dstk/data/mix_plan.hpp"
#include "dstk/dataset.hpp"

namespace dstk::data {

class MixSource : public BatchSource {
  public:
    // A fresh epoch's order from the members' weights: start_epoch.
    // An epoch continued from a checkpoint's segments (perhaps resumed with
    // other weights or members: MixOrder::resumed): resume_epoch.
    virtual void resume_epoch(MixOrder order, std::uint64_t epoch, std::uint64_t first_batch) = 0;
    virtual const MixOrder& order() const = 0; // the epoch's, once started
    // Rows of each member in the batches this source delivered in the epoch
    // (since start_epoch or resume_epoch).
    virtual std::vector<std::uint64_t> delivered() const = 0;
};

// The source the plan describes over its members (in the plan's order).
std::unique_ptr<MixSource> make_mix_source(const std::vector<const Dataset*>& members, const MixPlan& plan);

// The mix's own backend memory (MixPlan::mix_bytes): each member's staging
// (2B rows of every stored field), the batch slot over every field, and on
// cuda the uploaded row table. Needs the plan's members and fields.
std::uint64_t mix_source_bytes(const MixPlan& plan, const Device& device);

} // namespace dstk::data
