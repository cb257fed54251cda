#pragma once
// Dataset preparation split over N independent jobs: `--shard I/N` of dsgen
// and dsconvert writes part I (0-based) of the dataset that the same command
// without --shard writes, and `dsconvert --merge` joins the parts without
// copying samples (man/dsconvert.1).
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "dstk/channel_stats.hpp" // ChannelSums, for the parts' per-chunk sums
#include "dstk/chunked_file.hpp"  // SampleRange
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

} // namespace dstk
