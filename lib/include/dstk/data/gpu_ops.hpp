#pragma once
// The data path's GPU kernels, behind a plain header (no CUDA types: a stream
// is a void* cudaStream_t): the row gather of the resident placements and
// dsbench's consumer. The runtime's buffers, streams and events are in
// dstk/gpu_runtime.hpp; the conversion of batch fields in
// dstk/data/convert.hpp. In a build without CUDA these throw a no_fit_error
// (lib/cuda/runtime_none.cpp).
#include <cstdint>

namespace dstk::data::kernels {

// dst row i = src row idx[i], i < count (rows of row_bytes bytes: one field
// of a batch); idx in device (or managed) memory.
void gather_rows_async(void* dst, const void* src, std::uint64_t row_bytes, const std::uint64_t* idx,
                       std::uint32_t count, void* stream);

// Reads every byte of [p, p + bytes) (device or managed memory) on `stream`,
// XOR-folded into *sink (device memory): dsbench's stand-in for a model
// reading its batch.
void consume_async(const void* p, std::uint64_t bytes, unsigned long long* sink, void* stream);

} // namespace dstk::data::kernels
