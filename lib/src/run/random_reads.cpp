#include "run/random_reads.hpp"
#include "clock.hpp"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <memory>
#include <thread>
#include <vector>

#include "dstk/bench/results.hpp"
#include "dstk/chunked_file.hpp"
#include "dstk/fd.hpp"
#include "dstk/npy.hpp"

namespace dstk::run {
namespace {

constexpr double probe_seconds = 0.25;
constexpr std::uint64_t align = 4096;

struct FreeDeleter {
    void operator()(std::uint8_t* p) const { std::free(p); }
};

// Reads on `threads` threads until the time is up; each read(thread, k) is one
// random access. Returns accesses per second.
template <typename Read> double probe(unsigned threads, Read read) {
    std::atomic<std::uint64_t> done{0};
    std::atomic<bool> failed{false};
    const auto t0 = data::Clock::now();
    std::vector<std::thread> pool;
    for (unsigned t = 0; t < threads; ++t)
        pool.emplace_back([&, t] {
            try {
                for (std::uint64_t k = 0; data::seconds_since(t0) < probe_seconds; ++k) {
                    read(t, k);
                    ++done;
                }
            } catch (...) {
                failed = true;
            }
        });
    for (auto& th : pool) th.join();
    const double s = data::seconds_since(t0);
    return failed || s <= 0 ? 0.0 : static_cast<double>(done.load()) / s;
}

// A scattered index below n for read k of a thread (a splitmix64 step).
std::uint64_t random_below(std::uint64_t n, unsigned thread, std::uint64_t k) {
    std::uint64_t z = 0x9e3779b97f4a7c15ull * (k + 1) + (std::uint64_t{thread} << 40);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return (z ^ (z >> 31)) % std::max<std::uint64_t>(n, 1);
}

} // namespace

RandomReadRate predict_random_reads(const Dataset& ds, const FieldInfo& x, const std::filesystem::path& bench,
                                    unsigned readers) {
    readers = std::max(readers, 1u);
    const std::uint64_t sb = x.sample_bytes();
    // A field in parts (dsconvert --merge): the probe reads its first part;
    // random reads of one file measure the disk as well as of all of them.
    const FieldPart* first_part = x.parts.empty() ? nullptr : &x.parts.front();
    const std::filesystem::path path = ds.dir() / (first_part ? first_part->file : x.file);
    const std::uint64_t samples = first_part ? first_part->samples : ds.manifest().split("train").samples;
    if (!bench.empty() && x.storage == Storage::npy) {
        const auto fig = bench::best_random_read(bench::load_results(bench), "sample");
        if (fig && fig->rate > 0 && fig->threads > 0) {
            const double scale = std::min(1.0, static_cast<double>(readers) / fig->threads);
            return {fig->rate * scale / static_cast<double>(sb), "dsbench's io.rand.sample.pread.cold (" +
                                                                     bench.string() + ", " +
                                                                     std::to_string(fig->threads) + " threads)"};
        }
    }
    if (x.storage == Storage::zstd_chunked) {
        const ChunkedReader reader(path);
        std::vector<std::vector<std::uint8_t>> bufs(readers, std::vector<std::uint8_t>(reader.max_chunk_bytes()));
        const double rate = probe(readers, [&](unsigned t, std::uint64_t k) {
            reader.read_chunk(random_below(reader.chunks(), t, k), bufs[t].data());
        });
        return {rate, "a probe of random chunk decodes (one per sample read, " + std::to_string(readers) + " threads)"};
    }
    const std::uint64_t data_offset = read_npy_header(path).data_offset;
    UniqueFd fd = try_open_input_file(path, "dataset file", O_DIRECT);
    const bool direct = static_cast<bool>(fd);
    if (!direct) fd = open_input_file(path, "dataset file");
    const std::uint64_t span = (sb + 2 * align - 1) / align * align + align;
    std::vector<std::unique_ptr<std::uint8_t, FreeDeleter>> bufs;
    for (unsigned t = 0; t < readers; ++t)
        bufs.emplace_back(static_cast<std::uint8_t*>(std::aligned_alloc(align, span)));
    const double rate = probe(readers, [&](unsigned t, std::uint64_t k) {
        const std::uint64_t off = data_offset + random_below(samples, t, k) * sb;
        const std::uint64_t start = off / align * align;
        const std::uint64_t len = (off + sb - start + align - 1) / align * align;
        if (::pread(fd.get(), bufs[t].get(), len, static_cast<off_t>(start)) < 0) throw std::runtime_error("pread");
    });
    return {rate, std::string("a probe of random ") + (direct ? "O_DIRECT" : "page-cache") + " sample reads (" +
                      std::to_string(readers) + " threads)"};
}

} // namespace dstk::run
