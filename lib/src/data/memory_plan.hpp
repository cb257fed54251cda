#pragma once
// What the sources and their memory plans (plan_host_memory,
// planned_device_bytes, in memory_plan.cpp) must agree on.
#include <cstdint>

#include "dstk/data/batch_source.hpp"

namespace dstk::data {

// Decoded chunks each zstd field's reader keeps for sample gathers: the
// order's window plus one per reader, so that a window is decoded once.
std::uint64_t decoded_chunks_for(const SourceConfig& c);

// A resident placement loads a field through a staging buffer of about this
// many bytes (whole samples, at least one).
constexpr std::uint64_t load_piece_bytes = 64ull << 20;
std::uint64_t staging_bytes(std::uint64_t sample_bytes);

} // namespace dstk::data
