// dstk._Dataset: a dataset directory opened by the library (manifest checked
// against the files), read by sample range through its FieldReaders: .npy
// files by pread, zstd-chunked files chunk by chunk (only the chunks that hold
// the range are decoded).
#include "bindings.hpp"

#include <nanobind/stl/string.h>
#include <nanobind/stl/vector.h>

#include <string>

#include "dstk/dataset.hpp"
#include "dstk/error.hpp"
#include "dstk/manifest.hpp"
#include "dstk/widen.hpp"

namespace dstk::py {

namespace {

// Dataset holds unique_ptrs in a vector (which claims to be copyable): bound
// through a shared handle.
struct DatasetHandle {
    std::shared_ptr<const Dataset> ds;
};

nb::ndarray<nb::numpy> read(const DatasetHandle& h, const std::string& split, const std::string& field,
                            std::uint64_t first, std::uint64_t count, bool widen_floats) {
    const FieldReader& r = h.ds->reader(split, field);
    const FieldInfo& f = r.info();
    std::vector<std::size_t> shape{static_cast<std::size_t>(count)};
    for (const std::uint64_t d : f.shape.dims) shape.push_back(static_cast<std::size_t>(d));
    HostBuffer raw(count * r.sample_bytes());
    const bool wide = widen_floats && (f.dtype == DType::bf16 || f.dtype == DType::f16);
    if (!wide) {
        {
            nb::gil_scoped_release unlocked;
            r.read(first, count, raw.data.get());
        }
        return to_numpy(std::move(raw), shape, dlpack_dtype(f.dtype));
    }
    const std::uint64_t values = count * f.shape.numel();
    HostBuffer out(values * 4);
    {
        nb::gil_scoped_release unlocked;
        r.read(first, count, raw.data.get());
        auto* to = reinterpret_cast<float*>(out.data.get());
        for (std::uint64_t i = 0; i < values; ++i) to[i] = widen_float(raw.data.get(), f.dtype, i);
    }
    return to_numpy(std::move(out), shape, nb::dtype<float>());
}

} // namespace

void bind_dataset(nb::module_& m) {
    nb::class_<DatasetHandle>(m, "_Dataset")
        .def_static(
            "open",
            [](const std::string& path) {
                nb::gil_scoped_release unlocked;
                return DatasetHandle{std::make_shared<const Dataset>(Dataset::open(path))};
            },
            nb::arg("path"))
        .def_prop_ro("path", [](const DatasetHandle& h) { return h.ds->dir().string(); })
        .def("manifest_json", [](const DatasetHandle& h) { return serialize_manifest(h.ds->manifest()); })
        .def("read", &read, nb::arg("split"), nb::arg("field"), nb::arg("first"), nb::arg("count"),
             nb::arg("widen") = false,
             "Samples [first, first + count) of a field as a new array of shape (count, *sample_shape).")
        .def(
            "check",
            [](const DatasetHandle& h, const std::string& split, const std::string& field) {
                const SplitInfo& s = h.ds->manifest().split(split);
                if (!field.empty()) s.field(field);
            },
            "Raises the library's error for a split (or field) the manifest does not have.")
        .def(
            "verify",
            [](const DatasetHandle& h) {
                nb::gil_scoped_release unlocked;
                verify_dataset(h.ds->dir());
            },
            "Re-reads every file and checks sizes and checksums; raises naming the first bad file (and chunk).");
}

} // namespace dstk::py
