#pragma once
// The GPU side of dsbench: host-to-device transfers and dtype conversion
// kernels, timed with CUDA events (lib/cuda/bench/gpu_bench.cu). Builds
// without CUDA get versions whose constructors throw Error(no_fit) saying so;
// the cases waive themselves first through gpu_unavailable().
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "dstk/dtype.hpp"

namespace dstk::bench {

// Why no GPU case can run (built without CUDA, no visible GPU), or nullopt.
std::optional<std::string> gpu_unavailable();

enum class Transfer {
    pageable,            // cudaMemcpyAsync from malloc'ed memory
    pinned,              // cudaMemcpyAsync from cudaHostAlloc'ed memory
    managed_fault,       // a kernel reads managed memory resident on the host: on-demand page faults
    managed_prefetch,    // cudaMemPrefetchAsync of host-resident managed memory to the GPU
    managed_accessed_by, // a kernel reads managed memory advised PreferredLocation=CPU + AccessedBy=GPU
    zero_copy,           // a kernel reads mapped pinned host memory
};
std::string_view transfer_name(Transfer t); // "pageable", "pinned", "managed.fault", ...
bool transfer_is_managed(Transfer t);

// One transfer kind at one size. `bytes` per operation; each timed run moves
// `ops_per_run()` operations (small transfers are repeated so that one run
// lasts long enough for event timing). Managed allocations are refused
// (Error(no_fit)) above a quarter of the GPU's free memory.
class TransferBench {
  public:
    TransferBench(Transfer kind, std::uint64_t bytes);
    ~TransferBench();
    TransferBench(const TransferBench&) = delete;
    TransferBench& operator=(const TransferBench&) = delete;

    std::uint64_t ops_per_run() const;
    // Untimed: puts managed memory back on the host before a timed run.
    void prepare();
    // Seconds for ops_per_run() transfers, measured with CUDA events.
    double run();

  private:
    struct Impl;
    std::unique_ptr<Impl> impl_;
};

// Element-wise conversion of `elements` values of `from` (u8, bf16, f16) to
// f32 in device memory.
class GpuConvertBench {
  public:
    GpuConvertBench(DType from, std::uint64_t elements);
    ~GpuConvertBench();
    GpuConvertBench(const GpuConvertBench&) = delete;
    GpuConvertBench& operator=(const GpuConvertBench&) = delete;

    double run(); // seconds, CUDA events
    // The first `n` converted values, copied back (for tests against the CPU conversion).
    std::vector<float> results(std::uint64_t n) const;
    void upload(const void* src, std::uint64_t elements); // replaces the input's first `elements` values

  private:
    struct Impl;
    std::unique_ptr<Impl> impl_;
};

} // namespace dstk::bench
