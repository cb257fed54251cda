// dstk.order_indices: an epoch's order from the library's EpochOrder, the
// function every batch source follows.
#include "bindings.hpp"

#include <nanobind/stl/string.h>

#include <string>

#include "dstk/data/order.hpp"

namespace dstk::py {

namespace {

nb::ndarray<nb::numpy> order_indices(std::uint64_t samples, std::uint64_t epoch, const std::string& order,
                                     std::uint64_t seed, std::uint64_t chunk, std::uint64_t window) {
    data::OrderConfig c;
    c.kind = data::parse_order(order);
    c.seed = seed;
    c.chunk_samples = chunk;
    c.window_chunks = window;
    HostBuffer buf(samples * 8);
    auto* out = reinterpret_cast<std::uint64_t*>(buf.data.get());
    {
        nb::gil_scoped_release unlocked;
        const data::EpochOrder o(c, samples, epoch);
        for (std::uint64_t i = 0; i < samples; ++i) out[i] = o[i];
    }
    return to_numpy(std::move(buf), {static_cast<std::size_t>(samples)}, nb::dtype<std::uint64_t>());
}

} // namespace

void bind_order(nb::module_& m) {
    m.def("order_indices", &order_indices, nb::arg("samples"), nb::arg("epoch"), nb::arg("order") = "chunk",
          nb::arg("seed") = 0, nb::arg("chunk") = 4096, nb::arg("window") = 8,
          "The sample index at each position of one epoch (uint64 array of `samples`), from the library's\n"
          "EpochOrder: the order dstk.Loader and dstrain visit. order: sequential, chunk or full; chunk:\n"
          "samples per chunk (a zstd-chunked field's own chunk is what the loader uses); window: chunks\n"
          "mixed together.");
}

} // namespace dstk::py
