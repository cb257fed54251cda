#pragma once
// Launchers of the element-wise passes (elementwise.cu). Activations and their gradients are NHWC (channels last) or,
// where `nchw` says so, NCHW; stored as float or bf16 (ActType); arithmetic is float. Everything runs on the given
// stream and is safe to capture in a graph. No kernel here adds floats with atomics: reductions go through per-block
// partials summed in a fixed order, so results do not depend on scheduling.
#include <cuda_runtime.h>

#include <cstdint>

#include "act_type.hpp"
#include "optimizer_step.hpp"

namespace dstk::train::cuda {

// y[n][hw][c] += bias[c] (feature rows: hw = 1)
// relu: y = max(y + bias, 0) in the same pass.
void launch_add_bias(void* y, ActType t, const float* bias, std::uint64_t n, std::uint32_t c, std::uint64_t hw,
                     bool nchw, cudaStream_t s, bool relu = false);
// db[c] = sum over n, hw of dy
void launch_bias_grad(const void* dy, ActType t, float* db, std::uint64_t n, std::uint32_t c, std::uint64_t hw,
                      bool nchw, cudaStream_t s);
void launch_add(const void* a, const void* b, void* out, ActType t, std::uint64_t count, cudaStream_t s);
void launch_copy(const void* a, void* out, ActType t, std::uint64_t count, cudaStream_t s);
// Dropout with the same Philox mask as the cpu backend, indexed by the NCHW
// element: keep where philox(seed, stream(layer, step), i)[0] >= p * 2^32,
// scaled by 1/(1-p). The float mask is kept for the backward pass.
void launch_dropout_forward(const void* x, void* y, float* mask, ActType t, std::uint64_t count, std::uint32_t channels,
                            std::uint64_t hw, bool nchw, float p, std::uint64_t seed, std::uint64_t layer,
                            const unsigned long long* step, cudaStream_t s);
void launch_mul_mask(const void* dy, const float* mask, void* dx, ActType t, std::uint64_t count, cudaStream_t s);
void launch_relu_forward(const void* x, void* y, ActType t, std::uint64_t count, cudaStream_t s);
// dx = y > 0 ? dy : 0 (y: the ReLU's output)
void launch_relu_backward(const void* y, const void* dy, void* dx, ActType t, std::uint64_t count, cudaStream_t s);

void launch_tanh_forward(const void* x, void* y, ActType t, std::uint64_t count, cudaStream_t s);
// dx = dy (1 - y^2) (y: the tanh's output)
void launch_tanh_backward(const void* y, const void* dy, void* dx, ActType t, std::uint64_t count, cudaStream_t s);
// rows x width elements from rows of src_row elements into rows of dst_row
// (the side input's join: the trunk's features into the first columns, and
// their gradient back).
void launch_copy_rows(const void* src, std::uint64_t src_row, void* dst, std::uint64_t dst_row, std::uint64_t width,
                      std::uint64_t rows, ActType t, cudaStream_t s);

// out[e] = sum over blocks b of partials[b * count + e], in block order (the
// second pass of the convolution weight gradients' fixed-order reductions),
// stored as float or bf16; with map, as float at out[map[e]] (none where
// map[e] == ~0u): straight into the gradient vector's order. With an
// update (and a map: out is then the whole gradient vector), each parameter
// map[e] is updated as its gradient is stored (optimizer_step.hpp).
void launch_sum_partials(const float* partials, unsigned blocks, std::uint64_t count, void* out, ActType out_t,
                         cudaStream_t s, const std::uint32_t* map = nullptr, const ParamUpdate* update = nullptr);

} // namespace dstk::train::cuda
