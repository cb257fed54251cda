#pragma once
// Batch sources for tests, through the one entrance (data::plan_source). On
// the cpu backend the plans see a machine of fixed facts (8 GiB available, 4
// hardware threads), so that what a test checks does not depend on what the
// test machine has free; cuda requests see this machine's GPU.
#include <memory>
#include <string>

#include "dstk/data/source_plan.hpp"
#include "dstk/dataset.hpp"

namespace dstk::test_support {

inline data::MachineFacts test_machine(const Device& device) {
    if (device.backend == Backend::cuda) return data::machine_facts(device);
    data::MachineFacts m;
    m.host_available = 8ull << 30;
    m.hardware_threads = 4;
    return m;
}

// A request of `batch` samples in order `o` with the chunk order's chunk and
// window given (chunk 0: the plan's), 3 ring slots and 2 readers.
inline data::SourceRequest request(data::Placement p, data::Order o, std::uint32_t batch, std::uint64_t seed = 17,
                                   std::uint64_t chunk = 64, std::uint64_t window = 3) {
    data::SourceRequest r;
    r.placement = p;
    r.device = {Backend::cpu, 0};
    r.order = o;
    r.seed = seed;
    r.chunk_samples = chunk;
    r.window = window;
    r.batch = batch;
    r.prefetch = 3;
    r.readers = 2;
    return r;
}

inline data::SourcePlan plan_of(const Dataset& ds, const data::SourceRequest& r) {
    return data::plan_source(ds, r, test_machine(r.device));
}

inline std::unique_ptr<data::BatchSource> open_source(const Dataset& ds, const data::SourceRequest& r) {
    return data::make_batch_source(ds, plan_of(ds, r));
}

// The order the plan's sources follow (its chunk resolved).
inline data::OrderConfig order_of(const Dataset& ds, const data::SourceRequest& r) {
    return plan_of(ds, r).config.order;
}

} // namespace dstk::test_support
