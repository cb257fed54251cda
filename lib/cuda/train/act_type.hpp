#pragma once
// The stored type of activations and their gradients in dstrain's own
// kernels: float (fp32, tf32) or bf16; arithmetic is float throughout.
#include <cstdint>

namespace dstk::train::cuda {

enum class ActType : std::uint8_t { f32, bf16 };
inline std::uint64_t act_bytes(ActType t) {
    return t == ActType::bf16 ? 2 : 4;
}

} // namespace dstk::train::cuda
