#pragma once
// The step's conversion of the batch fields beside the input (fields.cu): in
// one launch, every head's target (classes to int32, other targets to float)
// and the side input (normalised, into its columns of the side layer's
// output). Runs on the given stream.
#include <cuda_runtime.h>

#include <cstdint>

#include "act_type.hpp"
#include "dstk/dtype.hpp"

namespace dstk::train::cuda {

enum class FieldMode : std::uint8_t {
    classes,    // int32 (a value outside int32: -1, which the loss counts as a bad label)
    values,     // float
    normalised, // (x - mean[c]) * inv_std[c] in the activation type, at dst[s * stride + offset + i]
};

struct FieldConversion {
    const void* src = nullptr;
    DType dtype = DType::f32;
    std::uint32_t per_sample = 0;
    void* dst = nullptr;
    FieldMode mode = FieldMode::values;
    std::uint32_t stride = 0, offset = 0;            // normalised
    const float *mean = nullptr, *inv_std = nullptr; // normalised
    std::uint32_t hw = 1;                            // normalised: values per channel
};

inline constexpr int max_field_conversions = 17;

void launch_convert_fields(const FieldConversion* fields, int count, std::uint32_t n, ActType t, cudaStream_t s);

} // namespace dstk::train::cuda
