#pragma once
// The pieces of the dstk._dstk module, one file each; module.cpp calls them.
#include <nanobind/nanobind.h>
#include <nanobind/ndarray.h>

#include <cstdint>
#include <memory>
#include <vector>

#include "dstk/dtype.hpp"

namespace dstk::py {

namespace nb = nanobind;

void bind_dataset(nb::module_& m);
void bind_order(nb::module_& m);
void bind_loader(nb::module_& m);

// The DLPack element type an array of `t` is exported as. NumPy has no
// bfloat16: bf16 goes out as its raw uint16 bits (widen converts).
nb::dlpack::dtype dlpack_dtype(DType t);
// The NumPy name of the dtype arrays of `t` have ("float32", "uint8"; bf16 as its raw "uint16").
const char* numpy_name(DType t);

// A host array NumPy owns: `bytes` of storage freed with the array.
struct HostBuffer {
    std::unique_ptr<std::uint8_t[]> data;
    explicit HostBuffer(std::uint64_t bytes) : data(new std::uint8_t[bytes == 0 ? 1 : bytes]) {}
};
// Hands `buf` to a NumPy array of `shape` and `dtype`.
nb::ndarray<nb::numpy> to_numpy(HostBuffer buf, const std::vector<std::size_t>& shape, nb::dlpack::dtype dtype);

} // namespace dstk::py
