#pragma once
// The order of a mix: several datasets (members) trained as one, each batch
// drawing from every member in proportion to its weight. Like every order
// (order.hpp) it is a pure function of its inputs and O(1) in memory, so a
// run resumes at exactly the batch it would have seen.
//
// The epoch. Member m has n_m samples and weight w_m (default: n_m). The
// member with the largest w/n (the first such) is seen exactly once; every
// other member contributes k_m = min(n_m, round(n_r * w_m / w_r)) samples, so
// no member repeats a sample within an epoch and the shares are the weights'
// (to half a sample). With the default weights every member is seen once.
//
// The positions. The epoch's L = sum k_m positions are dealt to the members
// by a balanced binary tree over them: a node holding n positions gives its
// left subtree the a = (its members' quotas) of them at the positions where
// floor((i * a + phase) / n) steps up, i in [0, n), the phase drawn per node
// from (seed, epoch). Every run of positions (every batch) thus holds each
// member's share to within one sample per tree level, and position p maps to
// (member, draw) in O(log members) with no table. Member m's t-th draw is
// position base_m + t of the member's own EpochOrder, so a member's chunks are
// read in its own order's sequence (whole chunks, as for one dataset).
//
// Changes at resume. A mix resumed mid-epoch with other weights or more
// members starts a new segment at the resume position: each member keeps the
// draws it had (base_m), its quota is recomputed from the new weights, and it
// is dealt what remains of it (none where it already had more). No sample is
// taken twice and none that was taken is skipped; the segments are what a
// checkpoint stores to resume the epoch again exactly.
#include <cstdint>
#include <limits>
#include <memory>
#include <string>
#include <vector>

namespace dstk::data {

struct MixMember {
    std::string name;      // for messages: the member's path
    std::uint64_t key = 0; // identity across runs (the member's contents), matched at resume
    std::uint64_t samples = 0;
    double weight = 0; // > 0
};

// A member's weight is a positive finite number: the one rule of --weights
// (dstk/cli.hpp's validator), mix.json and the mix.
inline bool valid_mix_weight(double w) {
    return w > 0 && w < std::numeric_limits<double>::infinity();
}

// Each member's draws in a fresh epoch (k_m above). Usage errors for no
// members, a member without samples or a weight that is not positive and finite.
std::vector<std::uint64_t> mix_quotas(const std::vector<MixMember>& members);

// One run of positions dealt by one tree: from `start`, member i (keys[i])
// has `count[i]` more draws, after the `base[i]` it had before the segment.
struct MixSegment {
    std::uint64_t start = 0;
    std::vector<std::uint64_t> keys, base, count;
    std::uint64_t positions() const;
    bool operator==(const MixSegment&) const = default;
};

struct MixDraw {
    std::uint32_t member = 0; // index into the mix's members (the last segment's keys)
    std::uint64_t local = 0;  // position in the member's own epoch order
};

class MixOrder {
  public:
    // A fresh epoch: one segment from the members' quotas.
    MixOrder(std::uint64_t seed, std::uint64_t epoch, const std::vector<MixMember>& members);
    // An epoch resumed from its segments (a checkpoint's), in order, starting
    // at 0 and each where the one before ends or earlier.
    MixOrder(std::uint64_t seed, std::uint64_t epoch, std::vector<MixSegment> segments);

    std::uint64_t size() const; // positions in the epoch
    MixDraw operator[](std::uint64_t position) const;
    // Draws each member (by the last segment's keys) had before `position`.
    std::vector<std::uint64_t> taken(std::uint64_t position) const;
    const std::vector<MixSegment>& segments() const { return segments_; }
    const std::vector<std::uint64_t>& keys() const { return segments_.back().keys; }

    // The epoch continued at `position` by `members` (new weights, members
    // added or gone): a new segment from there. Where nothing changed, the
    // order is returned as it is.
    MixOrder resumed(std::uint64_t position, const std::vector<MixMember>& members) const;

  private:
    const MixSegment& segment_of(std::uint64_t position, std::size_t& index) const;

    std::uint64_t seed_, epoch_;
    std::vector<MixSegment> segments_;
    // Per segment, the last segment's member index of each of its members.
    std::vector<std::vector<std::uint32_t>> member_index_;
    // Per segment, its tree with the prefix sums and phases computed once
    // (shared: immutable, and an order is copied where it is resumed).
    struct Walk;
    std::vector<std::shared_ptr<const Walk>> walks_;
};

} // namespace dstk::data
