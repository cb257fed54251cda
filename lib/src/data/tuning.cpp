#include "dstk/data/tuning.hpp"

#include <algorithm>
#include <cmath>
#include <cstdio>

#include "dstk/units.hpp"

namespace dstk::data {
namespace {

constexpr unsigned min_slots = 4, max_slots = 32, max_readers = 64;
constexpr std::uint64_t max_ring_bytes = 1ull << 30;

std::string fixed1(double v) {
    char buf[32];
    std::snprintf(buf, sizeof buf, "%.1f", v);
    return buf;
}

} // namespace

LoaderTuning tune_loader(const bench::Results& results, Order order, std::uint64_t row_bytes, std::uint32_t batch,
                         unsigned hardware_threads, std::optional<unsigned> given_prefetch,
                         std::optional<unsigned> given_readers, unsigned default_prefetch, unsigned default_readers,
                         const SettingNames& names) {
    LoaderTuning t;
    t.prefetch = given_prefetch.value_or(default_prefetch);
    t.readers = given_readers.value_or(default_readers);
    const std::uint64_t batch_bytes = std::max<std::uint64_t>(1, std::uint64_t{batch} * row_bytes);

    // The granularity this order reads at, then the others.
    std::vector<const char*> grains;
    switch (order) {
    case Order::sequential:
        grains = {"batch", "chunk", "sample"};
        break;
    case Order::chunk:
        grains = {"chunk", "batch", "sample"};
        break;
    case Order::full:
        grains = {"sample", "batch", "chunk"};
        break;
    }
    std::optional<bench::RandomReadFigure> fig;
    std::string grain;
    for (const char* g : grains)
        if ((fig = bench::best_random_read(results, g))) {
            grain = g;
            break;
        }
    const auto seq = bench::sequential_read_rate(results);
    const auto h2d = bench::pinned_h2d_rate(results);

    if (given_readers) {
        t.why.push_back("readers " + std::to_string(t.readers) + " (" + spell(names, "readers") + " given)");
    } else if (fig && fig->threads > 0) {
        t.readers = std::clamp(fig->threads, 1u, std::min(max_readers, std::max(1u, hardware_threads)));
        t.why.push_back("readers " + std::to_string(t.readers) + ": cold random " + grain +
                        " reads were fastest with " + std::to_string(fig->threads) + " threads (" +
                        format_rate(fig->rate) + ", p99 " + fixed1(fig->latency_p99_us / 1000.0) + " ms" +
                        (t.readers != fig->threads
                             ? ", capped at " + std::to_string(t.readers) + " hardware threads here"
                             : std::string()) +
                        ")");
    } else {
        t.why.push_back("readers " + std::to_string(t.readers) +
                        " (default: the file has no io.rand.*.pread.cold result)");
    }

    if (given_prefetch) {
        t.why.push_back("prefetch " + std::to_string(t.prefetch) + " (" + spell(names, "prefetch") + " given)");
    } else if (fig || h2d) {
        // Batches the GPU could take during one slow (p99) read.
        const double consume = h2d ? *h2d : (fig ? fig->rate : *seq);
        const double p99 = fig ? fig->latency_p99_us * 1e-6 : 0.0;
        const auto cover = static_cast<unsigned>(
            std::min<double>(max_slots, std::ceil(p99 * consume / static_cast<double>(batch_bytes))));
        const unsigned by_memory =
            static_cast<unsigned>(std::clamp<std::uint64_t>(max_ring_bytes / batch_bytes, 2, max_slots));
        const unsigned want = std::max(min_slots, t.readers + 2 + cover);
        t.prefetch = std::min({want, max_slots, by_memory});
        std::string line = "prefetch " + std::to_string(t.prefetch) + ": " + std::to_string(t.readers) +
                           " readers + 2 in use + " + std::to_string(cover) + " to cover a p99 read of " +
                           fixed1(p99 * 1000.0) + " ms at " + format_rate(consume) +
                           (h2d ? " (pinned host-to-device)" : " (the storage)") + ", " + format_bytes(batch_bytes) +
                           " per batch";
        if (t.prefetch < want)
            line += "; capped at " + std::to_string(t.prefetch) + " slots (" + format_bytes(max_ring_bytes) +
                    " of slots at most, " + std::to_string(max_slots) + " slots at most)";
        else if (want == min_slots && t.readers + 2 + cover < min_slots)
            line += "; at least " + std::to_string(min_slots);
        t.why.push_back(line);
    } else {
        t.why.push_back("prefetch " + std::to_string(t.prefetch) +
                        " (default: the file has neither io.rand.*.pread.cold nor h2d.pinned results)");
    }
    if (seq)
        t.why.push_back("storage reads " + format_rate(*seq) + " sequentially: about " +
                        format_count(static_cast<std::uint64_t>(*seq / static_cast<double>(row_bytes))) +
                        " samples/s from a cold cache");
    return t;
}

} // namespace dstk::data
