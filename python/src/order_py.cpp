// dstk.order_indices: an epoch's order from the library's EpochOrder, the
// function every batch source follows.
#include "bindings.hpp"

#include <nanobind/stl/string.h>

#include <limits>
#include <new>
#include <string>

#include "dstk/data/order.hpp"

namespace dstk::py {

namespace {

// The order's buffer, 8 bytes a sample. Above 2^61 samples that product wraps
// around to a small buffer the loop would write past; both it and a failed
// allocation raise a MemoryError that says how much was asked for.
HostBuffer order_buffer(std::uint64_t samples) {
    const bool wraps = samples > std::numeric_limits<std::size_t>::max() / sizeof(std::uint64_t);
    if (!wraps) {
        try {
            return HostBuffer(samples * sizeof(std::uint64_t));
        } catch (const std::bad_alloc&) {
        }
    }
    const std::string m = "order_indices of " + std::to_string(samples) + " samples needs " +
                          (wraps ? std::string("more than 2^64") : std::to_string(samples * sizeof(std::uint64_t))) +
                          " bytes (8 a sample), more than this process can allocate: ask for fewer samples";
    PyErr_SetString(PyExc_MemoryError, m.c_str());
    throw nb::python_error();
}

nb::ndarray<nb::numpy> order_indices(std::uint64_t samples, std::uint64_t epoch, const std::string& order,
                                     std::uint64_t seed, std::uint64_t chunk, std::uint64_t window) {
    data::OrderConfig c;
    c.kind = data::parse_order(order);
    c.seed = seed;
    c.chunk_samples = chunk;
    c.window_chunks = window;
    HostBuffer buf = order_buffer(samples);
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
