// dsbench's GPU side: host-to-device transfers and dtype conversion kernels,
// timed with CUDA events on one stream.
#include <cuda_runtime.h>

#include <algorithm>
#include <cstring>
#include <string>

#include "cuda_check.hpp"
#include "dstk/bench/gpu.hpp"
#include "dstk/error.hpp"
#include "dstk/gpu_info.hpp"
#include "train/input_layout.hpp"

namespace dstk::bench {
namespace {

// Small transfers are repeated so that a timed run moves at least this much.
constexpr std::uint64_t bytes_per_run = 256ull << 20;
constexpr std::uint64_t max_ops_per_run = 4096;

// Reads every 16-byte word of `src`; the sum is stored only when it matches
// an impossible value, so the loads cannot be optimised away.
__global__ void read_kernel(const uint4* __restrict__ src, std::uint64_t words, unsigned* sink) {
    unsigned acc = 0;
    for (std::uint64_t i = blockIdx.x * std::uint64_t(blockDim.x) + threadIdx.x; i < words;
         i += std::uint64_t(gridDim.x) * blockDim.x) {
        const uint4 v = src[i];
        acc ^= v.x ^ v.y ^ v.z ^ v.w;
    }
    if (acc == 0x9E3779B9u) *sink = acc;
}

int grid_for(std::uint64_t items, int block) {
    int device = 0, sms = 1;
    cudaGetDevice(&device);
    cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device);
    const std::uint64_t needed = (items + block - 1) / block;
    return int(std::max<std::uint64_t>(1, std::min<std::uint64_t>(needed, std::uint64_t(sms) * 8)));
}

struct Timing {
    cudaStream_t stream = nullptr;
    cudaEvent_t start = nullptr, stop = nullptr;
    Timing() {
        CUDA_CHECK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
        CUDA_CHECK(cudaEventCreate(&start));
        CUDA_CHECK(cudaEventCreate(&stop));
    }
    ~Timing() {
        if (stop) cudaEventDestroy(stop);
        if (start) cudaEventDestroy(start);
        if (stream) cudaStreamDestroy(stream);
    }
    double seconds() {
        CUDA_CHECK(cudaEventSynchronize(stop));
        float ms = 0;
        CUDA_CHECK(cudaEventElapsedTime(&ms, start, stop));
        return ms / 1e3;
    }
};

cudaMemLocation host_location() {
    cudaMemLocation loc{};
    loc.type = cudaMemLocationTypeHost;
    loc.id = 0;
    return loc;
}

cudaMemLocation device_location(int device) {
    cudaMemLocation loc{};
    loc.type = cudaMemLocationTypeDevice;
    loc.id = device;
    return loc;
}

} // namespace

std::optional<std::string> gpu_unavailable() {
    return no_gpu_reason();
}

struct TransferBench::Impl {
    Transfer kind;
    std::uint64_t bytes, ops;
    int device = 0;
    Timing timing;
    void* host = nullptr;    // pageable (malloc) or pinned (cudaHostAlloc) source
    void* managed = nullptr; // managed source
    void* device_buf = nullptr;
    unsigned* sink = nullptr;

    ~Impl() {
        if (kind == Transfer::pageable)
            std::free(host);
        else if (host)
            cudaFreeHost(host);
        if (managed) cudaFree(managed);
        if (device_buf) cudaFree(device_buf);
        if (sink) cudaFree(sink);
    }

    void read_on_gpu(const void* src) {
        const std::uint64_t words = bytes / 16;
        const int block = 256;
        read_kernel<<<grid_for(words, block), block, 0, timing.stream>>>(static_cast<const uint4*>(src), words, sink);
        CUDA_CHECK(cudaGetLastError());
    }
};

TransferBench::TransferBench(Transfer kind, std::uint64_t bytes) : impl_(std::make_unique<Impl>()) {
    Impl& b = *impl_;
    b.kind = kind;
    b.bytes = std::max<std::uint64_t>(16, bytes / 16 * 16);
    // Managed and mapped cases go through one kernel or prefetch per run; copies are repeated.
    const bool copy = kind == Transfer::pageable || kind == Transfer::pinned;
    b.ops = copy ? std::clamp<std::uint64_t>(bytes_per_run / b.bytes, 1, max_ops_per_run) : 1;
    CUDA_CHECK(cudaGetDevice(&b.device));
    std::size_t free_b = 0, total_b = 0;
    CUDA_CHECK(cudaMemGetInfo(&free_b, &total_b));
    if (transfer_is_managed(kind) && b.bytes > free_b / 4)
        throw no_fit_error("managed allocation of " + std::to_string(b.bytes) +
                           " bytes would exceed a quarter of the GPU's free memory (" + std::to_string(free_b) +
                           " bytes)");
    CUDA_CHECK(cudaMalloc(&b.sink, sizeof(unsigned)));
    switch (kind) {
    case Transfer::pageable:
        b.host = std::malloc(b.bytes);
        if (!b.host) throw std::bad_alloc();
        std::memset(b.host, 1, b.bytes);
        CUDA_CHECK(cudaMalloc(&b.device_buf, b.bytes));
        break;
    case Transfer::pinned:
        CUDA_CHECK(cudaHostAlloc(&b.host, b.bytes, cudaHostAllocDefault));
        std::memset(b.host, 1, b.bytes);
        CUDA_CHECK(cudaMalloc(&b.device_buf, b.bytes));
        break;
    case Transfer::zero_copy:
        CUDA_CHECK(cudaHostAlloc(&b.host, b.bytes, cudaHostAllocMapped));
        std::memset(b.host, 1, b.bytes);
        break;
    case Transfer::managed_fault:
    case Transfer::managed_prefetch:
    case Transfer::managed_accessed_by: {
        int managed_ok = 0;
        CUDA_CHECK(cudaDeviceGetAttribute(&managed_ok, cudaDevAttrConcurrentManagedAccess, b.device));
        if (!managed_ok)
            throw no_fit_error("this GPU or driver has no concurrent managed access (needed to time managed "
                               "memory page by page)");
        CUDA_CHECK(cudaMallocManaged(&b.managed, b.bytes));
        std::memset(b.managed, 1, b.bytes); // first touch on the host: the pages start there
        if (kind == Transfer::managed_accessed_by) {
            CUDA_CHECK(cudaMemAdvise(b.managed, b.bytes, cudaMemAdviseSetPreferredLocation, host_location()));
            CUDA_CHECK(cudaMemAdvise(b.managed, b.bytes, cudaMemAdviseSetAccessedBy, device_location(b.device)));
        }
        break;
    }
    }
}

TransferBench::~TransferBench() = default;

std::uint64_t TransferBench::ops_per_run() const {
    return impl_->ops;
}

void TransferBench::prepare() {
    Impl& b = *impl_;
    if (b.kind == Transfer::managed_fault || b.kind == Transfer::managed_prefetch) {
        // Put every page back on the host, so the timed run migrates all of them.
        CUDA_CHECK(cudaMemPrefetchAsync(b.managed, b.bytes, host_location(), 0, b.timing.stream));
        CUDA_CHECK(cudaStreamSynchronize(b.timing.stream));
    }
}

double TransferBench::run() {
    Impl& b = *impl_;
    Timing& t = b.timing;
    CUDA_CHECK(cudaEventRecord(t.start, t.stream));
    switch (b.kind) {
    case Transfer::pageable:
    case Transfer::pinned:
        for (std::uint64_t i = 0; i < b.ops; ++i)
            CUDA_CHECK(cudaMemcpyAsync(b.device_buf, b.host, b.bytes, cudaMemcpyHostToDevice, t.stream));
        break;
    case Transfer::zero_copy: {
        void* dev = nullptr;
        CUDA_CHECK(cudaHostGetDevicePointer(&dev, b.host, 0));
        b.read_on_gpu(dev);
        break;
    }
    case Transfer::managed_fault:
    case Transfer::managed_accessed_by:
        b.read_on_gpu(b.managed);
        break;
    case Transfer::managed_prefetch:
        CUDA_CHECK(cudaMemPrefetchAsync(b.managed, b.bytes, device_location(b.device), 0, t.stream));
        break;
    }
    CUDA_CHECK(cudaEventRecord(t.stop, t.stream));
    return t.seconds();
}

// dstrain's input conversion (train/input_layout.cu) as dstrain's fp32 runs
// call it (NCHW float output), on rows of a CIFAR-sized sample of one channel,
// with mean 0 and std 1 so that the output is the plain conversion.
constexpr std::uint64_t convert_row = 3072;

struct GpuConvertBench::Impl {
    DType from;
    std::uint64_t elements;
    Timing timing;
    void* in = nullptr;
    float* out = nullptr;
    float* mean_std = nullptr;      // {0, 1}
    std::int32_t* labels = nullptr; // labels in, then out, one per row
    ~Impl() {
        if (in) cudaFree(in);
        if (out) cudaFree(out);
        if (mean_std) cudaFree(mean_std);
        if (labels) cudaFree(labels);
    }
    std::uint64_t rows() const { return (elements + convert_row - 1) / convert_row; }
};

GpuConvertBench::GpuConvertBench(DType from, std::uint64_t elements) : impl_(std::make_unique<Impl>()) {
    if (from != DType::u8 && from != DType::bf16 && from != DType::f16)
        throw usage_error("GPU conversion from " + std::string(dtype_name(from)) +
                          " is not benchmarked (u8, bf16, f16)");
    Impl& b = *impl_;
    b.from = from;
    b.elements = elements;
    CUDA_CHECK(cudaMalloc(&b.in, elements * dtype_size(from)));
    CUDA_CHECK(cudaMalloc(&b.out, elements * sizeof(float)));
    CUDA_CHECK(cudaMemset(b.in, 0, elements * dtype_size(from)));
    const float mean_std[2] = {0.0f, 1.0f};
    CUDA_CHECK(cudaMalloc(&b.mean_std, sizeof mean_std));
    CUDA_CHECK(cudaMemcpy(b.mean_std, mean_std, sizeof mean_std, cudaMemcpyHostToDevice));
    CUDA_CHECK(cudaMalloc(&b.labels, 2 * b.rows() * sizeof(std::int32_t)));
    CUDA_CHECK(cudaMemset(b.labels, 0, 2 * b.rows() * sizeof(std::int32_t)));
}

GpuConvertBench::~GpuConvertBench() = default;

void GpuConvertBench::upload(const void* src, std::uint64_t elements) {
    Impl& b = *impl_;
    CUDA_CHECK(cudaMemcpy(b.in, src, std::min(elements, b.elements) * dtype_size(b.from), cudaMemcpyHostToDevice));
}

double GpuConvertBench::run() {
    Impl& b = *impl_;
    Timing& t = b.timing;
    const std::uint64_t rows = b.elements / convert_row, rest = b.elements % convert_row;
    CUDA_CHECK(cudaEventRecord(t.start, t.stream));
    auto convert = [&](std::uint64_t first_row, std::uint64_t n, std::uint64_t hw) {
        const std::uint64_t at = first_row * convert_row;
        train::cuda::launch_convert_input({static_cast<const char*>(b.in) + at * dtype_size(b.from), nullptr, b.from},
                                          b.labels, static_cast<std::uint32_t>(n), 1, hw, b.mean_std, b.mean_std + 1,
                                          b.out + at, train::cuda::ActType::f32, true, 1, b.labels + b.rows(),
                                          t.stream);
    };
    if (rows > 0) convert(0, rows, convert_row);
    if (rest > 0) convert(rows, 1, rest);
    CUDA_CHECK(cudaEventRecord(t.stop, t.stream));
    return t.seconds();
}

std::vector<float> GpuConvertBench::results(std::uint64_t n) const {
    n = std::min(n, impl_->elements);
    std::vector<float> v(n);
    CUDA_CHECK(cudaMemcpy(v.data(), impl_->out, n * sizeof(float), cudaMemcpyDeviceToHost));
    return v;
}

} // namespace dstk::bench
