// dstk._dstk: the core library's datasets, orders and batch sources for
// Python. dstk::Error becomes dstk.Error (a RuntimeError) carrying the
// library's message and its exit code.
#include <Python.h>

#include "bindings.hpp"
#include "dstk/data/batch_source.hpp"
#include "dstk/error.hpp"
#include "dstk/fd.hpp"
#include "dstk/gpu_info.hpp"
#include "dstk/sysinfo.hpp"

namespace dstk::py {

nb::dlpack::dtype dlpack_dtype(DType t) {
    switch (t) {
    case DType::u8:
        return nb::dtype<std::uint8_t>();
    case DType::i8:
        return nb::dtype<std::int8_t>();
    case DType::u16:
    case DType::bf16:
        return nb::dtype<std::uint16_t>();
    case DType::i16:
        return nb::dtype<std::int16_t>();
    case DType::i32:
        return nb::dtype<std::int32_t>();
    case DType::i64:
        return nb::dtype<std::int64_t>();
    case DType::f16:
        return {static_cast<std::uint8_t>(nb::dlpack::dtype_code::Float), 16, 1};
    case DType::f32:
        return nb::dtype<float>();
    case DType::f64:
        return nb::dtype<double>();
    }
    return nb::dtype<std::uint8_t>();
}

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

nb::ndarray<nb::numpy> to_numpy(HostBuffer buf, const std::vector<std::size_t>& shape, nb::dlpack::dtype dtype) {
    auto* owned = new HostBuffer(std::move(buf));
    nb::capsule owner(owned, [](void* p) noexcept { delete static_cast<HostBuffer*>(p); });
    return nb::ndarray<nb::numpy>(owned->data.get(), shape.size(), shape.data(), owner, nullptr, dtype);
}

} // namespace dstk::py

namespace {

PyObject* error_type = nullptr;

void translate(const std::exception_ptr& p, void*) {
    try {
        std::rethrow_exception(p);
    } catch (const dstk::Error& e) {
        PyObject* exc = PyObject_CallFunction(error_type, "s", e.what());
        if (!exc) return;
        PyObject* code = PyLong_FromLong(static_cast<long>(e.code()));
        PyObject_SetAttrString(exc, "exit_code", code);
        Py_XDECREF(code);
        PyErr_SetObject(error_type, exc);
        Py_DECREF(exc);
    }
}

} // namespace

NB_MODULE(_dstk, m) {
    namespace nb = nanobind;
    // As in the tools: a process started with stdin, stdout or stderr closed
    // would otherwise hand their numbers to the next files the library opens.
    dstk::ensure_standard_fds();
    m.doc() = "dstk's core library: datasets, epoch orders and batch sources (use the dstk package)";
    error_type = PyErr_NewExceptionWithDoc(
        "dstk.Error",
        "An error from the dstk library. The message says what is wrong, why, and what to do; exit_code is the "
        "code the command-line tools exit with for it (1 runtime, 2 usage, 3 does not fit or missing, 130 "
        "interrupted).",
        PyExc_RuntimeError, nullptr);
    m.attr("Error") = nb::handle(error_type);
    nb::register_exception_translator(translate);
    m.attr("built_with_cuda") = dstk::built_with_cuda();
    m.attr("__version__") = DSTK_VERSION;
    m.def(
        "host_memory",
        [] {
            const dstk::MemoryReading m = dstk::read_host_memory();
            nb::dict d;
            d["total"] = m.total;
            d["available"] = m.available;
            d["cgroup_limit"] = m.cgroup_limit ? nb::cast(*m.cgroup_limit) : nb::none();
            d["for_data"] = dstk::data::available_host_memory();
            return d;
        },
        "Host memory in bytes, as the loader plans it: total and available (/proc/meminfo), the memory "
        "cgroup's limit (None without one) and for_data, what a stream placement may take (available, "
        "less what the cgroup's processes already hold under its limit).");
    dstk::py::bind_dataset(m);
    dstk::py::bind_order(m);
    dstk::py::bind_loader(m);
}
