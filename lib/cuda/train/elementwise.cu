// Bias, residual, copy, dropout, ReLU and tanh passes, and the fixed-order sum of
// per-block partials.
#include "elementwise.hpp"

#include <cstdlib>
#include <cstring>
#include <stdexcept>

#include "dstk/env.hpp"
#include "dstk/rng.hpp"

#include "launch_common.cuh"
#include "optimizer_update.cuh"
#include "partial_sums.cuh"

namespace dstk::train::cuda {
namespace {

template <class T>
__global__ void add_bias_kernel(T* y, const float* bias, std::uint64_t total, Channels ch, bool relu) {
    await_predecessor();
    const std::uint32_t c0 = first_channel(ch.c);
    GRID_LOOP(i, total) {
        const float v = ld(y, i) + bias[ch(i, c0)];
        st(y, i, relu ? fmaxf(v, 0.0f) : v);
    }
}

template <class T>
__global__ void bias_grad_kernel(const T* dy, float* db, std::uint64_t rows, std::uint32_t c, std::uint64_t hw,
                                 bool nchw) {
    await_predecessor();
    __shared__ double part[threads];
    const std::uint32_t ch = blockIdx.x;
    float acc = 0.0f;
    for (std::uint64_t r = threadIdx.x; r < rows; r += blockDim.x)
        acc += ld(dy, nchw ? ((r / hw) * c + ch) * hw + r % hw : r * c + ch);
    part[threadIdx.x] = acc;
    __syncthreads();
    for (int w = threads / 2; w > 0; w /= 2) {
        if (threadIdx.x < w) part[threadIdx.x] += part[threadIdx.x + w];
        __syncthreads();
    }
    if (threadIdx.x == 0) db[ch] = static_cast<float>(part[0]);
}

template <class T> __global__ void add_kernel(const T* a, const T* b, T* out, std::uint64_t count) {
    await_predecessor();
    GRID_LOOP(i, count) st(out, i, ld(a, i) + ld(b, i));
}

template <class T> __global__ void mul_mask_kernel(const T* dy, const float* mask, T* dx, std::uint64_t count) {
    await_predecessor();
    GRID_LOOP(i, count) st(dx, i, ld(dy, i) * mask[i]);
}

template <class T> __global__ void relu_kernel(const T* x, T* y, std::uint64_t count) {
    await_predecessor();
    GRID_LOOP(i, count) st(y, i, fmaxf(ld(x, i), 0.0f));
}

template <class T> __global__ void relu_backward_kernel(const T* y, const T* dy, T* dx, std::uint64_t count) {
    await_predecessor();
    GRID_LOOP(i, count) st(dx, i, ld(y, i) > 0.0f ? ld(dy, i) : 0.0f);
}

template <class T>
__global__ void dropout_kernel(const T* x, T* y, float* mask, std::uint64_t count, std::uint32_t channels,
                               std::uint64_t hw, bool nchw, float p, std::uint64_t seed, std::uint64_t layer,
                               const unsigned long long* step) {
    await_predecessor();
    const std::uint64_t stream = (layer << 40) ^ static_cast<std::uint64_t>(*step);
    const auto threshold = static_cast<std::uint32_t>(static_cast<double>(p) * 4294967296.0);
    const float scale = 1.0f / (1.0f - p);
    GRID_LOOP(i, count) {
        const std::uint64_t c = i % channels, pix = i / channels;
        const std::uint64_t j = nchw ? i : ((pix / hw) * channels + c) * hw + pix % hw; // the cpu backend's index
        const float m = philox(seed, stream, j)[0] >= threshold ? scale : 0.0f;
        mask[i] = m;
        st(y, i, ld(x, i) * m);
    }
}

template <class T> __global__ void tanh_kernel(const T* x, T* y, std::uint64_t count) {
    await_predecessor();
    GRID_LOOP(i, count) st(y, i, tanhf(ld(x, i)));
}

template <class T> __global__ void tanh_backward_kernel(const T* y, const T* dy, T* dx, std::uint64_t count) {
    await_predecessor();
    GRID_LOOP(i, count) {
        const float v = ld(y, i);
        st(dx, i, ld(dy, i) * (1.0f - v * v));
    }
}

// ---- partial sums ----

// Stores an output's sum: as float or bf16 at e, or through the map (and,
// with an update, UpdateC not void, updating parameter map[e] with it).
template <class UpdateC>
__device__ __forceinline__ void store_sum(double sum, std::uint64_t e, void* out, bool bf16_out,
                                          const std::uint32_t* map, const ParamUpdate& update) {
    if constexpr (!std::is_void_v<UpdateC>) {
        if (update.advance && e == 0) *update.advance += 1;
        const std::uint32_t i = map[e];
        if (i == ~0u) return;
        static_cast<float*>(out)[i] = static_cast<float>(sum);
        apply_update<UpdateC>(update, i, static_cast<float>(sum));
    } else if (map) {
        if (map[e] != ~0u) static_cast<float*>(out)[map[e]] = static_cast<float>(sum);
    } else if (bf16_out)
        static_cast<bf16*>(out)[e] = __float2bfloat16(static_cast<float>(sum));
    else
        static_cast<float*>(out)[e] = static_cast<float>(sum);
}

// out[e] = sum over blocks of partials[block][e] (partial_sums.cuh's order):
// 32 outputs per block of 1024 threads, each output's blocks in 32
// interleaved parts. For many blocks.
template <class UpdateC>
__global__ void __launch_bounds__(1024)
    sum_partials_kernel(const float* partials, unsigned blocks, std::uint64_t count, void* out, bool bf16_out,
                        const std::uint32_t* map, ParamUpdate update) {
    await_predecessor();
    __shared__ double parts[sum_parts][32];
    const unsigned el = threadIdx.x % 32, pt = threadIdx.x / 32;
    const std::uint64_t e = std::uint64_t{blockIdx.x} * 32 + el;
    const double own = e < count ? part_sum(partials, blocks, count, e, pt) : 0.0;
    parts[pt][el] = own;
    __syncthreads();
    if (pt != 0 || e >= count) return;
    store_sum<UpdateC>(add_parts(own, parts, el), e, out, bf16_out, map, update);
}

// The same sums for at most sum_parts blocks, one thread an output: each
// part is then one block, so adding the blocks in order gives the same bits.
// Where the kernel above would leave most of its threads without a block.
template <class UpdateC>
__global__ void sum_few_partials_kernel(const float* partials, unsigned blocks, std::uint64_t count, void* out,
                                        bool bf16_out, const std::uint32_t* map, ParamUpdate update) {
    await_predecessor();
    GRID_LOOP(e, count) {
        double sum = 0.0;
#pragma unroll 8
        for (unsigned b = 0; b < blocks; ++b) sum += partials[std::uint64_t{b} * count + e];
        store_sum<UpdateC>(sum, e, out, bf16_out, map, update);
    }
}

} // namespace

void launch_add_bias(void* y, ActType t, const float* bias, std::uint64_t n, std::uint32_t c, std::uint64_t hw,
                     bool nchw, cudaStream_t s, bool relu) {
    const std::uint64_t total = n * c * hw;
    const unsigned nt = channel_threads(c);
    const unsigned b = std::max(1u, blocks_for(total, 4) * threads / nt);
    dispatch(t, [&](auto tag) {
        using T = DSTK_T;
        launch_kernel(add_bias_kernel<T>, b, nt, 0, s, static_cast<T*>(y), bias, total,
                      channels_of(c, hw, nchw, nt, total), relu);
    });
}

void launch_bias_grad(const void* dy, ActType t, float* db, std::uint64_t n, std::uint32_t c, std::uint64_t hw,
                      bool nchw, cudaStream_t s) {
    dispatch(t, [&](auto tag) {
        using T = DSTK_T;
        launch_kernel(bias_grad_kernel<T>, c, threads, 0, s, static_cast<const T*>(dy), db, n * hw, c, hw, nchw);
    });
}

void launch_add(const void* a, const void* b, void* out, ActType t, std::uint64_t count, cudaStream_t s) {
    dispatch(t, [&](auto tag) {
        using T = DSTK_T;
        launch_kernel(add_kernel<T>, blocks_for(count, 4), threads, 0, s, static_cast<const T*>(a),
                      static_cast<const T*>(b), static_cast<T*>(out), count);
    });
}

void launch_copy(const void* a, void* out, ActType t, std::uint64_t count, cudaStream_t s) {
    CUDA_CHECK(cudaMemcpyAsync(out, a, count * act_bytes(t), cudaMemcpyDeviceToDevice, s));
}

void launch_dropout_forward(const void* x, void* y, float* mask, ActType t, std::uint64_t count, std::uint32_t channels,
                            std::uint64_t hw, bool nchw, float p, std::uint64_t seed, std::uint64_t layer,
                            const unsigned long long* step, cudaStream_t s) {
    dispatch(t, [&](auto tag) {
        using T = DSTK_T;
        launch_kernel(dropout_kernel<T>, blocks_for(count, 4), threads, 0, s, static_cast<const T*>(x),
                      static_cast<T*>(y), mask, count, channels, hw, nchw, p, seed, layer, step);
    });
}

void launch_mul_mask(const void* dy, const float* mask, void* dx, ActType t, std::uint64_t count, cudaStream_t s) {
    dispatch(t, [&](auto tag) {
        using T = DSTK_T;
        launch_kernel(mul_mask_kernel<T>, blocks_for(count, 4), threads, 0, s, static_cast<const T*>(dy), mask,
                      static_cast<T*>(dx), count);
    });
}

void launch_relu_forward(const void* x, void* y, ActType t, std::uint64_t count, cudaStream_t s) {
    dispatch(t, [&](auto tag) {
        using T = DSTK_T;
        launch_kernel(relu_kernel<T>, blocks_for(count, 4), threads, 0, s, static_cast<const T*>(x), static_cast<T*>(y),
                      count);
    });
}

void launch_relu_backward(const void* y, const void* dy, void* dx, ActType t, std::uint64_t count, cudaStream_t s) {
    dispatch(t, [&](auto tag) {
        using T = DSTK_T;
        launch_kernel(relu_backward_kernel<T>, blocks_for(count, 4), threads, 0, s, static_cast<const T*>(y),
                      static_cast<const T*>(dy), static_cast<T*>(dx), count);
    });
}

void launch_tanh_forward(const void* x, void* y, ActType t, std::uint64_t count, cudaStream_t s) {
    dispatch(t, [&](auto tag) {
        using T = DSTK_T;
        launch_kernel(tanh_kernel<T>, blocks_for(count, 4), threads, 0, s, static_cast<const T*>(x), static_cast<T*>(y),
                      count);
    });
}

void launch_tanh_backward(const void* y, const void* dy, void* dx, ActType t, std::uint64_t count, cudaStream_t s) {
    dispatch(t, [&](auto tag) {
        using T = DSTK_T;
        launch_kernel(tanh_backward_kernel<T>, blocks_for(count, 4), threads, 0, s, static_cast<const T*>(y),
                      static_cast<const T*>(dy), static_cast<T*>(dx), count);
    });
}

void launch_copy_rows(const void* src, std::uint64_t src_row, void* dst, std::uint64_t dst_row, std::uint64_t width,
                      std::uint64_t rows, ActType t, cudaStream_t s) {
    const std::uint64_t b = act_bytes(t);
    CUDA_CHECK(cudaMemcpy2DAsync(dst, dst_row * b, src, src_row * b, width * b, rows, cudaMemcpyDeviceToDevice, s));
}

void launch_sum_partials(const float* partials, unsigned blocks, std::uint64_t count, void* out, ActType out_t,
                         cudaStream_t s, const std::uint32_t* map, const ParamUpdate* update) {
    if (update && update->params && !map)
        throw std::logic_error("an update in the partial sums without the gradient vector's map");
    // One thread an output for at most sum_parts blocks and many outputs:
    // alone at batch 256, faster for weight gradients of 73,728 outputs and
    // more (a probe of both kernels). Used on every count, ref-cnn's step was
    // slower: most of its gradients have 864 to 36,864 outputs, too few
    // threads to fill the GPU, each adding its partials one after another.
    // DSTK_FEW_PARTIALS=0 (read at each launch, as DSTK_PDL) keeps the other
    // kernel for every count: the same bits, for comparison.
    constexpr std::uint64_t many_outputs = 65536;
    const bool few = blocks <= sum_parts && count >= many_outputs && !env_off("DSTK_FEW_PARTIALS");
    const unsigned grid = few ? blocks_for(count, 1) : static_cast<unsigned>((count + 31) / 32);
    const unsigned block = few ? threads : 32 * sum_parts;
    const auto go = [&](auto kernel, const ParamUpdate& u) {
        launch_kernel(kernel, grid, block, 0, s, partials, blocks, count, out, out_t == ActType::bf16, map, u);
    };
    if (!update || !update->params) {
        go(few ? sum_few_partials_kernel<void> : sum_partials_kernel<void>, ParamUpdate{});
        return;
    }
    dispatch(update->copy_t, [&](auto tag) {
        using T = DSTK_T;
        go(few ? sum_few_partials_kernel<T> : sum_partials_kernel<T>, *update);
    });
}

} // namespace dstk::train::cuda
