#pragma once
// The stream placement's ring depth K (the setting prefetch) and reader
// count (readers) from dsbench's results (the setting bench: dstrain --bench
// FILE); plan_source (source_plan.hpp) asks here.
//
//   readers  the thread count that gave the best cold random reads at the
//            granularity the order reads at (sequential: batch, chunk: chunk,
//            full: sample; the others when that one was not measured).
//   K        readers + 2 (the batch being copied and the one being computed)
//            + the batches the GPU can take during one p99 read latency at
//            the pinned host-to-device rate (the storage's rate without one),
//            so a slow read does not stall a step; at least 4, at most 32
//            slots and 1 GiB of slots (each slot is also a device slot).
//
// Settings the caller gave explicitly win over the file.
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "dstk/bench/results.hpp"
#include "dstk/data/order.hpp"
#include "dstk/data/settings.hpp"

namespace dstk::data {

struct LoaderTuning {
    unsigned prefetch = 4, readers = 2;
    std::vector<std::string> why; // one line per choice, for the user
};

// `row_bytes`: one sample over every delivered field; `given_*`: the
// settings as the caller gave them (kept as they are); `names` spells the
// settings in the lines of `why`.
LoaderTuning tune_loader(const bench::Results& results, Order order, std::uint64_t row_bytes, std::uint32_t batch,
                         unsigned hardware_threads, std::optional<unsigned> given_prefetch,
                         std::optional<unsigned> given_readers, unsigned default_prefetch, unsigned default_readers,
                         const SettingNames& names = {});

} // namespace dstk::data
