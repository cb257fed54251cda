#pragma once
// The cuda backend's memory of a Loader (loader.hpp): keep + 1 + ahead slots
// of device memory, one buffer per output field each; the loader's stream;
// per slot an event "converted" (ready) and an event on the consumer's stream
// "work enqueued before this batch was taken" (consumed); and the normalised
// fields' statistics in device memory. Shared with every batch a consumer
// holds, so that it outlives the loader while one is held.
#include <cstdint>
#include <memory>
#include <vector>

#include "dstk/data/loader.hpp"
#include "dstk/gpu_runtime.hpp"

namespace dstk::data {

class LoaderSlots {
  public:
    explicit LoaderSlots(unsigned count);
    ~LoaderSlots();
    // Buffers for batches of `batch` samples of every output, and the statistics.
    void allocate(std::uint32_t batch, const std::vector<FieldOutput>& outputs,
                  const std::vector<std::vector<float>>& inv_std);

    void* stream() const { return stream_.get(); }
    unsigned count() const { return count_; }
    void* field(unsigned slot, std::size_t f) const { return slots_[slot].fields[f].get(); }
    std::vector<void*> fields(unsigned slot) const;
    gpu::Event& ready(unsigned slot) { return slots_[slot].ready; }
    gpu::Event& consumed(unsigned slot) { return slots_[slot].consumed; }
    const float* mean(std::size_t f) const { return stats_[f].mean.as<float>(); }
    const float* inv_std(std::size_t f) const { return stats_[f].inv_std.as<float>(); }
    std::uint64_t bytes() const { return bytes_; }

  private:
    struct Slot {
        std::vector<gpu::Buffer> fields;
        gpu::Event ready, consumed;
    };
    struct Stats {
        gpu::Buffer mean, inv_std;
    };
    unsigned count_;
    gpu::Stream stream_;
    std::vector<Slot> slots_;
    std::vector<Stats> stats_; // per output field; empty buffers where not normalised
    std::uint64_t bytes_ = 0;
};

std::shared_ptr<LoaderSlots> make_device_slots(const Device& device, unsigned count);

} // namespace dstk::data
