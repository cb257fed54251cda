#include "random_reads.hpp"

#include <algorithm>
#include <atomic>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "clock.hpp"
#include "dstk/bench/results.hpp"
#include "dstk/data/stream_reader.hpp"
#include "dstk/thread_pool.hpp"

namespace dstk::data {
namespace {

constexpr double probe_seconds = 0.25;

// Reads on `threads` threads until the time is up; each read(thread, k) is one
// random access. Returns accesses per second.
template <typename Read> double probe(unsigned threads, Read read) {
    std::atomic<std::uint64_t> done{0};
    std::atomic<bool> failed{false};
    const auto t0 = Clock::now();
    std::vector<std::thread> pool;
    start_threads(
        pool, threads,
        [&](unsigned t) {
            try {
                for (std::uint64_t k = 0; !failed && seconds_since(t0) < probe_seconds; ++k) {
                    read(t, k);
                    ++done;
                }
            } catch (...) {
                failed = true;
            }
        },
        [&] { failed = true; }, std::to_string(threads) + " threads to probe random reads");
    for (auto& th : pool) th.join();
    const double s = seconds_since(t0);
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

RandomReadRate predict_random_reads(const Dataset& ds, const SplitInfo& split, const FieldInfo& field,
                                    const std::filesystem::path& bench, unsigned readers) {
    readers = std::max(readers, 1u);
    const std::uint64_t sb = field.sample_bytes();
    if (!bench.empty() && field.storage == Storage::npy) {
        const auto fig = bench::best_random_read(bench::load_results(bench), "sample");
        if (fig && fig->rate > 0 && fig->threads > 0) {
            const double scale = std::min(1.0, static_cast<double>(readers) / fig->threads);
            return {fig->rate * scale / static_cast<double>(sb), "dsbench's io.rand.sample.pread.cold (" +
                                                                     bench.string() + ", " +
                                                                     std::to_string(fig->threads) + " threads)"};
        }
    }
    StreamSettings settings;
    settings.direct = true; // the disk's rate, not the page cache's
    settings.decoded_chunks = readers + 1;
    const std::unique_ptr<StreamReader> r = StreamReader::open(ds, split.name, field.name, settings);
    const bool zstd = field.storage == Storage::zstd_chunked;
    std::vector<std::vector<std::uint8_t>> bufs(readers, std::vector<std::uint8_t>(sb));
    const double rate = probe(readers, [&](unsigned t, std::uint64_t k) {
        const std::uint64_t index = random_below(r->samples(), t, k);
        r->gather({&index, 1}, bufs[t].data());
    });
    const std::string how =
        zstd ? "random chunk decodes (one per sample read"
             : std::string("random ") + (r->direct() ? "O_DIRECT" : "page-cache") + " sample reads (";
    return {rate, "a probe of " + how + ", " + std::to_string(readers) + " threads)"};
}

} // namespace dstk::data
