// dsbench's GPU side in builds without CUDA; lib/cuda/bench/gpu_bench.cu replaces it.
#ifndef DSTK_HAVE_CUDA
#include "dstk/bench/gpu.hpp"
#include "dstk/error.hpp"
#include "dstk/gpu_info.hpp"

namespace dstk::bench {
namespace {
[[noreturn]] void no_cuda() {
    throw no_fit_error("GPU benchmarks unavailable (built without CUDA support); rebuild on a machine with CUDA");
}
} // namespace

struct TransferBench::Impl {};
struct GpuConvertBench::Impl {};

std::optional<std::string> gpu_unavailable() {
    return no_gpu_reason();
}

TransferBench::TransferBench(Transfer, std::uint64_t) {
    no_cuda();
}
TransferBench::~TransferBench() = default;
std::uint64_t TransferBench::ops_per_run() const {
    no_cuda();
}
void TransferBench::prepare() {
    no_cuda();
}
double TransferBench::run() {
    no_cuda();
}

GpuConvertBench::GpuConvertBench(DType, std::uint64_t) {
    no_cuda();
}
GpuConvertBench::~GpuConvertBench() = default;
double GpuConvertBench::run() {
    no_cuda();
}
std::vector<float> GpuConvertBench::results(std::uint64_t) const {
    no_cuda();
}
void GpuConvertBench::upload(const void*, std::uint64_t) {
    no_cuda();
}

} // namespace dstk::bench
#endif
