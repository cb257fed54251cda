#pragma once
// Per-channel statistics of a field's values (the manifest's "stats"): sums
// and sums of squares per channel, added block by block in sample order, so
// that a single run, a merge of --shard parts and a concatenation add the
// same rows in the same order. Channels follow stats_channels (manifest.hpp).
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "dstk/dtype.hpp"
#include "dstk/manifest.hpp"

namespace dstk {

class ChannelSums {
  public:
    explicit ChannelSums(std::uint64_t channels) : sum_(channels, 0.0), sumsq_(channels, 0.0) {}
    // A block's row: its channels' sums, then their sums of squares.
    void add(const std::vector<double>& row);
    std::uint64_t channels() const { return sum_.size(); }
    // Mean and standard deviation of `values_per_channel` values per channel.
    ChannelStats stats(double values_per_channel) const;

  private:
    std::vector<double> sum_, sumsq_;
};

// Adds `count` samples of `shape` and dtype `t` (stored units) to `row`
// (2 x stats_channels(shape) values): per channel, the sum of its values,
// then the sum of their squares. Each sample's channel is summed on its own
// first (exact integer sums for u8), then added to the row sample by sample,
// so that a row filled in several calls equals one filled at once.
void add_channel_sums(std::vector<double>& row, const void* samples, std::uint64_t count, DType t, const Shape& shape);
// The row of `count` samples (add_channel_sums to a row of zeros).
std::vector<double> channel_sums_row(const void* samples, std::uint64_t count, DType t, const Shape& shape);

// Statistics that a reader can normalise with: every mean and std finite and
// every std positive. Otherwise nullopt, and `why` says which channel fails
// ("channel 3 is constant (std 0)").
std::optional<ChannelStats> usable_stats(ChannelStats s, std::string& why);

// The statistics of samples made of members with statistics (a
// concatenation): the members' means and variances weighted by their
// samples. `samples[k]` samples of member k; all have the same channels.
ChannelStats combine_stats(const std::vector<ChannelStats>& members, const std::vector<std::uint64_t>& samples);

} // namespace dstk
