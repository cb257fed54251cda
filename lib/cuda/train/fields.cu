// Targets and side input to what the model reads, one launch for all fields:
// blockIdx.y picks the field.
#include "fields.hpp"

#include <stdexcept>

#include "launch_common.cuh"

namespace dstk::train::cuda {
namespace {

struct FieldTable {
    FieldConversion f[max_field_conversions];
};

__device__ __forceinline__ double load(const void* p, DType t, std::uint64_t i) {
    switch (t) {
    case DType::u8:
        return static_cast<const std::uint8_t*>(p)[i];
    case DType::i8:
        return static_cast<const std::int8_t*>(p)[i];
    case DType::u16:
        return static_cast<const std::uint16_t*>(p)[i];
    case DType::i16:
        return static_cast<const std::int16_t*>(p)[i];
    case DType::i32:
        return static_cast<const std::int32_t*>(p)[i];
    case DType::i64:
        return static_cast<double>(static_cast<const long long*>(p)[i]);
    case DType::f16:
        return __half2float(static_cast<const __half*>(p)[i]);
    case DType::bf16:
        return __bfloat162float(static_cast<const bf16*>(p)[i]);
    case DType::f32:
        return static_cast<const float*>(p)[i];
    case DType::f64:
        return static_cast<const double*>(p)[i];
    }
    return 0.0;
}

template <class T> __global__ void convert_fields_kernel(FieldTable table, std::uint32_t n) {
    const FieldConversion& f = table.f[blockIdx.y];
    GRID_LOOP(i, std::uint64_t{n} * f.per_sample) {
        const double v = load(f.src, f.dtype, i);
        switch (f.mode) {
        case FieldMode::classes:
            static_cast<std::int32_t*>(f.dst)[i] = v >= 0.0 && v < 2147483647.0 ? static_cast<std::int32_t>(v) : -1;
            break;
        case FieldMode::values:
            static_cast<float*>(f.dst)[i] = static_cast<float>(v);
            break;
        case FieldMode::normalised: {
            const std::uint64_t s = i / f.per_sample, e = i % f.per_sample, c = e / f.hw;
            st(static_cast<T*>(f.dst), s * f.stride + f.offset + e, (static_cast<float>(v) - f.mean[c]) * f.inv_std[c]);
            break;
        }
        }
    }
}

} // namespace

void launch_convert_fields(const FieldConversion* fields, int count, std::uint32_t n, ActType t, cudaStream_t s) {
    if (count == 0) return;
    if (count > max_field_conversions) throw std::logic_error("launch_convert_fields: too many fields");
    FieldTable table{};
    std::uint64_t most = 1;
    for (int i = 0; i < count; ++i) {
        table.f[i] = fields[i];
        most = std::max<std::uint64_t>(most, std::uint64_t{n} * fields[i].per_sample);
    }
    const dim3 grid(blocks_for(most, 4), static_cast<unsigned>(count));
    dispatch(t, [&](auto tag) {
        using T = DSTK_T;
        convert_fields_kernel<T><<<grid, threads, 0, s>>>(table, n);
    });
    check_launch();
}

} // namespace dstk::train::cuda
