#pragma once
// The data path's plan for a mix (mix.hpp): several datasets with the same
// fields trained as one, each member placed once, within one host budget.
//
// Where a member lives:
//   device  resident in backend memory (GPU memory on cuda, host memory on
//           cpu) while the members placed there fit the device room (the
//           room plan_source gives one dataset: 90% of the GPU's free memory
//           less the model; on cpu half of the host memory available)
//   host    read by a stream source through the page cache, which keeps it
//           (no O_DIRECT, pages not dropped): read from disk in the first
//           epoch, from memory after; its whole size counts against the host
//           budget, beside its stream's ring and cache
//   stream  read by a stream source from disk every epoch: the budget does
//           not keep it, so with O_DIRECT (unless the setting direct is off,
//           then pages dropped where plan_source's rules say)
// Every stream source (host or stream) has the ring and window cache that
// plan_source gives one dataset on this machine.
//
// The rule. Members placed by the caller (a placement per member) keep it.
// The others are taken in order of rows read per byte, the member's share of
// an epoch's draws over its bytes (ties: the first member first), and each
// goes to the device while it fits the device room left, else to host while
// its bytes fit the host budget left after every stream source's own memory,
// else to stream. The members drawn most for their size are thus the ones
// kept in memory: each byte kept saves the most reads.
//
// The host budget is the setting host_mem (the whole mix's), else half of
// the memory available. The mix's host ceiling is the sum over members of
// their sources' host memory (plan_source's host_bytes) and the bytes of the
// host-kept members; a budget below the stream sources' own memory alone is a
// no-fit error (exit 3).
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json_fwd.hpp>

#include "dstk/data/convert.hpp"
#include "dstk/data/mix.hpp"
#include "dstk/data/source_plan.hpp"
#include "dstk/dataset.hpp"

namespace dstk::data {

enum class MixPlacement : std::uint8_t { automatic, device, host, stream };
// "auto", "device", "host", "stream"; a usage error naming `setting` otherwise.
MixPlacement parse_mix_placement(std::string_view text, std::string_view setting = "placement");
std::string_view mix_placement_name(MixPlacement p);

// The fields a mix adds where the request's fields name them: each sample's
// member (int32, its index in the mix) and its row in that member's split
// (int64).
inline constexpr std::string_view dataset_field = "dataset";
inline constexpr std::string_view index_field = "index";

struct MixRequest {
    // What every member's source is asked (fields, order, seed, batch, device,
    // ...). fields may name `dataset` and `index`; host_mem is the whole
    // mix's budget.
    SourceRequest source;
    std::vector<double> weights;          // one per member; empty: the members' sizes
    std::vector<MixPlacement> placements; // one per member, or one for all; empty: automatic
};

struct MixMemberPlan {
    std::filesystem::path dataset;
    std::uint64_t key = 0; // the member's identity (mix_member_key)
    double weight = 0;
    std::uint64_t quota = 0; // draws per epoch (mix_quotas)
    double share = 0;        // quota over the epoch's draws
    MixPlacement placement = MixPlacement::stream;
    std::string why;   // the placement, in words
    SourcePlan source; // the member's own source (batch and seed of the mix)
    // Host memory the member takes: its source's and, kept in the page
    // cache, its split's bytes.
    std::uint64_t host_bytes = 0;
    // Expected disk read rate of a streamed member (B/s, from the setting
    // bench's figures); unset where unknown or where it is read from memory.
    std::optional<double> read_rate;
};

struct MixPlan {
    std::vector<MixMemberPlan> members;
    std::vector<BatchField> fields; // delivered, in batch order (dataset: i32, index: i64, no shape)
    std::uint32_t batch = 0;
    RankSlice slice; // this rank's global batches (the members' sources read them all)
    bool drop_last = true;
    std::uint64_t positions = 0; // draws per epoch
    std::uint64_t batches = 0;   // global batches per epoch
    std::uint64_t host_budget = 0;
    std::uint64_t host_bytes = 0;   // the mix's host ceiling
    std::uint64_t device_bytes = 0; // backend memory of every member's source and the mix's own
    // The mix's own backend memory (mix_source.hpp): each member's staging of
    // two batches and the batch slot, over every field.
    std::uint64_t mix_bytes = 0;
    std::uint64_t seed = 0;
    bool hash_batches = false; // cpu: the mix's batches hashed (StageTimes::batch_hash), not its members'

    // The members as MixOrder takes them.
    std::vector<MixMember> order_members() const;
};

// A member's identity across runs: an XXH64 of its splits' names, sample
// counts and fields' names and checksums (a checkpoint matches members by
// it, not by path). Two members of one mix with the same key are refused.
std::uint64_t mix_member_key(const Dataset& ds);

// Usage errors (naming the settings): fewer than one member, weights or
// placements of another count than the members, a field one member lacks or
// holds with another dtype or shape than the first (naming member and
// field), a member with a field of its own named `dataset` or `index` where
// the mix's is asked for. No-fit errors: the stream sources above the host budget.
MixPlan plan_mix(const std::vector<const Dataset*>& members, const MixRequest& request, const MachineFacts& machine);

// The statistics of a field over a mix, by field_norm's rule per member
// (convert.hpp) combined with the weight of each member's draws per epoch
// (`draws`: MixMemberPlan::quota): what dstrain normalises an input or side
// input of a mix by. `dataset` and `index` have theirs in closed form (each
// member's value, each member's rows 0 to n-1).
ChannelNorm mix_field_norm(const std::vector<const Dataset*>& members, const std::vector<std::uint64_t>& draws,
                           const std::string& field);

// One line per member ("mix: s0/ (weight 2, 50.0%): device, 12.0 MiB ..."),
// then the mix's ceilings. The host ceiling includes the mix's own bytes on
// the cpu backend (its batches are host memory there).
std::vector<std::string> describe_mix(const MixPlan& plan);
nlohmann::json mix_plan_json(const MixPlan& plan);

} // namespace dstk::data
