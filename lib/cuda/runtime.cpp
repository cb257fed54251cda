// dstk/gpu_runtime.hpp through the CUDA runtime (host code: compiled by the
// C++ compiler). runtime_none.cpp stands in for it in builds without CUDA.
#include "dstk/gpu_runtime.hpp"

#include <cuda_runtime.h>

#include <utility>

#include "cuda_check.hpp"
#include "dstk/error.hpp"
#include "dstk/units.hpp"

namespace dstk::gpu {
namespace {

cudaStream_t as_stream(void* s) {
    return static_cast<cudaStream_t>(s);
}
cudaEvent_t as_event(void* e) {
    return static_cast<cudaEvent_t>(e);
}

void* allocate(Memory kind, std::uint64_t bytes) {
    void* p = nullptr;
    const std::uint64_t n = bytes ? bytes : 1;
    switch (kind) {
    case Memory::device: {
        const cudaError_t e = cudaMalloc(&p, n);
        if (e == cudaErrorMemoryAllocation) {
            cudaGetLastError();
            throw no_fit_error("cannot allocate " + format_bytes(bytes) +
                               " of GPU memory for the data path (the GPU is full); place the data with the stream "
                               "placement, or lower the batch or prefetch");
        }
        CUDA_CHECK(e);
        break;
    }
    case Memory::pinned:
        CUDA_CHECK(cudaHostAlloc(&p, n, cudaHostAllocPortable));
        break;
    case Memory::managed:
        CUDA_CHECK(cudaMallocManaged(&p, n, cudaMemAttachGlobal));
        break;
    }
    return p;
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

Buffer::Buffer(Memory kind, std::uint64_t bytes) : p_(allocate(kind, bytes)), bytes_(bytes), kind_(kind) {}

Buffer::~Buffer() {
    reset();
}

Buffer::Buffer(Buffer&& o) noexcept
    : p_(std::exchange(o.p_, nullptr)), bytes_(std::exchange(o.bytes_, 0)), kind_(o.kind_) {}

Buffer& Buffer::operator=(Buffer&& o) noexcept {
    if (this != &o) {
        reset();
        p_ = std::exchange(o.p_, nullptr);
        bytes_ = std::exchange(o.bytes_, 0);
        kind_ = o.kind_;
    }
    return *this;
}

void Buffer::reset() noexcept {
    if (!p_) return;
    if (kind_ == Memory::pinned)
        cudaFreeHost(p_);
    else
        cudaFree(p_);
    p_ = nullptr;
}

Stream::Stream() {
    cudaStream_t s = nullptr;
    CUDA_CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
    s_ = s;
}

Stream::~Stream() {
    if (s_) cudaStreamDestroy(as_stream(s_));
}

Stream::Stream(Stream&& o) noexcept : s_(std::exchange(o.s_, nullptr)) {}

void Stream::synchronize() const {
    gpu::synchronize(s_);
}

Event::Event(bool timing) {
    cudaEvent_t e = nullptr;
    CUDA_CHECK(cudaEventCreateWithFlags(&e, timing ? cudaEventDefault : cudaEventDisableTiming));
    e_ = e;
}

Event::~Event() {
    if (e_) cudaEventDestroy(as_event(e_));
}

Event::Event(Event&& o) noexcept : e_(std::exchange(o.e_, nullptr)) {}

void Event::record(void* stream) {
    CUDA_CHECK(cudaEventRecord(as_event(e_), as_stream(stream)));
}

void Event::synchronize() const {
    CUDA_CHECK(cudaEventSynchronize(as_event(e_)));
}

bool Event::done() const {
    const cudaError_t e = cudaEventQuery(as_event(e_));
    if (e == cudaErrorNotReady) return false;
    CUDA_CHECK(e);
    return true;
}

float Event::elapsed_ms(const Event& start) const {
    float ms = 0;
    CUDA_CHECK(cudaEventElapsedTime(&ms, as_event(start.e_), as_event(e_)));
    return ms;
}

void synchronize(void* stream) {
    CUDA_CHECK(cudaStreamSynchronize(as_stream(stream)));
}

void wait(void* stream, const Event& e) {
    CUDA_CHECK(cudaStreamWaitEvent(as_stream(stream), as_event(e.get()), 0));
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

} // namespace dstk::gpu
