#include "dstk/shard.hpp"

#include <algorithm>
#include <charconv>
#include <cmath>

#include "dstk/error.hpp"

namespace dstk {

ShardSpec parse_shard(std::string_view text) {
    const auto bad = [&](const std::string& why) {
        return usage_error("invalid --shard '" + std::string(text) + "' (" + why +
                           "); give I/N with I counted from 0: the parts of --shard ?/3 are 0/3, 1/3 and 2/3 "
                           "(e.g. --shard $SLURM_ARRAY_TASK_ID/3 with --array=0-2)");
    };
    const auto slash = text.find('/');
    if (slash == std::string_view::npos) throw bad("expected I/N");
    ShardSpec s;
    const auto number = [&](std::string_view t, std::uint64_t& v) {
        const auto [end, ec] = std::from_chars(t.data(), t.data() + t.size(), v);
        if (t.empty() || ec != std::errc() || end != t.data() + t.size())
            throw bad("'" + std::string(t) + "' is not a whole number");
    };
    number(text.substr(0, slash), s.index);
    number(text.substr(slash + 1), s.count);
    if (s.count == 0) throw bad("N must be at least 1");
    if (s.index >= s.count) throw bad("I must be below N; parts are numbered from 0");
    return s;
}

SampleRange shard_range(std::uint64_t samples, std::uint64_t chunk_samples, ShardSpec s) {
    if (chunk_samples == 0 || s.count == 0 || s.index >= s.count)
        throw runtime_error("internal: shard_range needs chunk_samples > 0 and index < count");
    const std::uint64_t chunks = chunk_count(samples, chunk_samples);
    // floor(I * C / N) without overflow: C and N fit 64 bits, the product may not.
    const auto cut = [&](std::uint64_t i) {
        return static_cast<std::uint64_t>(static_cast<unsigned __int128>(i) * chunks / s.count);
    };
    const auto sample_at = [&](std::uint64_t chunk) {
        return static_cast<std::uint64_t>(
            std::min<unsigned __int128>(samples, static_cast<unsigned __int128>(chunk) * chunk_samples));
    };
    const std::uint64_t first = sample_at(cut(s.index)), end = sample_at(cut(s.index + 1));
    return {first, end - first};
}

} // namespace dstk
