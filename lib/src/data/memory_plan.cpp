// The memory a batch source will hold, known before it is built: the host
// plan of the stream placement and the backend memory of every placement,
// over every field the source delivers.
#include "memory_plan.hpp"

#include <algorithm>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "dstk/data/window_cache.hpp"
#include "dstk/error.hpp"
#include "dstk/sysinfo.hpp"
#include "dstk/units.hpp"
#include "host_ring.hpp"
#include "source_fields.hpp"

namespace dstk::data {
namespace {

constexpr std::uint64_t page = 4096;
// An .npy reader's O_DIRECT bounce buffer (field_reader.cpp): 4 MiB pieces and their alignment.
constexpr std::uint64_t bounce_bytes = (4ull << 20) + 2 * page;

bool is_zstd(const FieldInfo& f) {
    return f.storage == Storage::zstd_chunked;
}

// Whether stream reads of field f are O_DIRECT into the caller's buffer, with
// alignment slack around each range (zstd fields read frames into their own
// buffers instead).
bool direct_npy(const SourceFields& f, std::size_t i, const SourceConfig& c) {
    return c.direct && f.bulk(i) && !is_zstd(f[i]);
}

// The host ring: K slots of one buffer holding every field (slot_layout), and the readers' index buffers.
std::uint64_t ring_slots(const SourceConfig& c) {
    return c.device.backend == Backend::cuda ? std::max(c.prefetch, 2u) : std::max(c.prefetch, 1u);
}
std::uint64_t ring_slot_bytes(const SourceFields& f, const SourceConfig& c) {
    std::vector<std::uint64_t> sample_bytes;
    for (std::size_t i = 0; i < f.size(); ++i) sample_bytes.push_back(f[i].sample_bytes());
    return slot_layout(c.batch, sample_bytes).bytes;
}
std::uint64_t ring_bytes(const SourceFields& f, const SourceConfig& c) {
    return ring_slots(c) * ring_slot_bytes(f, c) +
           std::uint64_t{std::max(c.readers, 1u)} * c.batch * sizeof(std::uint64_t);
}

// Bytes of one storage chunk of a zstd field.
std::uint64_t storage_chunk_bytes(const FieldInfo& f) {
    return f.chunk_samples * f.sample_bytes();
}

// The full order's sample gathers, by the ring's reader threads: bounce
// buffers of the direct .npy fields, each zstd field's decoded chunks, and
// each thread's frame buffer (one per thread, sized for the largest frame it
// reads).
std::uint64_t gather_bytes(const SourceFields& f, const SourceConfig& c) {
    std::uint64_t bytes = 0, frame = 0;
    for (std::size_t i = 0; i < f.size(); ++i) {
        if (direct_npy(f, i, c)) bytes += std::uint64_t{c.readers} * bounce_bytes;
        if (!is_zstd(f[i])) continue;
        bytes += decoded_chunks_for(c) * storage_chunk_bytes(f[i]);
        frame = std::max(frame, storage_chunk_bytes(f[i]) + 3 * page);
    }
    return bytes + std::uint64_t{c.readers} * frame;
}

// What the window cache's I/O threads hold beside the cache: each thread's
// zstd frame buffer and, for a zstd field whose storage chunks are not the
// order's (or whose parts cut them), a decoded storage chunk to copy a range
// out of; bounce buffers of the direct .npy fields in parts (a chunk across
// a part boundary is read piece by piece).
std::uint64_t io_buffer_bytes(const SourceFields& f, const SourceConfig& c, const OrderConfig& order) {
    const std::uint64_t threads = io_threads_for(c.order, c.readers, f.decoded_chunk());
    std::uint64_t frame = 0, assembly = 0, bounce = 0;
    for (std::size_t i = 0; i < f.size(); ++i) {
        if (direct_npy(f, i, c) && !f[i].parts.empty()) bounce += bounce_bytes;
        if (!is_zstd(f[i])) continue;
        frame = std::max(frame, storage_chunk_bytes(f[i]) + 3 * page);
        if (f[i].chunk_samples != order.chunk_samples || !f[i].parts.empty())
            assembly = std::max(assembly, storage_chunk_bytes(f[i]));
    }
    return threads * (frame + assembly + bounce);
}

std::vector<CachedBytes> cached_bytes(const SourceFields& f, const SourceConfig& c) {
    std::vector<CachedBytes> out;
    for (std::size_t i = 0; i < f.size(); ++i) out.push_back({f[i].sample_bytes(), direct_npy(f, i, c)});
    return out;
}

// The whole split in the cache, where it is smaller than two windows: every
// chunk read once and held.
std::uint64_t whole_split_cache_bytes(const SourceFields& f, const SourceConfig& c, const OrderConfig& order) {
    const std::uint64_t cs = std::max<std::uint64_t>(order.chunk_samples, 1);
    const std::uint64_t chunks = (f.samples() + cs - 1) / cs;
    std::uint64_t bytes = 0;
    for (std::size_t i = 0; i < f.size(); ++i)
        bytes += f.samples() * f[i].sample_bytes() + chunks * (direct_npy(f, i, c) ? 3 * page : page);
    return bytes;
}

// The window cache's capacity: --host-mem less the rest, or up to a quarter
// of the memory available (at most four windows, at least two).
void plan_cache(const SourceFields& f, const SourceConfig& c, std::uint64_t available, HostPlan& p) {
    const OrderConfig order = f.order(c.order);
    const std::uint64_t whole = whole_split_cache_bytes(f, c, order);
    p.min_cache = std::min(min_window_cache_bytes(order, cached_bytes(f, c)), whole);
    p.other += io_buffer_bytes(f, c, order);
    const std::uint64_t fixed = p.ring + p.other;
    const auto name = [&](std::string_view setting) { return spell(c.names, setting); };
    if (c.host_mem != 0) {
        if (c.host_mem < fixed + p.min_cache)
            throw no_fit_error(name("host_mem") + " " + format_bytes(c.host_mem) + " is below the " +
                               format_bytes(fixed + p.min_cache) + " the stream needs (ring " + format_bytes(p.ring) +
                               " + two windows of " + std::to_string(order.window_chunks) + " chunks of " +
                               format_count(order.chunk_samples) + " samples, read whole); raise " + name("host_mem") +
                               " or lower " + name("window") + " or " + name("prefetch"));
        p.cache = c.host_mem - fixed;
        return;
    }
    const std::uint64_t share = available / 4 > fixed ? available / 4 - fixed : 0;
    p.cache = std::min(std::max(p.min_cache, std::min(share, 2 * p.min_cache)), whole);
    if (fixed + p.cache > available)
        throw no_fit_error("the stream placement needs " + format_bytes(fixed + p.cache) + " of host memory (ring " +
                           format_bytes(p.ring) + " + two windows of " + std::to_string(order.window_chunks) +
                           " chunks) but " + format_bytes(available) + " is available; lower " + name("window") +
                           " or " + name("batch") + ", or free memory");
}

} // namespace

std::uint64_t decoded_chunks_for(const SourceConfig& c) {
    return c.order.window_chunks * 2 + c.readers + 1;
}

std::uint64_t staging_bytes(std::uint64_t sample_bytes) {
    return std::max<std::uint64_t>(sample_bytes, load_piece_bytes / sample_bytes * sample_bytes);
}

// Chunk reads in flight. A disk reaches its random-chunk rate only with a deep
// queue (a few reads leave it idle between completions), so raw chunks get as
// many threads as the capacity's two groups hold chunks, up to 16: the threads
// wait in pread, and the cache's capacity, not the thread count, bounds the
// bytes in flight. zstd chunks are decoded by the same threads, so there they
// are also held to the cores (more would only add compressed frames).
unsigned io_threads_for(const OrderConfig& order, unsigned readers, std::uint64_t storage_chunk) {
    const std::uint64_t group = order.kind == Order::chunk ? std::max<std::uint64_t>(order.window_chunks, 1) : 1;
    std::uint64_t want = std::clamp<std::uint64_t>(2 * group, 4, 16);
    if (storage_chunk) want = std::min<std::uint64_t>(want, std::max(4u, std::thread::hardware_concurrency()));
    return std::max(readers, static_cast<unsigned>(want));
}

std::uint64_t planned_device_bytes(const SplitInfo& split, const std::vector<const FieldInfo*>& fields,
                                   const SourceConfig& c) {
    const SourceFields f(split, fields);
    const bool cuda = c.device.backend == Backend::cuda;
    // Non-sequential orders gather into a batch slot (and, on cuda, upload the
    // indices), or hand the indices alone to a consumer that reads rows.
    const std::uint64_t slot = cuda && c.rows ? 0 : checked_mul(c.batch, f.row_bytes(), "batch bytes");
    const std::uint64_t gather =
        c.order.kind == Order::sequential ? 0 : slot + (cuda ? std::uint64_t{c.batch} * 16 : 0);
    switch (c.placement) {
    case Placement::device:
        return checked_mul(split.samples, f.row_bytes(), "split bytes") + gather;
    case Placement::managed:
        return gather;
    case Placement::stream:
        // cuda: device slots in the host slots' layout; cpu: the host slots
        return cuda ? ring_slots(c) * ring_slot_bytes(f, c) : ring_bytes(f, c);
    case Placement::automatic:
        break;
    }
    throw std::logic_error("planned_device_bytes: unresolved placement");
}

HostPlan plan_host_memory(const SplitInfo& split, const std::vector<const FieldInfo*>& fields, const SourceConfig& c,
                          std::uint64_t available) {
    const SourceFields f(split, fields);
    HostPlan p;
    p.ring = ring_bytes(f, c);
    if (c.order.kind == Order::full)
        p.other = gather_bytes(f, c);
    else
        plan_cache(f, c, available, p);
    const std::uint64_t split_bytes = checked_mul(split.samples, f.row_bytes(), "split bytes");
    p.drop_pages = !c.direct && split_bytes + p.total() > available;
    return p;
}

std::uint64_t available_host_memory() {
    const MemoryReading m = read_host_memory();
    if (!m.cgroup_limit) return m.available;
    return std::min(m.available, *m.cgroup_limit > m.cgroup_anon ? *m.cgroup_limit - m.cgroup_anon : 0);
}

} // namespace dstk::data
