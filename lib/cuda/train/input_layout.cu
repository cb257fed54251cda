// The input conversion (stored samples to normalised activations), layout
// changes and the weights' compute copies.
#include "input_layout.hpp"

#include <algorithm>
#include <stdexcept>

#include "device_common.cuh"
#include "launch_common.cuh"

namespace dstk::train::cuda {
namespace {

// Four consecutive elements from index i (a multiple of 4) in one store.
template <class T> __device__ __forceinline__ void store4(T* p, std::uint64_t i, const float (&v)[4]) {
    using Word = std::conditional_t<sizeof(T) == 4, uint4, uint2>;
    Word q;
    T* e = reinterpret_cast<T*>(&q);
#pragma unroll
    for (int k = 0; k < 4; ++k) st(e, k, v[k]);
    *reinterpret_cast<Word*>(p + i) = q;
}

template <class In, class T>
__global__ void convert_kernel(const In* x, const std::uint64_t* rows, const std::int32_t* labels, std::uint32_t n,
                               std::uint32_t channels, Channels ch, const float* mean, const float* inv_std, T* out,
                               std::int32_t* labels_out, std::uint32_t out_channels) {
    const std::uint64_t hw = ch.hw;
    if (ch.nchw) {
        const std::uint64_t per = std::uint64_t{channels} * hw;
        GRID_LOOP(i, std::uint64_t{n} * per) {
            if (labels_out && i < n) labels_out[i] = labels[row_of(rows, i)];
            const std::uint32_t c = ch(i, 0);
            const std::uint64_t at = row_of(rows, i / per) * per + i % per;
            st(out, i, normalised(x, at, c, mean, inv_std));
        }
        return;
    }
    // One thread per pixel of the NHWC output (channels zero-padded to
    // out_channels); the stored sample is CHW. Where out_channels is a
    // multiple of 4 (bf16 pads images to 8), they go out four to a vector
    // store: element-sized stores, strided by the pixel's width across a
    // warp, left this pass bound by store instructions.
    GRID_LOOP(pix, std::uint64_t{n} * hw) {
        if (labels_out && pix < n) labels_out[pix] = labels[row_of(rows, pix)];
        const std::uint64_t s = ch.narrow ? ch.dhw.div(static_cast<std::uint32_t>(pix)) : pix / hw, j = pix - s * hw;
        const std::uint64_t row = row_of(rows, s);
        auto value = [&](std::uint32_t c) {
            return c < channels ? normalised(x, (row * channels + c) * hw + j, c, mean, inv_std) : 0.0f;
        };
        if (out_channels % 4 == 0) {
            for (std::uint32_t c = 0; c < out_channels; c += 4) {
                const float v[4] = {value(c), value(c + 1), value(c + 2), value(c + 3)};
                store4(out, pix * out_channels + c, v);
            }
            continue;
        }
        for (std::uint32_t c = 0; c < out_channels; ++c) st(out, pix * out_channels + c, value(c));
    }
}

// ---- layouts and weight copies ----

// A batched transpose, out[n][a][b] = in[n][b][a] with a < rows, b < cols:
// NHWC to NCHW is rows = C, cols = HW; NCHW to NHWC is rows = HW, cols = C.
// Through a shared tile of 32 x 32, so that both the reads (along a) and the
// writes (along b) are coalesced; blockIdx.z walks the batch.
constexpr unsigned tile = 32, tile_rows = 8;
template <class T>
__global__ void transpose_kernel(const T* in, T* out, std::uint64_t batch, std::uint32_t rows, std::uint32_t cols) {
    __shared__ T t[tile][tile + 1];
    const std::uint32_t a0 = blockIdx.y * tile, b0 = blockIdx.x * tile;
    for (std::uint64_t n = blockIdx.z; n < batch; n += gridDim.z) {
        const T* src = in + n * rows * cols;
        T* dst = out + n * rows * cols;
        for (std::uint32_t k = threadIdx.y; k < tile; k += tile_rows) {
            const std::uint32_t a = a0 + threadIdx.x, b = b0 + k;
            if (a < rows && b < cols) t[k][threadIdx.x] = src[std::uint64_t{b} * rows + a];
        }
        __syncthreads();
        for (std::uint32_t k = threadIdx.y; k < tile; k += tile_rows) {
            const std::uint32_t a = a0 + k, b = b0 + threadIdx.x;
            if (a < rows && b < cols) dst[std::uint64_t{a} * cols + b] = t[threadIdx.x][k];
        }
        __syncthreads();
    }
}

void launch_transpose(const void* in, void* out, ActType t, std::uint64_t batch, std::uint32_t rows, std::uint32_t cols,
                      cudaStream_t s) {
    if (batch == 0 || rows == 0 || cols == 0) return;
    const dim3 grid((cols + tile - 1) / tile, (rows + tile - 1) / tile,
                    static_cast<unsigned>(std::min<std::uint64_t>(batch, 65535)));
    dispatch(t, [&](auto tag) {
        using T = DSTK_T;
        plain_launch(transpose_kernel<T>, grid, dim3(tile, tile_rows), 0, s, static_cast<const T*>(in),
                     static_cast<T*>(out), batch, rows, cols);
    });
}

template <class T>
__global__ void gather_kernel(const float* params, const std::uint32_t* map, T* copy, std::uint64_t count) {
    GRID_LOOP(i, count) st(copy, i, map[i] == ~0u ? 0.0f : params[map[i]]);
}

template <class T>
__global__ void scatter_kernel(const T* gcopy, const std::uint32_t* map, float* grads, std::uint64_t count) {
    GRID_LOOP(i, count) if (map[i] != ~0u) grads[map[i]] = ld(gcopy, i);
}

// One filter a block at a time: its gradient's [rs][c] rows (read along c)
// into shared memory as [c][rs], then out along the whole filter. Stored one
// element at a time through the map, consecutive elements land 4 * rs bytes
// apart in the gradient vector, each in a sector of its own. (rs odd: the
// shared stores of consecutive c then hit different banks.)
template <class T>
__global__ void scatter_filters_kernel(const T* gcopy, float* grads, unsigned filters, unsigned c, Div32 dc,
                                       unsigned rs) {
    extern __shared__ float filter[];
    const unsigned per = c * rs;
    for (unsigned k = blockIdx.x; k < filters; k += gridDim.x) {
        const T* src = gcopy + std::uint64_t{k} * per;
        for (unsigned e = threadIdx.x; e < per; e += blockDim.x) {
            const unsigned j = dc.div(e);
            filter[(e - j * c) * rs + j] = ld(src, e);
        }
        __syncthreads();
        float* dst = grads + std::uint64_t{k} * per;
        for (unsigned e = threadIdx.x; e < per; e += blockDim.x) dst[e] = filter[e];
        __syncthreads();
    }
}

} // namespace

void launch_convert_input(const StoredSamples& x, const std::int32_t* labels, std::uint32_t n, std::uint32_t channels,
                          std::uint64_t hw, const float* mean, const float* inv_std, void* out, ActType t, bool nchw,
                          std::uint32_t out_channels, std::int32_t* labels_out, cudaStream_t s) {
    const unsigned b = blocks_for(std::uint64_t{n} * (nchw ? out_channels : 1) * hw, nchw ? 4 : 1);
    // NCHW: the channel of each element; NHWC: the sample of each pixel.
    const Channels ch = channels_of(channels, hw, nchw, 0, std::uint64_t{n} * out_channels * hw);
    dispatch(t, [&](auto tag) {
        using T = DSTK_T;
        auto go = [&](auto in) {
            using In = std::remove_const_t<std::remove_pointer_t<decltype(in)>>;
            plain_launch(convert_kernel<In, T>, b, threads, 0, s, static_cast<const In*>(x.x), x.rows, labels, n,
                         channels, ch, mean, inv_std, static_cast<T*>(out), labels_out, out_channels);
        };
        switch (x.dtype) {
        case DType::u8:
            go(static_cast<const std::uint8_t*>(nullptr));
            break;
        case DType::i8:
            go(static_cast<const std::int8_t*>(nullptr));
            break;
        case DType::bf16:
            go(static_cast<const bf16*>(nullptr));
            break;
        case DType::f16:
            go(static_cast<const __half*>(nullptr));
            break;
        default:
            go(static_cast<const float*>(nullptr));
            break;
        }
    });
}

void launch_nhwc_to_nchw(const void* in, void* out, ActType t, std::uint64_t n, std::uint32_t c, std::uint64_t hw,
                         cudaStream_t s) {
    launch_transpose(in, out, t, n, c, static_cast<std::uint32_t>(hw), s);
}

void launch_nchw_to_nhwc(const void* in, void* out, ActType t, std::uint64_t n, std::uint32_t c, std::uint64_t hw,
                         cudaStream_t s) {
    launch_transpose(in, out, t, n, static_cast<std::uint32_t>(hw), c, s);
}

void launch_gather_weights(const float* params, const std::uint32_t* map, void* copy, ActType t, std::uint64_t count,
                           cudaStream_t s) {
    if (count == 0) return;
    dispatch(t, [&](auto tag) {
        using T = DSTK_T;
        plain_launch(gather_kernel<T>, blocks_for(count, 4), threads, 0, s, params, map, static_cast<T*>(copy), count);
    });
}

void launch_scatter_grads(const void* gcopy, ActType t, const std::uint32_t* map, float* grads, std::uint64_t count,
                          cudaStream_t s) {
    if (count == 0) return;
    dispatch(t, [&](auto tag) {
        using T = DSTK_T;
        plain_launch(scatter_kernel<T>, blocks_for(count, 4), threads, 0, s, static_cast<const T*>(gcopy), map, grads,
                     count);
    });
}

bool filter_scatter_fits(std::uint32_t c, std::uint32_t rs) {
    return c > 0 && rs % 2 == 1 && std::uint64_t{c} * rs * sizeof(float) <= filter_scatter_max_shared;
}

void launch_scatter_filter_grads(const void* gcopy, ActType t, float* grads, std::uint32_t filters, std::uint32_t c,
                                 std::uint32_t rs, cudaStream_t s) {
    if (filters == 0) return;
    if (!filter_scatter_fits(c, rs)) throw std::invalid_argument("launch_scatter_filter_grads: a filter too large");
    const std::uint64_t shared = std::uint64_t{c} * rs * sizeof(float);
    const unsigned grid = std::min(filters, sm_count() * 8);
    dispatch(t, [&](auto tag) {
        using T = DSTK_T;
        plain_launch(scatter_filters_kernel<T>, grid, threads, shared, s, static_cast<const T*>(gcopy), grads, filters,
                     c, Div32(c), rs);
    });
}

} // namespace dstk::train::cuda
