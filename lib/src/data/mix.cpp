#include "dstk/data/mix.hpp"

#include <algorithm>
#include <cmath>
#include <numeric>
#include <stdexcept>

#include "dstk/error.hpp"
#include "dstk/rng.hpp"

namespace dstk::data {
namespace {

constexpr std::uint64_t stream_mix = 0x6d69780000ull; // "mix", the segment index in the low bits

// The node's phase in [0, n): node ids number the tree as a heap (root 1).
std::uint64_t node_phase(std::uint64_t seed, std::uint64_t epoch, std::size_t segment, std::uint64_t node,
                         std::uint64_t n) {
    const PhiloxBlock b = philox(seed, stream_mix + segment, (epoch << 24) | node);
    return ((std::uint64_t{b[0]} << 32) | b[1]) % n;
}

// Positions of the left subtree among the first i of the node's n.
std::uint64_t left_before(std::uint64_t i, std::uint64_t a, std::uint64_t n, std::uint64_t phase) {
    return static_cast<std::uint64_t>((static_cast<unsigned __int128>(i) * a + phase) / n);
}

} // namespace

// The tree over a segment's members, walked from the root: at each node the
// range [lo, hi) of members, its positions and the left subtree's share. The
// prefix sums and (for trees of up to max_tabled members) every node's phase
// are computed once per segment: a draw is then a few integer steps per
// level, which a mix source takes for every sample of every batch.
struct MixOrder::Walk {
    static constexpr std::size_t max_tabled = 1u << 16;
    std::vector<std::uint64_t> prefix; // prefix[j]: draws of members [0, j)
    std::vector<std::uint64_t> phases; // by node id (heap numbering, root 1); empty: computed per draw
    std::uint64_t seed, epoch;
    std::size_t segment;

    Walk(const MixSegment& seg, std::uint64_t sd, std::uint64_t ep, std::size_t index)
        : prefix(seg.count.size() + 1, 0), seed(sd), epoch(ep), segment(index) {
        std::partial_sum(seg.count.begin(), seg.count.end(), prefix.begin() + 1);
        if (seg.count.size() <= max_tabled) {
            phases.assign(4 * seg.count.size() + 1, 0);
            table(0, seg.count.size(), 1);
        }
    }
    void table(std::size_t lo, std::size_t hi, std::uint64_t node) {
        if (hi - lo <= 1) return;
        const std::size_t mid = lo + (hi - lo) / 2;
        const std::uint64_t n = prefix[hi] - prefix[lo];
        phases[node] = n == 0 ? 0 : node_phase(seed, epoch, segment, node, n);
        table(lo, mid, 2 * node);
        table(mid, hi, 2 * node + 1);
    }
    std::uint64_t phase(std::uint64_t node, std::uint64_t n) const {
        return phases.empty() ? node_phase(seed, epoch, segment, node, n) : phases[node];
    }

    // The member dealt position i of the segment, and its draw within it.
    std::pair<std::size_t, std::uint64_t> draw(std::uint64_t i) const {
        std::size_t lo = 0, hi = prefix.size() - 1;
        std::uint64_t node = 1;
        while (hi - lo > 1) {
            const std::size_t mid = lo + (hi - lo) / 2;
            const std::uint64_t n = prefix[hi] - prefix[lo], a = prefix[mid] - prefix[lo];
            const std::uint64_t ph = phase(node, n), before = left_before(i, a, n, ph);
            if (left_before(i + 1, a, n, ph) > before) {
                hi = mid, i = before, node = 2 * node;
            } else {
                lo = mid, i -= before, node = 2 * node + 1;
            }
        }
        return {lo, i};
    }
    // Draws of each member among the segment's first i positions.
    void taken(std::size_t lo, std::size_t hi, std::uint64_t node, std::uint64_t i,
               std::vector<std::uint64_t>& out) const {
        if (hi - lo == 1) {
            out[lo] = i;
            return;
        }
        const std::size_t mid = lo + (hi - lo) / 2;
        const std::uint64_t n = prefix[hi] - prefix[lo], a = prefix[mid] - prefix[lo];
        const std::uint64_t left = n == 0 ? 0 : left_before(i, a, n, phase(node, n));
        taken(lo, mid, 2 * node, left, out);
        taken(mid, hi, 2 * node + 1, i - left, out);
    }
};

namespace {

void check_members(const std::vector<MixMember>& members) {
    if (members.empty()) throw usage_error("a mix needs at least one member dataset");
    if (members.size() > (1u << 22)) throw usage_error("a mix of more than 4194304 members");
    for (const MixMember& m : members) {
        if (m.samples == 0) throw usage_error("mix member '" + m.name + "' has no samples (nothing to draw from)");
        if (!valid_mix_weight(m.weight))
            throw usage_error("mix member '" + m.name + "' has weight " + std::to_string(m.weight) +
                              " (weights must be positive finite numbers)");
    }
    for (std::size_t i = 0; i < members.size(); ++i)
        for (std::size_t j = 0; j < i; ++j)
            if (members[i].key == members[j].key)
                throw usage_error("mix members '" + members[j].name + "' and '" + members[i].name +
                                  "' are the same dataset (list each member once; weights set its share)");
}

MixSegment fresh_segment(const std::vector<MixMember>& members) {
    MixSegment s;
    s.count = mix_quotas(members);
    for (const MixMember& m : members) s.keys.push_back(m.key);
    s.base.assign(members.size(), 0);
    return s;
}

} // namespace

std::vector<std::uint64_t> mix_quotas(const std::vector<MixMember>& members) {
    check_members(members);
    std::size_t r = 0;
    for (std::size_t m = 1; m < members.size(); ++m)
        if (members[m].weight * static_cast<double>(members[r].samples) >
            members[r].weight * static_cast<double>(members[m].samples))
            r = m;
    std::vector<std::uint64_t> k(members.size());
    for (std::size_t m = 0; m < members.size(); ++m) {
        const long double share = static_cast<long double>(members[r].samples) * members[m].weight / members[r].weight;
        k[m] = m == r ? members[m].samples
                      : std::min<std::uint64_t>(members[m].samples, static_cast<std::uint64_t>(std::llroundl(share)));
    }
    return k;
}

std::uint64_t MixSegment::positions() const {
    return std::accumulate(count.begin(), count.end(), std::uint64_t{0});
}

MixOrder::MixOrder(std::uint64_t seed, std::uint64_t epoch, const std::vector<MixMember>& members)
    : MixOrder(seed, epoch, std::vector<MixSegment>{fresh_segment(members)}) {}

MixOrder::MixOrder(std::uint64_t seed, std::uint64_t epoch, std::vector<MixSegment> segments)
    : seed_(seed), epoch_(epoch), segments_(std::move(segments)) {
    if (segments_.empty() || segments_.front().start != 0)
        throw runtime_error("mix order: the segments do not start at position 0 (a damaged checkpoint?)");
    for (std::size_t i = 0; i < segments_.size(); ++i) {
        const MixSegment& s = segments_[i];
        if (s.keys.empty() || s.base.size() != s.keys.size() || s.count.size() != s.keys.size())
            throw runtime_error("mix order: segment " + std::to_string(i) + " is malformed (a damaged checkpoint?)");
        if (i > 0 && s.start > segments_[i - 1].start + segments_[i - 1].positions())
            throw runtime_error("mix order: segment " + std::to_string(i) +
                                " starts past the end of the one before (a damaged checkpoint?)");
    }
    const std::vector<std::uint64_t>& last = segments_.back().keys;
    for (const MixSegment& s : segments_) {
        std::vector<std::uint32_t> index;
        for (const std::uint64_t k : s.keys) {
            const auto it = std::find(last.begin(), last.end(), k);
            index.push_back(static_cast<std::uint32_t>(it == last.end() ? last.size() : it - last.begin()));
        }
        member_index_.push_back(std::move(index));
    }
    for (std::size_t i = 0; i < segments_.size(); ++i)
        walks_.push_back(std::make_shared<const Walk>(segments_[i], seed_, epoch_, i));
}

std::uint64_t MixOrder::size() const {
    return segments_.back().start + segments_.back().positions();
}

const MixSegment& MixOrder::segment_of(std::uint64_t position, std::size_t& index) const {
    index = segments_.size() - 1;
    while (index > 0 && segments_[index].start > position) --index;
    return segments_[index];
}

MixDraw MixOrder::operator[](std::uint64_t position) const {
    if (position >= size()) throw std::out_of_range("mix position past the end of the epoch");
    std::size_t si = 0;
    const MixSegment& s = segment_of(position, si);
    const auto [m, t] = walks_[si]->draw(position - s.start);
    return {member_index_[si][m], s.base[m] + t};
}

std::vector<std::uint64_t> MixOrder::taken(std::uint64_t position) const {
    std::size_t si = 0;
    const MixSegment& s = segment_of(std::min(position, size()), si);
    std::vector<std::uint64_t> within(s.keys.size(), 0);
    walks_[si]->taken(0, s.keys.size(), 1, std::min(position, size()) - s.start, within);
    std::vector<std::uint64_t> out(keys().size(), 0);
    for (std::size_t m = 0; m < s.keys.size(); ++m)
        if (member_index_[si][m] < out.size()) out[member_index_[si][m]] = s.base[m] + within[m];
    return out;
}

MixOrder MixOrder::resumed(std::uint64_t position, const std::vector<MixMember>& members) const {
    if (position > size()) throw std::out_of_range("mix resume past the end of the epoch");
    std::size_t si = 0;
    const MixSegment& s = segment_of(position, si);
    std::vector<std::uint64_t> had(s.keys.size(), 0);
    walks_[si]->taken(0, s.keys.size(), 1, position - s.start, had);
    const std::vector<std::uint64_t> quota = mix_quotas(members);
    MixSegment next;
    next.start = position;
    bool same = members.size() == s.keys.size();
    for (std::size_t m = 0; m < members.size(); ++m) {
        const auto it = std::find(s.keys.begin(), s.keys.end(), members[m].key);
        const std::uint64_t base = it == s.keys.end() ? 0 : s.base[it - s.keys.begin()] + had[it - s.keys.begin()];
        next.keys.push_back(members[m].key);
        next.base.push_back(base);
        next.count.push_back(quota[m] > base ? quota[m] - base : 0);
        // Unchanged where each member ends the epoch where it would have.
        same = same && it == s.keys.begin() + static_cast<std::ptrdiff_t>(m) &&
               next.base.back() + next.count.back() == s.base[m] + s.count[m];
    }
    if (same) return *this;
    std::vector<MixSegment> segs(segments_.begin(),
                                 segments_.begin() + static_cast<std::ptrdiff_t>(si) + (s.start < position ? 1 : 0));
    segs.push_back(std::move(next));
    return MixOrder(seed_, epoch_, std::move(segs));
}

} // namespace dstk::data
