#pragma once
// Making a file's reads cold, and checking that they are: posix_fadvise
// (DONTNEED) drops the file's clean pages; with drop_caches (root only) the
// whole page cache is dropped through /proc/sys/vm/drop_caches. mincore tells
// how much of the file is still resident afterwards, so a filesystem that
// cannot drop its pages (tmpfs) is caught rather than measured as "cold".
#include <cstdint>
#include <filesystem>
#include <optional>
#include <string>

namespace dstk::bench {

// Drops the cached pages of `file` (and, when `drop_caches`, the whole page
// cache). Returns the method used ("posix_fadvise", "drop_caches").
std::string drop_file_cache(const std::filesystem::path& file, bool drop_caches);

// Fraction (0..1) of the pages of [offset, offset + bytes) of `file` resident in the page cache.
double resident_fraction(const std::filesystem::path& file, std::uint64_t offset, std::uint64_t bytes);

// Why cold reads of `file` cannot be measured here (its pages stay resident
// after dropping, as on tmpfs), or nullopt. Reads up to 16 MiB of it to find out.
std::optional<std::string> cold_cache_unsupported(const std::filesystem::path& file, bool drop_caches);

// True when this process may write /proc/sys/vm/drop_caches.
bool can_drop_caches();

} // namespace dstk::bench
