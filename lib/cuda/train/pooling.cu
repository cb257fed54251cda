// Max / average pooling (plain and tiled) and global average pooling.
#include "pooling.hpp"

#include "launch_common.cuh"

namespace dstk::train::cuda {
namespace {

// Coordinates of element i of an [n][h][w][c] or [n][c][h][w] tensor, and back.
struct Coord {
    std::uint64_t n;
    std::uint32_t c, y, x;
};
__device__ __forceinline__ Coord coord_of(std::uint64_t i, std::uint32_t c, std::uint32_t h, std::uint32_t w,
                                          bool nchw) {
    if (nchw)
        return {i / (std::uint64_t{c} * h * w), static_cast<std::uint32_t>((i / (std::uint64_t{h} * w)) % c),
                static_cast<std::uint32_t>((i / w) % h), static_cast<std::uint32_t>(i % w)};
    const std::uint64_t pix = i / c;
    return {pix / (std::uint64_t{h} * w), static_cast<std::uint32_t>(i % c), static_cast<std::uint32_t>((pix / w) % h),
            static_cast<std::uint32_t>(pix % w)};
}
__device__ __forceinline__ std::uint64_t index_of(Coord k, std::uint32_t c, std::uint32_t h, std::uint32_t w,
                                                  bool nchw) {
    return nchw ? ((k.n * c + k.c) * h + k.y) * w + k.x : ((k.n * h + k.y) * w + k.x) * c + k.c;
}

template <class T> __global__ void pool_forward_kernel(const T* x, T* y, PoolShape p, bool max, std::uint64_t count) {
    await_predecessor();
    GRID_LOOP(o, count) {
        const Coord k = coord_of(o, p.c, p.oh, p.ow, p.nchw);
        const Coord first{k.n, k.c, k.y * p.stride, k.x * p.stride};
        float best = ld(x, index_of(first, p.c, p.h, p.w, p.nchw)), sum = 0.0f;
        for (std::uint32_t ky = 0; ky < p.k; ++ky)
            for (std::uint32_t kx = 0; kx < p.k; ++kx) {
                const float v = ld(x, index_of({k.n, k.c, first.y + ky, first.x + kx}, p.c, p.h, p.w, p.nchw));
                sum += v;
                best = v > best ? v : best;
            }
        st(y, o, max ? best : sum / static_cast<float>(p.k * p.k));
    }
}

// One thread per input element: sums, in output order, the gradient of every
// window that holds it (for max, only where it is the window's first maximum).
template <class T>
__global__ void pool_backward_kernel(const T* x, const T* dy, T* dx, PoolShape p, bool max, std::uint64_t count) {
    await_predecessor();
    GRID_LOOP(i, count) {
        const Coord k = coord_of(i, p.c, p.h, p.w, p.nchw);
        const std::uint32_t oy0 = k.y + 1 >= p.k ? (k.y + 1 - p.k + p.stride - 1) / p.stride : 0;
        const std::uint32_t ox0 = k.x + 1 >= p.k ? (k.x + 1 - p.k + p.stride - 1) / p.stride : 0;
        const std::uint32_t oy1 = min(k.y / p.stride, p.oh - 1), ox1 = min(k.x / p.stride, p.ow - 1);
        float g = 0.0f;
        for (std::uint32_t oy = oy0; oy <= oy1 && oy0 < p.oh; ++oy)
            for (std::uint32_t ox = ox0; ox <= ox1 && ox0 < p.ow; ++ox) {
                const std::uint64_t o = index_of({k.n, k.c, oy, ox}, p.c, p.oh, p.ow, p.nchw);
                if (!max) {
                    g += ld(dy, o) / static_cast<float>(p.k * p.k);
                    continue;
                }
                std::uint32_t by = oy * p.stride, bx = ox * p.stride;
                float best = ld(x, index_of({k.n, k.c, by, bx}, p.c, p.h, p.w, p.nchw));
                for (std::uint32_t ky = 0; ky < p.k; ++ky)
                    for (std::uint32_t kx = 0; kx < p.k; ++kx) {
                        const std::uint32_t yy = oy * p.stride + ky, xx = ox * p.stride + kx;
                        const float v = ld(x, index_of({k.n, k.c, yy, xx}, p.c, p.h, p.w, p.nchw));
                        if (v > best) best = v, by = yy, bx = xx;
                    }
                if (by == k.y && bx == k.x) g += ld(dy, o);
            }
        st(dx, i, g);
    }
}

// Non-overlapping windows that tile the input (k == stride, h == oh * k,
// w == ow * k): one thread per output pixel and group of V channels of an
// [n][h][w][c] tensor (NCHW runs as n * c planes of one channel), reading
// each input element once; the backward pass writes the whole window (the
// gradient at the first maximum, zeros elsewhere), so every dx element is
// written exactly once. Output groups number below 2^31.
struct TiledPool {
    std::uint32_t count, w, c, k, ow;
    Div32 groups, dow, doh;
    // First input element of output group o's window; o's output element is o * V.
    __device__ __forceinline__ std::uint64_t window(std::uint32_t o, int v) const {
        const std::uint32_t pix = groups.div(o), g = o - pix * groups.d;
        const std::uint32_t t = dow.div(pix), ox = pix - t * ow, nn = doh.div(t), oy = t - nn * doh.d;
        return ((std::uint64_t{nn} * doh.d * k + oy * k) * w + std::uint64_t{ox} * k) * c + std::uint64_t{g} * v;
    }
};

template <class T, int V> __global__ void tiled_pool_forward_kernel(const T* x, T* y, TiledPool p, bool max) {
    await_predecessor();
    for (std::uint32_t o = blockIdx.x * blockDim.x + threadIdx.x; o < p.count; o += gridDim.x * blockDim.x) {
        const std::uint64_t base = p.window(o, V);
        float best[V], sum[V], v[V];
        ldv<V>(x, base, best);
#pragma unroll
        for (int j = 0; j < V; ++j) sum[j] = 0.0f;
        for (std::uint32_t ky = 0; ky < p.k; ++ky)
            for (std::uint32_t kx = 0; kx < p.k; ++kx) {
                ldv<V>(x, base + (std::uint64_t{ky} * p.w + kx) * p.c, v);
#pragma unroll
                for (int j = 0; j < V; ++j) {
                    sum[j] += v[j];
                    best[j] = v[j] > best[j] ? v[j] : best[j];
                }
            }
        if (!max)
#pragma unroll
            for (int j = 0; j < V; ++j) best[j] = sum[j] / static_cast<float>(p.k * p.k);
        stv<V>(y, std::uint64_t{o} * V, best);
    }
}

template <class T, int V>
__global__ void tiled_pool_backward_kernel(const T* x, const T* dy, T* dx, TiledPool p, bool max) {
    await_predecessor();
    for (std::uint32_t o = blockIdx.x * blockDim.x + threadIdx.x; o < p.count; o += gridDim.x * blockDim.x) {
        const std::uint64_t base = p.window(o, V);
        float g[V], best[V], v[V];
        std::uint32_t arg[V];
        ldv<V>(dy, std::uint64_t{o} * V, g);
        if (max) {
            ldv<V>(x, base, best);
#pragma unroll
            for (int j = 0; j < V; ++j) arg[j] = 0;
            for (std::uint32_t ky = 0; ky < p.k; ++ky)
                for (std::uint32_t kx = 0; kx < p.k; ++kx) {
                    ldv<V>(x, base + (std::uint64_t{ky} * p.w + kx) * p.c, v);
#pragma unroll
                    for (int j = 0; j < V; ++j)
                        if (v[j] > best[j]) best[j] = v[j], arg[j] = ky * p.k + kx;
                }
        } else {
#pragma unroll
            for (int j = 0; j < V; ++j) g[j] /= static_cast<float>(p.k * p.k);
        }
        for (std::uint32_t ky = 0; ky < p.k; ++ky)
            for (std::uint32_t kx = 0; kx < p.k; ++kx) {
#pragma unroll
                for (int j = 0; j < V; ++j) v[j] = !max || arg[j] == ky * p.k + kx ? g[j] : 0.0f;
                stv<V>(dx, base + (std::uint64_t{ky} * p.w + kx) * p.c, v);
            }
    }
}

// Launches a tiled pooling kernel where the shape allows one; false otherwise.
template <class T, class F> bool tiled_pool(const PoolShape& p, const void* const* ptrs, int nptrs, F&& launch) {
    if (p.k != p.stride || p.h != p.oh * p.k || p.w != p.ow * p.k) return false;
    // NCHW: n * c planes of one channel.
    const std::uint64_t n = p.nchw ? std::uint64_t{p.n} * p.c : p.n;
    const std::uint32_t c = p.nchw ? 1 : p.c;
    bool vec = c % vec_of<T> == 0;
    for (int j = 0; j < nptrs; ++j) vec = vec && aligned16(ptrs[j]);
    const std::uint32_t v = vec ? vec_of<T> : 1;
    const std::uint64_t count = n * p.oh * p.ow * (c / v);
    if (count > narrow_limit || n * p.h * p.w * c > (std::uint64_t{1} << 62)) return false;
    TiledPool tp{static_cast<std::uint32_t>(count), p.w, c, p.k, p.ow, Div32(c / v), Div32(p.ow), Div32(p.oh)};
    launch(tp, vec, blocks_for(count));
    return true;
}

template <class T>
__global__ void gap_forward_kernel(const T* x, T* y, std::uint32_t c, std::uint64_t hw, bool nchw,
                                   std::uint64_t count) {
    await_predecessor();
    GRID_LOOP(o, count) {
        const std::uint64_t ch = o % c, n = o / c;
        float s = 0.0f;
        for (std::uint64_t j = 0; j < hw; ++j) s += ld(x, nchw ? o * hw + j : (n * hw + j) * c + ch);
        st(y, o, s / static_cast<float>(hw));
    }
}

template <class T>
__global__ void gap_backward_kernel(const T* dy, T* dx, std::uint32_t c, std::uint64_t hw, bool nchw,
                                    std::uint64_t count) {
    await_predecessor();
    GRID_LOOP(i, count) {
        const std::uint64_t o = nchw ? i / hw : (i / (c * hw)) * c + i % c;
        st(dx, i, ld(dy, o) / static_cast<float>(hw));
    }
}

// NHWC with 16-byte accesses (V channels a thread, 32-bit indices): the
// forward sums each channel's pixels in the same order as gap_forward_kernel,
// the backward divides as gap_backward_kernel does, so the bits are the same.
// Both sit between the network's last convolution and its loss, where the
// GPU runs nothing else.
template <class T, int V>
__global__ void gap_forward_vec_kernel(const T* x, T* y, Div32 groups, std::uint32_t hw, std::uint32_t count) {
    await_predecessor();
    for (std::uint32_t o = blockIdx.x * blockDim.x + threadIdx.x; o < count; o += gridDim.x * blockDim.x) {
        const std::uint32_t n = groups.div(o), g = o - n * groups.d, c = groups.d * V;
        float s[V] = {};
        const std::uint64_t base = std::uint64_t{n} * hw * c + std::uint64_t{g} * V;
#pragma unroll 4
        for (std::uint32_t j = 0; j < hw; ++j) {
            float v[V];
            ldv<V>(x, base + std::uint64_t{j} * c, v);
#pragma unroll
            for (int k = 0; k < V; ++k) s[k] += v[k];
        }
#pragma unroll
        for (int k = 0; k < V; ++k) s[k] = s[k] / static_cast<float>(hw);
        stv<V>(y, std::uint64_t{o} * V, s);
    }
}

template <class T, int V>
__global__ void gap_backward_vec_kernel(const T* dy, T* dx, Div32 groups, Div32 sample_groups, std::uint32_t hw,
                                        std::uint32_t count) {
    await_predecessor();
    for (std::uint32_t i = blockIdx.x * blockDim.x + threadIdx.x; i < count; i += gridDim.x * blockDim.x) {
        const std::uint32_t n = sample_groups.div(i), g = groups.mod(i);
        float v[V];
        ldv<V>(dy, (std::uint64_t{n} * groups.d + g) * V, v);
#pragma unroll
        for (int k = 0; k < V; ++k) v[k] = v[k] / static_cast<float>(hw);
        stv<V>(dx, std::uint64_t{i} * V, v);
    }
}

// Whether the 16-byte kernels take [n][hw][c]: channels a multiple of V,
// aligned pointers, 32-bit counts.
template <class T>
bool gap_vec(std::uint32_t n, std::uint32_t c, std::uint64_t hw, bool nchw, const void* a, const void* b) {
    return !nchw && c % vec_of<T> == 0 && aligned16(a) && aligned16(b) && std::uint64_t{n} * hw * c < narrow_limit;
}

} // namespace

void launch_pool_forward(const void* x, void* y, ActType t, const PoolShape& p, bool max, cudaStream_t s) {
    const std::uint64_t count = std::uint64_t{p.n} * p.oh * p.ow * p.c;
    dispatch(t, [&](auto tag) {
        using T = DSTK_T;
        const T* xt = static_cast<const T*>(x);
        T* yt = static_cast<T*>(y);
        const void* ptrs[] = {x, y};
        if (tiled_pool<T>(p, ptrs, 2, [&](const TiledPool& tp, bool vec, unsigned b) {
                if (vec)
                    plain_launch(tiled_pool_forward_kernel<T, vec_of<T>>, b, threads, 0, s, xt, yt, tp, max);
                else
                    plain_launch(tiled_pool_forward_kernel<T, 1>, b, threads, 0, s, xt, yt, tp, max);
            }))
            return;
        plain_launch(pool_forward_kernel<T>, blocks_for(count, 2), threads, 0, s, xt, yt, p, max, count);
    });
}

void launch_pool_backward(const void* x, const void* dy, void* dx, ActType t, const PoolShape& p, bool max,
                          cudaStream_t s) {
    const std::uint64_t count = std::uint64_t{p.n} * p.h * p.w * p.c;
    dispatch(t, [&](auto tag) {
        using T = DSTK_T;
        const T *xt = static_cast<const T*>(x), *dyt = static_cast<const T*>(dy);
        T* dxt = static_cast<T*>(dx);
        const void* ptrs[] = {x, dy, dx};
        if (tiled_pool<T>(p, ptrs, 3, [&](const TiledPool& tp, bool vec, unsigned b) {
                if (vec)
                    plain_launch(tiled_pool_backward_kernel<T, vec_of<T>>, b, threads, 0, s, xt, dyt, dxt, tp, max);
                else
                    plain_launch(tiled_pool_backward_kernel<T, 1>, b, threads, 0, s, xt, dyt, dxt, tp, max);
            }))
            return;
        plain_launch(pool_backward_kernel<T>, blocks_for(count, 2), threads, 0, s, xt, dyt, dxt, p, max, count);
    });
}

void launch_gap_forward(const void* x, void* y, ActType t, std::uint32_t n, std::uint32_t c, std::uint64_t hw,
                        bool nchw, cudaStream_t s) {
    const std::uint64_t count = std::uint64_t{n} * c;
    dispatch(t, [&](auto tag) {
        using T = DSTK_T;
        constexpr int v = vec_of<T>;
        const T* xt = static_cast<const T*>(x);
        T* yt = static_cast<T*>(y);
        if (gap_vec<T>(n, c, hw, nchw, x, y)) {
            const auto groups = static_cast<std::uint32_t>(count / v);
            launch_kernel(gap_forward_vec_kernel<T, v>, blocks_for(groups), threads, 0, s, xt, yt, Div32(c / v),
                          static_cast<std::uint32_t>(hw), groups);
            return;
        }
        launch_kernel(gap_forward_kernel<T>, blocks_for(count), threads, 0, s, xt, yt, c, hw, nchw, count);
    });
}

void launch_gap_backward(const void* dy, void* dx, ActType t, std::uint32_t n, std::uint32_t c, std::uint64_t hw,
                         bool nchw, cudaStream_t s) {
    const std::uint64_t count = std::uint64_t{n} * c * hw;
    dispatch(t, [&](auto tag) {
        using T = DSTK_T;
        constexpr int v = vec_of<T>;
        const T* dyt = static_cast<const T*>(dy);
        T* dxt = static_cast<T*>(dx);
        if (gap_vec<T>(n, c, hw, nchw, dy, dx)) {
            const auto groups = static_cast<std::uint32_t>(count / v);
            launch_kernel(gap_backward_vec_kernel<T, v>, blocks_for(groups), threads, 0, s, dyt, dxt, Div32(c / v),
                          Div32(hw * (c / v)), static_cast<std::uint32_t>(hw), groups);
            return;
        }
        launch_kernel(gap_backward_kernel<T>, blocks_for(count, 4), threads, 0, s, dyt, dxt, c, hw, nchw, count);
    });
}

} // namespace dstk::train::cuda
