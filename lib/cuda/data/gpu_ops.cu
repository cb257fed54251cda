// The data path's CUDA runtime calls and its small kernels (row gather, label
// widening, the benchmark's consumer).
#include "dstk/data/gpu_ops.hpp"

#include <cuda_runtime.h>

#include <string>

#include "cuda_check.hpp"
#include "dstk/error.hpp"
#include "train/input_layout.hpp"

namespace dstk::data::gpu {
namespace {

cudaStream_t as_stream(void* s) {
    return static_cast<cudaStream_t>(s);
}
cudaEvent_t as_event(void* e) {
    return static_cast<cudaEvent_t>(e);
}

// One block per row, in the widest words the row's size and alignment allow.
template <typename Word>
__global__ void gather_kernel(Word* __restrict__ dst, const Word* __restrict__ src, std::uint64_t row_words,
                              const std::uint64_t* __restrict__ idx, std::uint32_t count) {
    const std::uint32_t row = blockIdx.x;
    if (row >= count) return;
    const Word* s = src + idx[row] * row_words;
    Word* d = dst + std::uint64_t{row} * row_words;
    for (std::uint64_t i = threadIdx.x; i < row_words; i += blockDim.x) d[i] = s[i];
}

__global__ void widen_kernel(const std::int32_t* __restrict__ y, std::int64_t* __restrict__ out, std::uint32_t n) {
    const std::uint32_t i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) out[i] = y[i];
}

} // namespace

void set_device(int device) {
    CUDA_CHECK(cudaSetDevice(device));
}

void mem_info(int device, std::uint64_t& free_bytes, std::uint64_t& total_bytes) {
    CUDA_CHECK(cudaSetDevice(device));
    std::size_t f = 0, t = 0;
    CUDA_CHECK(cudaMemGetInfo(&f, &t));
    free_bytes = f;
    total_bytes = t;
}

std::string pci_bus_id(int device) {
    char id[32] = {};
    CUDA_CHECK(cudaDeviceGetPCIBusId(id, sizeof id, device));
    return id;
}

void* device_alloc(std::uint64_t bytes) {
    void* p = nullptr;
    const cudaError_t e = cudaMalloc(&p, bytes ? bytes : 1);
    if (e == cudaErrorMemoryAllocation)
        throw no_fit_error(
            "cannot allocate " + std::to_string(bytes) +
            " bytes of GPU memory for the data path (use --data stream or a smaller --prefetch/--batch)");
    CUDA_CHECK(e);
    return p;
}
void device_free(void* p) {
    cudaFree(p);
}

void* pinned_alloc(std::uint64_t bytes) {
    void* p = nullptr;
    CUDA_CHECK(cudaHostAlloc(&p, bytes ? bytes : 1, cudaHostAllocPortable));
    return p;
}
void pinned_free(void* p) {
    cudaFreeHost(p);
}

void* managed_alloc(std::uint64_t bytes) {
    void* p = nullptr;
    CUDA_CHECK(cudaMallocManaged(&p, bytes ? bytes : 1, cudaMemAttachGlobal));
    return p;
}
void managed_free(void* p) {
    cudaFree(p);
}

void* stream_create() {
    cudaStream_t s = nullptr;
    CUDA_CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
    return s;
}
void stream_destroy(void* stream) {
    cudaStreamDestroy(as_stream(stream));
}
void stream_synchronize(void* stream) {
    CUDA_CHECK(cudaStreamSynchronize(as_stream(stream)));
}

void* event_create(bool timing) {
    cudaEvent_t e = nullptr;
    CUDA_CHECK(cudaEventCreateWithFlags(&e, timing ? cudaEventDefault : cudaEventDisableTiming));
    return e;
}
void event_destroy(void* event) {
    cudaEventDestroy(as_event(event));
}
void event_record(void* event, void* stream) {
    CUDA_CHECK(cudaEventRecord(as_event(event), as_stream(stream)));
}
void event_synchronize(void* event) {
    CUDA_CHECK(cudaEventSynchronize(as_event(event)));
}
bool event_done(void* event) {
    const cudaError_t e = cudaEventQuery(as_event(event));
    if (e == cudaErrorNotReady) return false;
    CUDA_CHECK(e);
    return true;
}
float event_elapsed_ms(void* start, void* end) {
    float ms = 0;
    CUDA_CHECK(cudaEventElapsedTime(&ms, as_event(start), as_event(end)));
    return ms;
}
void stream_wait_event(void* stream, void* event) {
    CUDA_CHECK(cudaStreamWaitEvent(as_stream(stream), as_event(event), 0));
}

void copy_h2d_async(void* dst, const void* src, std::uint64_t bytes, void* stream) {
    CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyHostToDevice, as_stream(stream)));
}
void copy_h2d(void* dst, const void* src, std::uint64_t bytes) {
    CUDA_CHECK(cudaMemcpy(dst, src, bytes, cudaMemcpyHostToDevice));
}

void copy_d2h(void* dst, const void* src, std::uint64_t bytes) {
    CUDA_CHECK(cudaMemcpy(dst, src, bytes, cudaMemcpyDeviceToHost));
}

void copy_d2d_async(void* dst, const void* src, std::uint64_t bytes, void* stream) {
    CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice, as_stream(stream)));
}

void convert_batch_async(const void* x, DType dtype, const std::int32_t* y, std::uint32_t n, std::uint32_t channels,
                         std::uint64_t hw, const float* mean, const float* inv_std, float* x_out, std::int32_t* y_out,
                         void* stream) {
    train::cuda::launch_convert_input(x, dtype, y, n, channels, hw, mean, inv_std, x_out, train::cuda::ActType::f32,
                                      true, channels, y_out, as_stream(stream));
}

void widen_labels_async(const std::int32_t* y, std::int64_t* out, std::uint32_t n, void* stream) {
    if (n == 0) return;
    widen_kernel<<<(n + 255) / 256, 256, 0, as_stream(stream)>>>(y, out, n);
    CUDA_CHECK(cudaGetLastError());
}

namespace {

// Rows of Word-sized words: a warp at least, up to 128 threads per row (a
// label's row is one thread's work).
template <typename Word>
void launch_gather(void* dst, const void* src, std::uint64_t row_bytes, const std::uint64_t* idx, std::uint32_t count,
                   cudaStream_t stream) {
    const std::uint64_t words = row_bytes / sizeof(Word);
    const unsigned threads = static_cast<unsigned>(words >= 128 ? 128 : (words + 31) / 32 * 32);
    gather_kernel<Word>
        <<<count, threads, 0, stream>>>(static_cast<Word*>(dst), static_cast<const Word*>(src), words, idx, count);
    CUDA_CHECK(cudaGetLastError());
}

bool aligned_rows(const void* dst, const void* src, std::uint64_t row_bytes, std::uint64_t word) {
    return row_bytes % word == 0 && reinterpret_cast<std::uintptr_t>(dst) % word == 0 &&
           reinterpret_cast<std::uintptr_t>(src) % word == 0;
}

} // namespace

void gather_rows_async(void* dst, const void* src, std::uint64_t row_bytes, const std::uint64_t* idx,
                       std::uint32_t count, void* stream) {
    if (count == 0 || row_bytes == 0) return;
    if (aligned_rows(dst, src, row_bytes, 16))
        launch_gather<uint4>(dst, src, row_bytes, idx, count, as_stream(stream));
    else if (aligned_rows(dst, src, row_bytes, 4))
        launch_gather<unsigned>(dst, src, row_bytes, idx, count, as_stream(stream));
    else
        launch_gather<unsigned char>(dst, src, row_bytes, idx, count, as_stream(stream));
}

void advise_host_preferred(const void* p, std::uint64_t bytes, int device) {
    cudaMemLocation host{};
    host.type = cudaMemLocationTypeHost;
    host.id = 0;
    cudaMemLocation gpu{};
    gpu.type = cudaMemLocationTypeDevice;
    gpu.id = device;
    CUDA_CHECK(cudaMemAdvise(p, bytes, cudaMemAdviseSetPreferredLocation, host));
    CUDA_CHECK(cudaMemAdvise(p, bytes, cudaMemAdviseSetAccessedBy, gpu));
}

void prefetch_to_device(const void* p, std::uint64_t bytes, int device, void* stream) {
    cudaMemLocation gpu{};
    gpu.type = cudaMemLocationTypeDevice;
    gpu.id = device;
    CUDA_CHECK(cudaMemPrefetchAsync(p, bytes, gpu, 0, as_stream(stream)));
}

} // namespace dstk::data::gpu

namespace dstk::data::gpu {
namespace {

// Reads every word of [p, p + words) once, XOR-folded into *sink so that the
// reads cannot be optimised away: a consumer that touches a batch as a model's
// first layer would.
template <typename Word>
__global__ void consume_kernel(const Word* __restrict__ p, std::uint64_t words, unsigned long long* sink) {
    unsigned long long acc = 0;
    for (std::uint64_t i = blockIdx.x * std::uint64_t{blockDim.x} + threadIdx.x; i < words;
         i += std::uint64_t{gridDim.x} * blockDim.x) {
        const Word w = p[i];
        if constexpr (sizeof(Word) == 16)
            acc ^=
                (static_cast<unsigned long long>(w.x) << 32 | w.y) ^ (static_cast<unsigned long long>(w.z) << 32 | w.w);
        else
            acc ^= w;
    }
    if (acc != 0) atomicXor(sink, acc);
}

} // namespace

void consume_async(const void* p, std::uint64_t bytes, unsigned long long* sink, void* stream) {
    if (bytes == 0) return;
    const bool wide = bytes % 16 == 0 && reinterpret_cast<std::uintptr_t>(p) % 16 == 0;
    const std::uint64_t words = wide ? bytes / 16 : bytes;
    const std::uint64_t want = (words + 255) / 256;
    const unsigned blocks = static_cast<unsigned>(want < 1024 ? want : 1024);
    if (wide)
        consume_kernel<uint4><<<blocks, 256, 0, as_stream(stream)>>>(static_cast<const uint4*>(p), words, sink);
    else
        consume_kernel<unsigned char>
            <<<blocks, 256, 0, as_stream(stream)>>>(static_cast<const unsigned char*>(p), words, sink);
    CUDA_CHECK(cudaGetLastError());
}

} // namespace dstk::data::gpu
