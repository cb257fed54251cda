#pragma once
// Sizes and counts as users type and read them (DESIGN.md):
// sizes: K M G T and KiB MiB GiB TiB are powers of 1024, KB MB GB TB of 1000;
// counts: K M G are powers of 1000. Printed sizes use IEC units ("114.4 GiB").
#include <cstdint>
#include <string>
#include <string_view>

namespace dstk {

// Throws a usage error naming `what` (e.g. "--ram") on anything malformed,
// negative or over 2^64-1.
std::uint64_t parse_size(std::string_view text, std::string_view what = "size");
std::uint64_t parse_count(std::string_view text, std::string_view what = "count");
// A memory or disk budget (--ram, --disk, --gpu-mem, --host-mem ...): as
// parse_size, but a number without a unit below 1 MiB is refused with a hint
// ("did you mean 128G?"), since it is almost always a forgotten unit.
std::uint64_t parse_memory_size(std::string_view text, std::string_view what = "size");

std::string format_bytes(std::uint64_t bytes);    // "114.4 GiB", "512 B"
std::string format_count(std::uint64_t n);        // "10,000,000"
std::string format_rate(double bytes_per_second); // "1.23 GB/s" (decimal, as disks and links are quoted)
std::string format_duration(double seconds);      // "0.42 s", "3 min 05 s", "1 h 02 min"

// Checked arithmetic: overflow of 64 bits is an error naming `what`, never a wrap.
std::uint64_t checked_mul(std::uint64_t a, std::uint64_t b, std::string_view what);
std::uint64_t checked_add(std::uint64_t a, std::uint64_t b, std::string_view what);

} // namespace dstk
