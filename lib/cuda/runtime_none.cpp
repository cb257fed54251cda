// dstk/gpu_runtime.hpp and dstk/data/gpu_ops.hpp in a build without CUDA:
// built in place of runtime.cpp and data/*.cu, so that callers need no #if of
// their own. Nothing here can reach a GPU: every call that would says so.
#include "dstk/data/convert.hpp"
#include "dstk/data/gpu_ops.hpp"
#include "dstk/error.hpp"
#include "dstk/gpu_runtime.hpp"

namespace dstk::gpu {
namespace {

[[noreturn]] void no_cuda() {
    throw no_fit_error("a GPU was asked for, but this dstk was built without CUDA support (nvcc was not found at "
                       "build time); use the cpu device, or rebuild with the CUDA toolkit installed");
}

} // namespace
} // namespace dstk::gpu

namespace dstk::data {

void convert_fields_async(std::span<const FieldConversion>, std::uint32_t, void*) {
    gpu::no_cuda();
}

namespace kernels {
void gather_rows_async(void*, const void*, std::uint64_t, const std::uint64_t*, std::uint32_t, void*) {
    gpu::no_cuda();
}
void consume_async(const void*, std::uint64_t, unsigned long long*, void*) {
    gpu::no_cuda();
}
} // namespace kernels

} // namespace dstk::data

namespace dstk::gpu {

void set_device(int) {
    no_cuda();
}
void mem_info(int, std::uint64_t&, std::uint64_t&) {
    no_cuda();
}
std::string pci_bus_id(int) {
    no_cuda();
}

Buffer::Buffer(Memory, std::uint64_t) {
    no_cuda();
}
Buffer::~Buffer() = default;
Buffer::Buffer(Buffer&& o) noexcept : p_(o.p_), bytes_(o.bytes_), kind_(o.kind_) {}
Buffer& Buffer::operator=(Buffer&&) noexcept {
    return *this;
}
void Buffer::reset() noexcept {}

Stream::Stream() {
    no_cuda();
}
Stream::~Stream() = default;
Stream::Stream(Stream&&) noexcept {}
void Stream::synchronize() const {
    no_cuda();
}

Event::Event(bool) {
    no_cuda();
}
Event::~Event() = default;
Event::Event(Event&&) noexcept {}
void Event::record(void*) {
    no_cuda();
}
void Event::synchronize() const {
    no_cuda();
}
bool Event::done() const {
    no_cuda();
}
float Event::elapsed_ms(const Event&) const {
    no_cuda();
}

void synchronize(void*) {
    no_cuda();
}
void wait(void*, const Event&) {
    no_cuda();
}
void copy_h2d_async(void*, const void*, std::uint64_t, void*) {
    no_cuda();
}
void copy_h2d(void*, const void*, std::uint64_t) {
    no_cuda();
}
void copy_d2h(void*, const void*, std::uint64_t) {
    no_cuda();
}
void copy_d2d_async(void*, const void*, std::uint64_t, void*) {
    no_cuda();
}
void advise_host_preferred(const void*, std::uint64_t, int) {
    no_cuda();
}
void prefetch_to_device(const void*, std::uint64_t, int, void*) {
    no_cuda();
}

} // namespace dstk::gpu
