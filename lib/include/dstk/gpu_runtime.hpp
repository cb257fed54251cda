#pragma once
// The CUDA runtime behind one plain interface (no CUDA types: a stream is a
// void* cudaStream_t): owners of GPU memory, streams and events that free
// what they hold, and the calls the host code makes between them. Defined in
// lib/cuda/runtime.cpp; in a build without CUDA, lib/cuda/runtime_none.cpp
// defines the same interface, and everything that would reach the GPU throws
// a no_fit_error (exit 3) saying that this build has no CUDA support. Host
// code therefore never asks whether CUDA was built: it asks
// built_with_cuda() (gpu_info.hpp) where it chooses a device, and otherwise
// just calls. Errors of the runtime throw dstk::Error naming the call.
#include <cstdint>
#include <string>

namespace dstk::gpu {

void set_device(int device);
void mem_info(int device, std::uint64_t& free_bytes, std::uint64_t& total_bytes);
std::string pci_bus_id(int device); // "0000:65:00.0": the device as NVML knows it

enum class Memory : std::uint8_t {
    device,  // cudaMalloc
    pinned,  // cudaHostAlloc (portable)
    managed, // cudaMallocManaged (global)
};

// `bytes` of one kind of memory, freed with the Buffer. A device allocation
// the GPU cannot hold is a no_fit_error (exit 3).
class Buffer {
  public:
    Buffer() = default;
    Buffer(Memory kind, std::uint64_t bytes);
    ~Buffer();
    Buffer(Buffer&& o) noexcept;
    Buffer& operator=(Buffer&& o) noexcept;
    Buffer(const Buffer&) = delete;
    Buffer& operator=(const Buffer&) = delete;

    void* get() const { return p_; }
    template <typename T> T* as() const { return static_cast<T*>(p_); }
    std::uint64_t bytes() const { return bytes_; }

  private:
    void reset() noexcept;
    void* p_ = nullptr;
    std::uint64_t bytes_ = 0;
    Memory kind_ = Memory::device;
};

// A non-blocking stream, destroyed with the Stream (after its work is done).
class Stream {
  public:
    Stream();
    ~Stream();
    Stream(Stream&& o) noexcept;
    Stream& operator=(Stream&&) = delete;
    Stream(const Stream&) = delete;
    Stream& operator=(const Stream&) = delete;

    void* get() const { return s_; }
    void synchronize() const;

  private:
    void* s_ = nullptr;
};

class Event {
  public:
    // timing: the event can be timed against another (elapsed_ms).
    explicit Event(bool timing = false);
    ~Event();
    Event(Event&& o) noexcept;
    Event& operator=(Event&&) = delete;
    Event(const Event&) = delete;
    Event& operator=(const Event&) = delete;

    void* get() const { return e_; }
    void record(void* stream);
    void synchronize() const;
    bool done() const; // the work before record() has finished
    // Milliseconds from `start` to this event (both timing events, both done).
    float elapsed_ms(const Event& start) const;

  private:
    void* e_ = nullptr;
};

// Any stream, the caller's included (a trainer's, PyTorch's).
void synchronize(void* stream);
void wait(void* stream, const Event& e); // work enqueued on `stream` after this waits for `e`

void copy_h2d_async(void* dst, const void* src, std::uint64_t bytes, void* stream);
void copy_h2d(void* dst, const void* src, std::uint64_t bytes);
void copy_d2h(void* dst, const void* src, std::uint64_t bytes); // synchronous (tests, inspection)
void copy_d2d_async(void* dst, const void* src, std::uint64_t bytes, void* stream);

// Managed memory placement (CUDA 13: cudaMemLocation).
void advise_host_preferred(const void* p, std::uint64_t bytes, int device); // PreferredLocation=CPU, AccessedBy=GPU
void prefetch_to_device(const void* p, std::uint64_t bytes, int device, void* stream);

} // namespace dstk::gpu
