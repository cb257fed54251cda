// dstk._Loader: the C++ side of dstk.Loader (dstk/loader.py holds the Python
// iteration protocol, the state dict and the documentation).
#include "bindings.hpp"

#include <nanobind/stl/string.h>
#include <nanobind/stl/tuple.h>
#include <nanobind/stl/vector.h>

#include <string>

#include "dstk/error.hpp"
#include "loader.hpp"

namespace dstk::py {

namespace {

struct LoaderArgs {
    std::string path, split, placement, device, order, managed_policy;
    std::uint32_t batch = 256;
    std::uint64_t seed = 0, chunk = 4096, window = 8;
    bool drop_last = true, direct = false, convert = true, normalize = true, oversubscribe = false;
    unsigned prefetch = 4, readers = 2, keep = 2;
    bool labels64 = false;
    std::vector<float> mean, std;
};

LoaderConfig config_of(const LoaderArgs& a) {
    LoaderConfig c;
    c.split = a.split;
    data::SourceConfig& s = c.source;
    s.device = parse_device(a.device);
    // "host": the cpu backend's stream source (batches in host memory) whatever device says.
    if (a.placement == "host") {
        s.device = Device{};
        s.placement = data::Placement::stream;
    } else {
        s.placement = data::parse_placement(a.placement);
        if (s.placement == data::Placement::automatic)
            throw usage_error("invalid placement 'auto' (expected stream, device, managed or host)");
    }
    s.order.kind = data::parse_order(a.order);
    s.order.seed = a.seed;
    s.order.chunk_samples = a.chunk;
    s.order.window_chunks = a.window;
    s.batch = a.batch;
    s.drop_last = a.drop_last;
    s.prefetch = a.prefetch;
    s.readers = a.readers;
    s.direct = a.direct;
    s.managed_policy = data::parse_managed_policy(a.managed_policy);
    s.oversubscribe = a.oversubscribe;
    c.convert = a.convert;
    c.normalize = a.normalize;
    c.mean = a.mean;
    c.std = a.std;
    c.keep = a.keep;
    c.labels64 = a.labels64;
    return c;
}

std::vector<std::size_t> batch_shape(const FieldInfo& f, std::uint32_t n) {
    std::vector<std::size_t> shape{n};
    for (const std::uint64_t d : f.shape.dims) shape.push_back(static_cast<std::size_t>(d));
    return shape;
}

// Releases the GIL while the source waits for its readers, then lets Python
// raise KeyboardInterrupt for a Ctrl-C that came meanwhile.
template <typename F> auto without_gil(F&& f) {
    decltype(f()) r;
    {
        nb::gil_scoped_release unlocked;
        r = f();
    }
    if (PyErr_CheckSignals() != 0) throw nb::python_error();
    return r;
}

nb::dlpack::dtype label_dtype(const Loader& l) {
    return l.config().labels64 ? nb::dtype<std::int64_t>() : nb::dtype<std::int32_t>();
}

// cpu: (x, y), NumPy arrays the caller owns; None at the end of the epoch.
nb::object next_host(Loader& l) {
    const std::uint32_t batch = l.config().source.batch;
    HostBuffer x(std::uint64_t{batch} * l.out_sample_bytes()), y(std::uint64_t{batch} * l.label_bytes());
    const std::uint32_t n = without_gil([&] { return l.next_host(x.data.get(), y.data.get()); });
    if (n == 0) return nb::none();
    auto xs = to_numpy(std::move(x), batch_shape(l.x_field(), n), dlpack_dtype(l.out_dtype()));
    auto ys = to_numpy(std::move(y), {n}, label_dtype(l));
    return nb::make_tuple(xs, ys);
}

// The NumPy name of a dtype, for DeviceArray.dtype ("float32", "uint8"; bf16 as its raw "uint16").
const char* numpy_name(DType t) {
    switch (t) {
    case DType::u8:
        return "uint8";
    case DType::i8:
        return "int8";
    case DType::u16:
    case DType::bf16:
        return "uint16";
    case DType::i16:
        return "int16";
    case DType::i32:
        return "int32";
    case DType::i64:
        return "int64";
    case DType::f16:
        return "float16";
    case DType::f32:
        return "float32";
    case DType::f64:
        return "float64";
    }
    return "uint8";
}

// cuda: takes the next batch, and `stream` (a cudaStream_t; -1: none yet)
// waits for it; returns (slot, size), None at the end of the epoch. The
// batch's arrays come from slot_arrays: a consumer that keeps its own views
// of each slot (dstk.Loader's torch tensors) asks once per slot.
nb::object next_device(Loader& l, std::int64_t stream) {
    DeviceBatch b;
    if (!without_gil([&] { return l.next_device(b); })) return nb::none();
    if (stream != -1) l.wait_ready(b.slot, static_cast<std::uintptr_t>(stream));
    return nb::make_tuple(b.slot, b.size);
}

// The arrays of the batch of `size` samples in `slot`: (x, y, x's shape, x's
// and y's NumPy dtype names).
nb::object slot_arrays(Loader& l, unsigned slot, std::uint32_t size) {
    const DeviceBatch b = l.slot_batch(slot, size);
    const int dev = l.config().source.device.index;
    auto owner = [&] {
        return nb::capsule(new std::shared_ptr<DeviceSlots>(b.memory),
                           [](void* p) noexcept { delete static_cast<std::shared_ptr<DeviceSlots>*>(p); });
    };
    const auto xshape = batch_shape(l.x_field(), b.size);
    const std::size_t yshape[1] = {b.size};
    nb::ndarray<nb::array_api> xs(b.x, xshape.size(), xshape.data(), owner(), nullptr, dlpack_dtype(l.out_dtype()),
                                  nb::device::cuda::value, dev);
    nb::ndarray<nb::array_api> ys(b.y, 1, yshape, owner(), nullptr, label_dtype(l), nb::device::cuda::value, dev);
    // nanobind's array-API objects carry no shape or dtype attributes: they go along for DeviceArray.
    nb::list xdims;
    for (const std::size_t d : xshape) xdims.append(d);
    return nb::make_tuple(xs, ys, nb::tuple(xdims), numpy_name(l.out_dtype()), l.config().labels64 ? "int64" : "int32");
}

nb::dict times_dict(const data::StageTimes& t) {
    nb::dict d;
    d["read_wait"] = t.read_wait;
    d["read"] = t.read;
    d["decode"] = t.decode;
    d["h2d"] = t.h2d;
    d["batches"] = t.batches;
    d["samples"] = t.samples;
    d["bytes"] = t.bytes;
    return d;
}

} // namespace

void bind_loader(nb::module_& m) {
    nb::class_<Loader>(m, "_Loader")
        .def("__init__",
             [](Loader* self, const LoaderArgs& a) {
                 const LoaderConfig c = config_of(a);
                 nb::gil_scoped_release unlocked;
                 new (self) Loader(a.path, c);
             })
        .def_prop_ro("on_gpu", &Loader::on_gpu)
        .def_prop_ro("samples", &Loader::samples)
        .def_prop_ro("batches_per_epoch", &Loader::batches_per_epoch)
        .def_prop_ro("device_bytes", &Loader::device_bytes)
        .def_prop_ro("host_bytes", &Loader::host_bytes)
        .def_prop_ro("mean", &Loader::mean)
        .def_prop_ro("std", &Loader::stdev)
        .def_prop_ro("placement",
                     [](const Loader& l) { return std::string(data::placement_name(l.config().source.placement)); })
        .def_prop_ro("device", [](const Loader& l) { return device_name(l.config().source.device); })
        .def_prop_ro("dtype", [](const Loader& l) { return std::string(dtype_name(l.out_dtype())); })
        .def_prop_ro("stored_dtype", [](const Loader& l) { return std::string(dtype_name(l.x_field().dtype)); })
        .def("start_epoch",
             [](Loader& l, std::uint64_t epoch, std::uint64_t first) {
                 nb::gil_scoped_release unlocked;
                 l.start_epoch(epoch, first);
             })
        .def(
            "next", [](Loader& l, std::int64_t stream) { return l.on_gpu() ? next_device(l, stream) : next_host(l); },
            nb::arg("stream") = -1)
        .def("slot_arrays", &slot_arrays, nb::arg("slot"), nb::arg("size"))
        .def("wait_ready", &Loader::wait_ready, nb::arg("slot"), nb::arg("stream"))
        .def("take_times", [](Loader& l) { return times_dict(l.take_times()); });

    nb::class_<LoaderArgs>(m, "_LoaderArgs")
        .def(nb::init<>())
        .def_rw("path", &LoaderArgs::path)
        .def_rw("split", &LoaderArgs::split)
        .def_rw("placement", &LoaderArgs::placement)
        .def_rw("device", &LoaderArgs::device)
        .def_rw("order", &LoaderArgs::order)
        .def_rw("managed_policy", &LoaderArgs::managed_policy)
        .def_rw("batch", &LoaderArgs::batch)
        .def_rw("seed", &LoaderArgs::seed)
        .def_rw("chunk", &LoaderArgs::chunk)
        .def_rw("window", &LoaderArgs::window)
        .def_rw("drop_last", &LoaderArgs::drop_last)
        .def_rw("direct", &LoaderArgs::direct)
        .def_rw("convert", &LoaderArgs::convert)
        .def_rw("normalize", &LoaderArgs::normalize)
        .def_rw("oversubscribe", &LoaderArgs::oversubscribe)
        .def_rw("prefetch", &LoaderArgs::prefetch)
        .def_rw("readers", &LoaderArgs::readers)
        .def_rw("keep", &LoaderArgs::keep)
        .def_rw("labels64", &LoaderArgs::labels64)
        .def_rw("mean", &LoaderArgs::mean)
        .def_rw("std", &LoaderArgs::std);
}

} // namespace dstk::py
