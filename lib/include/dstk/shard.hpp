#pragma once
// Dataset preparation split over N independent jobs: `--shard I/N` of dsgen
// and dsconvert writes part I (0-based) of the dataset that the same command
// without --shard writes, and `dsconvert --merge` joins the parts without
// copying samples (man/dsconvert.1).
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "dstk/chunked_file.hpp" // SampleRange
#include "dstk/manifest.hpp"

namespace dstk {

struct ShardSpec {
    std::uint64_t index = 0, count = 1; // part index (0-based) of count
};

// "I/N" with 0 <= I < N; a usage error saying the form otherwise.
ShardSpec parse_shard(std::string_view text);

// The samples of part `s` of a split of `samples` samples: the split is cut
// into chunks of `chunk_samples` (the last one may be short) and part I takes
// chunks [floor(I*C/N), floor((I+1)*C/N)) of the C chunks. The parts are
// disjoint, in order and cover the split; they differ by at most one chunk,
// and a part is empty where N > C.
SampleRange shard_range(std::uint64_t samples, std::uint64_t chunk_samples, ShardSpec s);

// Per-channel sums of values, added chunk by chunk in sample order: a single
// run and a merge of shards add the same per-chunk rows in the same order, so
// their statistics are bit-identical.
class ChannelSums {
  public:
    explicit ChannelSums(std::uint64_t channels) : sum_(channels, 0.0), sumsq_(channels, 0.0) {}
    // A chunk's row: its channels' sums, then their sums of squares.
    void add(const std::vector<double>& row);
    std::uint64_t channels() const { return sum_.size(); }
    // Mean and standard deviation of `values_per_channel` values per channel.
    ChannelStats stats(double values_per_channel) const;

  private:
    std::vector<double> sum_, sumsq_;
};

} // namespace dstk
