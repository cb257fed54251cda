// The field conversion on the GPU (dstk/data/convert.hpp): one launch for
// every field of a batch, blockIdx.y picking the field; each value widened by
// the core's routine (dtype.hpp), as on the host.
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <climits>

#include "cuda_check.hpp"
#include "dstk/data/convert.hpp"
#include "dstk/widen.hpp"

namespace dstk::data {
namespace {

constexpr unsigned threads = 256;

struct FieldTable {
    FieldConversion f[max_conversions];
};

__global__ void convert_kernel(FieldTable table, std::uint32_t n) {
    const FieldConversion& f = table.f[blockIdx.y];
    const std::uint64_t count = n * f.per_sample;
    const std::uint64_t stride = f.stride ? f.stride : f.per_sample;
    for (std::uint64_t i = blockIdx.x * std::uint64_t{blockDim.x} + threadIdx.x; i < count;
         i += std::uint64_t{gridDim.x} * blockDim.x) {
        const std::uint64_t from = f.rows ? f.rows[i / f.per_sample] * f.per_sample + i % f.per_sample : i;
        switch (f.kind) {
        case FieldKind::stored:
            static_cast<std::uint8_t*>(f.dst)[i] = static_cast<const std::uint8_t*>(f.src)[from];
            break;
        case FieldKind::values:
            static_cast<float*>(f.dst)[i] = widen_float(f.src, f.dtype, from);
            break;
        case FieldKind::classes32: {
            const std::int64_t v = widen_int(f.src, f.dtype, from);
            static_cast<std::int32_t*>(f.dst)[i] = v >= 0 && v < INT_MAX ? static_cast<std::int32_t>(v) : -1;
            break;
        }
        case FieldKind::classes64:
            static_cast<std::int64_t*>(f.dst)[i] = widen_int(f.src, f.dtype, from);
            break;
        case FieldKind::normalised: {
            const std::uint64_t s = i / f.per_sample, e = i - s * f.per_sample, c = e / f.hw;
            const float v = (widen_float(f.src, f.dtype, from) - f.mean[c]) * f.inv_std[c];
            const std::uint64_t at = s * stride + f.offset + e;
            if (f.bf16)
                static_cast<__nv_bfloat16*>(f.dst)[at] = __float2bfloat16_rn(v);
            else
                static_cast<float*>(f.dst)[at] = v;
            break;
        }
        }
    }
}

} // namespace

void convert_fields_async(std::span<const FieldConversion> fields, std::uint32_t n, void* stream) {
    for (std::size_t first = 0; first < fields.size(); first += max_conversions) {
        const std::size_t count = std::min(max_conversions, fields.size() - first);
        FieldTable table{};
        std::uint64_t most = 1;
        for (std::size_t k = 0; k < count; ++k) {
            FieldConversion& f = table.f[k] = fields[first + k];
            if (f.kind == FieldKind::stored) { // copied byte by byte
                f.per_sample *= dtype_size(f.dtype);
                f.dtype = DType::u8;
            }
            most = std::max(most, std::uint64_t{n} * f.per_sample);
        }
        if (n == 0) return;
        // Four values a thread at least; the grid-stride loop covers the rest.
        const std::uint64_t blocks = std::min<std::uint64_t>((most + threads * 4 - 1) / (threads * 4), 65535u * 16);
        const dim3 grid(static_cast<unsigned>(blocks), static_cast<unsigned>(count));
        convert_kernel<<<grid, threads, 0, static_cast<cudaStream_t>(stream)>>>(table, n);
        CUDA_CHECK(cudaGetLastError());
    }
}

} // namespace dstk::data
