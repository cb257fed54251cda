#include "wgmma_wgrad.hpp"

#include <algorithm>
#include <mutex>

#include "elementwise.hpp"
#include "launch_common.cuh"
#include "tma.cuh"
#include "wgmma.cuh"

namespace dstk::train::cuda {
namespace {

constexpr unsigned block_c = 64, block_k = 64; // a block's input and output channels (the GEMM's M and N)
constexpr unsigned slots = 8;                  // image rows of a group: a k8 step's reduction slots
constexpr unsigned span = 16;                  // steps (columns) of a stage
constexpr unsigned xrows = slots + 2;          // a group's input rows, with the halo
constexpr unsigned stages = 2;                 // the ring of stages the producer fills ahead
// The fewest tiles a block sums. A block writes 64 x 64 x 9 partial sums and
// holds its SM for the whole kernel, which runs on the side stream beside
// the step's other kernels: on small layers, one block per SM won the
// kernel's own timing but slowed the step (ref-cnn's 16x16 64->64 layer).
constexpr unsigned min_tiles = 16;
constexpr unsigned consumers = 3, block_threads = (consumers + 1) * 128; // a consumer per filter row, the producer
constexpr unsigned row_bytes = 128;                 // the swizzle's span: a pixel's 32 channels in an input box
constexpr unsigned dyt_bytes = block_k * row_bytes; // dy^T of 4 steps: 64 channels x 32 pixels
// The consumers hold three 64 x 64 accumulators and an input window each,
// the producer a stage's share of dy: the registers a thread has at launch
// (128) are moved between them (setmaxnreg), summing to those of the launch.
constexpr unsigned producer_registers = 104, consumer_registers = 136;
static_assert(consumers * consumer_registers + producer_registers == (consumers + 1) * 128);

// Bytes of one input box (xrows x (run + 2) pixels x 32 channels), rounded
// up to the 1024 bytes at which the swizzle's pattern repeats.
constexpr unsigned box_bytes(unsigned run) {
    return (xrows * (run + 2) * row_bytes + 1023) / 1024 * 1024;
}
// A stage: each group's two input boxes (channels 0-31, 32-63 of the block's), then dy^T of all its steps.
constexpr unsigned stage_bytes(unsigned run) {
    return span / run * 2 * box_bytes(run) + span / 4 * dyt_bytes;
}
constexpr std::size_t shared_bytes(unsigned run) {
    return std::size_t{stages} * stage_bytes(run) + 1024; // (and room to align the stages to 1024 bytes)
}

struct Geo {
    unsigned h = 0, w = 0, c = 0, k = 0;
    unsigned run = 0;        // a group's columns (its steps): w, at most span
    Div32 per_image, across; // groups in an image, across it (divisions by a multiply: the producer's)
    unsigned groups = 0;     // in the batch
    unsigned tiles = 0;      // stages' worth of groups (the last may be partial)
    unsigned results = 0;    // blocks of 64 x 64 channels
    unsigned splits = 0;     // blocks per result, each summing every splits-th tile
};

struct Shared {
    std::uint64_t full[stages], empty[stages];
};

struct GroupAt {
    int image = 0, row = 0, col = 0;
};

#if defined(__CUDA_ARCH_FEAT_SM90_ALL)

// A producer thread's share of a stage's dy: units of 4 steps x 8 channels, dealt to the four warps in turn.
constexpr unsigned producer_units = span / 4 * (block_k / 8) / 4;
static_assert(producer_units == 2 * (span / 4)); // (load_dy: two units per 4 steps)

__device__ __forceinline__ GroupAt group_at(const Geo& g, unsigned q) {
    const unsigned image = g.per_image.div(q), rest = q - image * g.per_image.d, band = g.across.div(rest);
    return {static_cast<int>(image), static_cast<int>(band * slots),
            static_cast<int>((rest - band * g.across.d) * g.run)};
}

// d += a * b, 64 rows by 64 columns over 8 of the reduction: a (TF32) from
// registers, b a shared-memory operand (descriptor).
__device__ __forceinline__ void wgmma_rs(float (&d)[32], const std::uint32_t (&a)[4], std::uint64_t b) {
    asm volatile("wgmma.mma_async.sync.aligned.m64n64k8.f32.tf32.tf32 " DSTK_WGMMA_D32_LIST
                 "{%32, %33, %34, %35}, %36, 1, 1, 1;"
                 : DSTK_WGMMA_D32(d)
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(b));
}

// A producer thread's units of dy for tile t into registers (v[2u], v[2u +
// 1]: its pixel's 8 channels of unit u), all loads in flight at once; a
// partial last tile's missing groups are zeros. A warp's lanes take the 32
// pixels of a unit's 4 steps (lane: image row lane % 8, step lane / 8).
// Units 2b and 2b + 1 (channels 8 warp and 8 warp + 32 of the same pixels)
// share their 4 steps b: the group's position is worked out once for both.
template <unsigned Run>
__device__ __forceinline__ void load_dy(const float* dy, const Geo& g, unsigned t, unsigned k0,
                                        float4 (&v)[2 * producer_units]) {
    constexpr unsigned per_stage = span / Run, blocks = Run / 4;
    const unsigned pt = threadIdx.x - consumers * 128, lane = pt % 32, warp = pt / 32;
#pragma unroll
    for (unsigned b = 0; b < span / 4; ++b) {
        const unsigned q = t * per_stage + b / blocks;
#pragma unroll
        for (unsigned e = 0; e < 4; ++e) v[4 * b + e] = make_float4(0.f, 0.f, 0.f, 0.f);
        if (q >= g.groups) continue;
        const GroupAt at = group_at(g, q);
        const unsigned row = static_cast<unsigned>(at.row) + lane % slots;
        const unsigned col = static_cast<unsigned>(at.col) + 4 * (b % blocks) + lane / slots;
        const float* p = dy + ((std::uint64_t(at.image) * g.h + row) * g.w + col) * g.k + k0 + 8 * warp;
#pragma unroll
        for (unsigned h = 0; h < 2; ++h) { // unit 2b + h: channels 8 (warp + 4h) on
            v[4 * b + 2 * h] = __ldg(reinterpret_cast<const float4*>(p + 32 * h));
            v[4 * b + 2 * h + 1] = __ldg(reinterpret_cast<const float4*>(p + 32 * h + 4));
        }
    }
}

// The units into the stage's dy^T (at shared address dyt), rounded to TF32.
// dy^T's layout is that of a K-major operand with the 128-byte swizzle: row
// n (an output channel) holds the 32 pixels of 4 steps, reduction index 8
// (step % 4) + image row; each of a warp's stores fills one whole row, so
// no two lanes share a bank.
__device__ __forceinline__ void store_dyt(const float4 (&v)[2 * producer_units], unsigned dyt) {
    const unsigned pt = threadIdx.x - consumers * 128, lane = pt % 32, kk = 8 * (lane / slots) + lane % slots;
#pragma unroll
    for (unsigned u = 0; u < producer_units; ++u) {
        const unsigned unit = pt / 32 + 4 * u, oct = unit % 8, blk = unit / 8;
        const float e8[8] = {v[2 * u].x,     v[2 * u].y,     v[2 * u].z,     v[2 * u].w,
                             v[2 * u + 1].x, v[2 * u + 1].y, v[2 * u + 1].z, v[2 * u + 1].w};
        const unsigned row = dyt + blk * dyt_bytes + 8 * oct * row_bytes + (kk & 3) * 4;
#pragma unroll
        for (unsigned e = 0; e < 8; ++e) // channel 8 oct + e: its row's 16-byte chunks swizzled by e
            asm volatile("st.shared.b32 [%0], %1;" ::"r"(row + e * row_bytes + (((kk >> 2) ^ e) << 4)),
                         "r"(to_tf32(e8[e]))
                         : "memory");
    }
}

// The producer warpgroup: for each of the block's tiles, into the next free
// stage, its first thread the input boxes of each group (TMA: rows and
// columns outside the image zero; TF32 by rounding to nearest) and every
// thread its share of dy, transposed. A tile's loads of dy are issued before
// the wait for its stage, so that their latency passes in the wait.
template <unsigned Run>
__device__ void produce(const CUtensorMap& xmap, const float* dy, const Geo& g, unsigned char* smem, Shared& sh,
                        unsigned split, int c0, unsigned k0) {
    const unsigned per_stage = span / g.run, box = box_bytes(g.run), box_load = xrows * (g.run + 2) * row_bytes;
    unsigned it = 0;
    for (unsigned t = split; t < g.tiles; t += g.splits, ++it) {
        const unsigned s = it % stages, full = smem_address(&sh.full[s]);
        float4 v[2 * producer_units];
        load_dy<Run>(dy, g, t, k0, v);
        if (it >= stages) mbarrier_wait(smem_address(&sh.empty[s]), (it / stages - 1) & 1);
        const unsigned stage = smem_address(smem + s * stage_bytes(g.run));
        if (threadIdx.x == consumers * 128) {
            mbarrier_expect(full, per_stage * 2 * box_load);
            for (unsigned gi = 0; gi < per_stage; ++gi) {
                const GroupAt at = group_at(g, t * per_stage + gi);
                for (int h = 0; h < 2; ++h)
                    tma_load_4d(stage + (2 * gi + h) * box, xmap, c0 + 32 * h, at.col - 1, at.row - 1, at.image, full);
            }
        }
        store_dyt(v, stage + per_stage * 2 * box);
        fence_proxy_async(); // the stores before the consumers' wgmma reads them (async proxy)
        mbarrier_arrive(full);
    }
}

// One group's products into a consumer's accumulators (filter row r, its
// taps dx = 0, 1, 2). Step s (input columns s .. s + 2 of the box) is a k8
// product per tap: the reduction's slot j is image row j, the lane's A
// fragment rows 16 warp + gq and + 8 are input channels 16 warp + 2 gq and
// + 1 (one 8-byte load), its slots t and t + 4 the box rows t + r and t + 4
// + r. A column loaded at step s serves taps 2, 1, 0 of steps s, s + 1, s + 2:
// a window of five columns in registers, each rewritten only once the step
// that last read it is done (wgmma reads its registers asynchronously).
// The box's 128-byte swizzle spreads a load's four rows over distinct banks.
template <unsigned Run>
__device__ __forceinline__ void multiply_group(float (&acc)[3][32], unsigned xbox, unsigned dyt, unsigned r) {
    constexpr unsigned cols = Run + 2;
    const unsigned lane = threadIdx.x % 32, warp = threadIdx.x / 32 % 4, gq = lane / 4, t = lane % 4;
    const unsigned box = xbox + (warp / 2) * box_bytes(Run), chunk = (warp % 2) * 4 + gq / 2, byte = (gq % 2) * 8;
    const unsigned lin0 = (t + r) * cols, lin1 = (t + 4 + r) * cols;
    const auto load = [&](unsigned col, std::uint32_t(&a)[4]) {
        const unsigned l0 = lin0 + col, l1 = lin1 + col;
        asm volatile("ld.shared.v2.b32 {%0, %1}, [%2];"
                     : "=r"(a[0]), "=r"(a[1])
                     : "r"(box + l0 * row_bytes + ((chunk ^ (l0 & 7)) << 4) + byte));
        asm volatile("ld.shared.v2.b32 {%0, %1}, [%2];"
                     : "=r"(a[2]), "=r"(a[3])
                     : "r"(box + l1 * row_bytes + ((chunk ^ (l1 & 7)) << 4) + byte));
    };
    std::uint32_t win[5][4];
    wgmma_wait<0>(); // the last group's products have read their window
    load(0, win[0]);
    load(1, win[1]);
#pragma unroll
    for (unsigned s = 0; s < Run; ++s) {
        if (s >= 2) wgmma_wait<1>(); // step s - 2, the last reader of the column loaded now, is done
        load(s + 2, win[(s + 2) % 5]);
        wgmma_fence();
        const std::uint64_t b = operand_desc(dyt + (s / 4) * dyt_bytes + 32 * (s % 4));
#pragma unroll
        for (unsigned dx = 0; dx < 3; ++dx) wgmma_rs(acc[dx], win[(s + dx) % 5], b);
        wgmma_commit();
    }
}

// A consumer warpgroup (filter row r = its index): every stage's groups as
// they land, the stage handed back once read; then its three taps' sums into
// the block's partials ([split][k][tap][c]), as pairs of input channels.
template <unsigned Run>
__device__ void consume(const Geo& g, unsigned char* smem, Shared& sh, unsigned split, unsigned c0, unsigned k0,
                        float* partials) {
    constexpr unsigned per_stage = span / Run;
    const unsigned r = threadIdx.x / 128;
    float acc[3][32];
#pragma unroll
    for (unsigned dx = 0; dx < 3; ++dx)
#pragma unroll
        for (unsigned e = 0; e < 32; ++e) acc[dx][e] = 0.0f;
    unsigned it = 0;
    for (unsigned t = split; t < g.tiles; t += g.splits, ++it) {
        const unsigned s = it % stages;
        mbarrier_wait(smem_address(&sh.full[s]), (it / stages) & 1);
        const unsigned stage = smem_address(smem + s * stage_bytes(Run)), dyt = stage + per_stage * 2 * box_bytes(Run);
#pragma unroll
        for (unsigned gi = 0; gi < per_stage; ++gi)
            multiply_group<Run>(acc, stage + gi * 2 * box_bytes(Run), dyt + gi * (Run / 4) * dyt_bytes, r);
        wgmma_wait<0>();
        warpgroup_sync(r); // every warp's loads of the stage are done
        if (threadIdx.x % 128 == 0) mbarrier_arrive(smem_address(&sh.empty[s]));
    }
    wgmma_wait<0>();
    const unsigned lane = threadIdx.x % 32, warp = threadIdx.x / 32 % 4, t = lane % 4;
    const unsigned c = c0 + 16 * warp + 2 * (lane / 4);
    float* out = partials + std::uint64_t{split} * g.k * 9 * g.c;
#pragma unroll
    for (unsigned dx = 0; dx < 3; ++dx)
#pragma unroll
        for (unsigned j = 0; j < 8; ++j) {
            const std::uint64_t k = k0 + 8 * j + 2 * t, tap = 3 * r + dx;
            *reinterpret_cast<float2*>(out + (k * 9 + tap) * g.c + c) = make_float2(acc[dx][4 * j], acc[dx][4 * j + 2]);
            *reinterpret_cast<float2*>(out + ((k + 1) * 9 + tap) * g.c + c) =
                make_float2(acc[dx][4 * j + 1], acc[dx][4 * j + 3]);
        }
}

// Block b: result b % results (64 input x 64 output channels), split b / results.
template <unsigned Run>
__device__ __forceinline__ void wgrad_block(const CUtensorMap& xmap, const float* dy, const Geo& g, float* partials) {
    extern __shared__ unsigned char dynamic_smem[];
    __shared__ Shared sh;
    auto* smem = reinterpret_cast<unsigned char*>((reinterpret_cast<std::uintptr_t>(dynamic_smem) + 1023) &
                                                  ~std::uintptr_t{1023});
    const unsigned result = blockIdx.x % g.results, split = blockIdx.x / g.results, cb = g.c / block_c;
    const unsigned c0 = result % cb * block_c, k0 = result / cb * block_k;
    if (threadIdx.x == 0) {
        for (unsigned s = 0; s < stages; ++s) {
            mbarrier_init(smem_address(&sh.full[s]), 128 + 1); // the producer's threads, and its TMA's bytes
            mbarrier_init(smem_address(&sh.empty[s]), consumers);
        }
    }
    __syncthreads();
    if (threadIdx.x >= consumers * 128) {
        asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;" ::"n"(producer_registers));
        produce<Run>(xmap, dy, g, smem, sh, split, static_cast<int>(c0), k0);
        return;
    }
    asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;" ::"n"(consumer_registers));
    consume<Run>(g, smem, sh, split, c0, k0, partials);
}

#endif // __CUDA_ARCH_FEAT_SM90_ALL

template <unsigned Run>
__global__ void __launch_bounds__(block_threads, 1)
    wgmma_wgrad_kernel(const __grid_constant__ CUtensorMap xmap, const float* dy, Geo g, float* partials) {
    DSTK_WGMMA_BODY(wgrad_block<Run>(xmap, dy, g, partials);)
}

Geo geo_of(const TcWgradShape& s) {
    Geo g;
    g.h = s.h, g.w = s.w, g.c = s.c, g.k = s.k;
    g.run = std::min(s.w, span);
    const unsigned across = s.w / g.run, per_image = s.h / slots * across;
    g.per_image = Div32(per_image), g.across = Div32(across);
    g.groups = s.n * per_image;
    const unsigned per_stage = span / g.run;
    g.tiles = (g.groups + per_stage - 1) / per_stage;
    g.results = (s.c / block_c) * (s.k / block_k);
    g.splits = std::max(1u, std::min(g.tiles / min_tiles, sm_count() / g.results));
    return g;
}

// The kernel with its shared-memory limit raised once (per instantiation).
template <unsigned Run>
void launch_with(const CUtensorMap& xmap, const float* dy, const Geo& g, float* partials, cudaStream_t stream) {
    static std::once_flag once;
    std::call_once(once, [] {
        CUDA_CHECK(cudaFuncSetAttribute(wgmma_wgrad_kernel<Run>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                        static_cast<int>(shared_bytes(Run))));
    });
    plain_launch(wgmma_wgrad_kernel<Run>, g.results * g.splits, block_threads, shared_bytes(Run), stream, xmap, dy, g,
                 partials);
}

} // namespace

bool wgmma_wgrad_supported(const TcWgradShape& s) {
    if (s.n < 1 || s.c == 0 || s.k == 0 || s.c % block_c != 0 || s.k % block_k != 0) return false;
    if (s.h == 0 || s.h % slots != 0 || !(s.w == 8 || (s.w % span == 0 && s.w <= 256))) return false;
    if (std::uint64_t{s.n} * s.h * s.w >= 0x7fffffffu) return false; // (groups, pixel indices in 32 bits)
    if (shared_bytes(std::min(s.w, span)) > block_shared_limit()) return false;
    return sm90a_runs();
}

std::uint64_t wgmma_wgrad_workspace(const TcWgradShape& s) {
    return std::uint64_t{geo_of(s).splits} * s.k * 9 * s.c * sizeof(float);
}

void launch_wgmma_wgrad(const float* x, const float* dy, const TcWgradShape& s, void* workspace, void* dw,
                        cudaStream_t stream, const std::uint32_t* map, const ParamUpdate* update) {
    const Geo g = geo_of(s);
    const std::uint64_t pixel = std::uint64_t{s.c} * sizeof(float);
    const cuuint64_t dims[4] = {s.c, s.w, s.h, s.n}, strides[3] = {pixel, pixel * s.w, pixel * s.w * s.h};
    const cuuint32_t box[4] = {row_bytes / sizeof(float), g.run + 2, xrows, 1};
    const CUtensorMap xmap =
        encode_tensor_map(CU_TENSOR_MAP_DATA_TYPE_TFLOAT32, 4, x, dims, strides, box, CU_TENSOR_MAP_SWIZZLE_128B,
                          CU_TENSOR_MAP_L2_PROMOTION_L2_256B, "wgmma_wgrad's input");
    auto* partials = static_cast<float*>(workspace);
    if (g.run == span)
        launch_with<span>(xmap, dy, g, partials, stream);
    else
        launch_with<8>(xmap, dy, g, partials, stream);
    launch_sum_partials(partials, g.splits, std::uint64_t{s.k} * 9 * s.c, dw, ActType::f32, stream, map, update);
}

} // namespace dstk::train::cuda
