#pragma once
// The CUDA runtime calls of the data path, behind a plain header (no CUDA
// types: streams and events are void*). Defined only in builds with CUDA
// (DSTK_HAVE_CUDA); callers guard their use. Errors throw dstk::Error naming
// the call, file and line.
#include <cstdint>
#include <string>

#include "dstk/dtype.hpp"

namespace dstk::data::gpu {

void set_device(int device);
void mem_info(int device, std::uint64_t& free_bytes, std::uint64_t& total_bytes);
std::string pci_bus_id(int device); // "0000:65:00.0": the device as NVML knows it

void* device_alloc(std::uint64_t bytes); // cudaMalloc
void device_free(void* p);
void* pinned_alloc(std::uint64_t bytes); // cudaHostAlloc (portable)
void pinned_free(void* p);
void* managed_alloc(std::uint64_t bytes); // cudaMallocManaged (global)
void managed_free(void* p);

void* stream_create(); // non-blocking
void stream_destroy(void* stream);
void stream_synchronize(void* stream);
void* event_create(bool timing);
void event_destroy(void* event);
void event_record(void* event, void* stream);
void event_synchronize(void* event);
bool event_done(void* event);
float event_elapsed_ms(void* start, void* end);
void stream_wait_event(void* stream, void* event);

void copy_h2d_async(void* dst, const void* src, std::uint64_t bytes, void* stream);
void copy_h2d(void* dst, const void* src, std::uint64_t bytes);
void copy_d2h(void* dst, const void* src, std::uint64_t bytes); // synchronous (tests, inspection)
void copy_d2d_async(void* dst, const void* src, std::uint64_t bytes, void* stream);

// x_out = (x - mean[c]) * inv_std[c] as float, NCHW (the samples' stored C x HW
// order), and the labels copied: the trainer's input conversion (u8, bf16,
// f16, f32) for consumers outside the trainer (the Python loader). mean and
// inv_std: `channels` floats in device memory; y_out null: labels not copied.
void convert_batch_async(const void* x, DType dtype, const std::int32_t* y, std::uint32_t n, std::uint32_t channels,
                         std::uint64_t hw, const float* mean, const float* inv_std, float* x_out, std::int32_t* y_out,
                         void* stream);
// out[i] = y[i] as int64, i < n: labels for consumers whose losses take int64 (PyTorch's).
void widen_labels_async(const std::int32_t* y, std::int64_t* out, std::uint32_t n, void* stream);

// dst row i = src row idx[i], i < count (rows of row_bytes bytes: one field
// of a batch); idx in device (or managed) memory.
void gather_rows_async(void* dst, const void* src, std::uint64_t row_bytes, const std::uint64_t* idx,
                       std::uint32_t count, void* stream);

// Reads every byte of [p, p + bytes) (device or managed memory) on `stream`,
// XOR-folded into *sink (device memory): dsbench's stand-in for a model
// reading its batch.
void consume_async(const void* p, std::uint64_t bytes, unsigned long long* sink, void* stream);

// Managed memory placement (CUDA 13: cudaMemLocation).
void advise_host_preferred(const void* p, std::uint64_t bytes, int device); // PreferredLocation=CPU, AccessedBy=GPU
void prefetch_to_device(const void* p, std::uint64_t bytes, int device, void* stream);

} // namespace dstk::data::gpu
