#pragma once
// What the backends share privately: constructors, the state blob, and the
// input conversion reference.
#include <array>
#include <cstdint>
#include <memory>
#include <span>
#include <vector>

#include "dstk/train/trainer.hpp"

namespace dstk::train {

std::unique_ptr<Trainer> make_cpu_trainer(const TrainerConfig& config);
#if defined(DSTK_HAVE_CUDA)
std::unique_ptr<Trainer> make_cuda_trainer(const TrainerConfig& config);
std::unique_ptr<BackendBuffer> make_cuda_buffer(int device, std::uint64_t bytes);
#endif

// Checks what both backends require of a config; usage errors otherwise.
void validate_config(const TrainerConfig& c);

// The fields a step reads, taken from a batch by the names the config gives
// them (batch_fields): the input, each head's target, the side input. Usage
// errors for a batch size outside 1..max_batch or a field of another dtype or
// shape.
inline constexpr std::size_t max_step_heads = 16;
// One field of the step's batch: its data and BatchField::rows (cuda, where
// the trainer reads rows; else null).
struct StepField {
    const void* data = nullptr;
    const std::uint64_t* rows = nullptr;
};
struct StepFields {
    StepField x;
    std::array<StepField, max_step_heads> targets{}; // per head, in the target's stored dtype
    StepField side;
    std::uint32_t size = 0;
};
StepFields step_fields(const TrainerConfig& c, const Batch& b);

struct StateView {
    std::span<const float> params, states, slots;
    std::uint64_t step = 0;
};
std::vector<std::uint8_t> pack_state(const StateView& s);
// Checks the blob against the expected sizes; returns the step, fills the spans.
std::uint64_t unpack_state(std::span<const std::uint8_t> blob, std::span<float> params, std::span<float> states,
                           std::span<float> slots);

// Dropout keep-mask bit for element `index` of layer `layer` at `step`: the same
// function on both backends (Philox), so masks agree.
std::uint64_t dropout_stream(std::uint64_t layer, std::uint64_t step);

} // namespace dstk::train
