#include "tc_conv.hpp"

#include <cudaTypedefs.h>

#include <algorithm>
#include <mutex>
#include <numeric>
#include <string>

#include "dstk/env.hpp"
#include "first_conv_tiles.cuh"
#include "launch_common.cuh"
#include "tma.cuh"

namespace dstk::train::cuda {
namespace {

constexpr unsigned conv_warps = 4, conv_threads = conv_warps * 32;
constexpr unsigned block_n = 32; // output channels per block (four n8 tiles)
constexpr unsigned max_width = 128;
// Input channels: up to 128 in bf16; in float the filter rows of 32 outputs
// at more than 64 channels leave no room for a tile in shared memory.
constexpr unsigned max_cin_bf16 = 128, max_cin_float = 64;
constexpr unsigned max_cin_first_wgrad = 64; // the kernels compiled with TcConvFirstWgrad
constexpr unsigned row_pad = 16;             // bytes after each shared row of channels

// 16-pixel row tiles per warp: four (sixteen products per six ldmatrix)
// where the block's tile fits in shared memory, else two.
constexpr unsigned wide_mtiles = 4, narrow_mtiles = 2;
// Registers for four blocks per SM (as many as a 32-channel bf16 tile's
// shared memory allows); the two sets of fragments would take more unbounded.
// Float tiles of 32 channels and more take over 76 KB of shared memory, two
// blocks per SM at most: registers for two, so that the wide tiles'
// fragments stay in registers instead of spilling.
constexpr unsigned blocks_per_sm = 4;
template <class T, unsigned CIN>
constexpr unsigned min_blocks_per_sm = std::is_same_v<T, float>&& CIN >= 32 ? 2 : blocks_per_sm;

// What differs between the stored types. Shared memory is addressed in bytes
// and a reduction step takes 32 bytes of a pixel's channels: 16 bf16 for
// m16n8k16, or 8 floats for m16n8k8 in tf32. ldmatrix's 8x8 matrices of b16
// then hold both products' fragments: a lane receives 4 bytes of row gid at
// byte 4 t4, the bf16 pair (2 t4, 2 t4 + 1) or the float t4 that tf32's A
// and B take there (the tensor cores read a float's upper 19 bits). Staged
// output rows of floats are padded to 40 words, so that a half-warp's float2
// stores fall in distinct banks.
template <class T> struct Elem {
    static constexpr unsigned size = sizeof(T), per_chunk = 16 / size;
    static constexpr unsigned stage_pitch = size == 4 ? 40 : 16; // words per staged pixel
    static constexpr unsigned stage_words = 16 * stage_pitch;    // a warp's staging rows
};

// How the input tiles come into shared memory. On compute capability 9.0
// one thread has the tensor memory accelerator copy a tile as a box of the
// [n][h][w][c] input, the halo outside the images filled with zeros, in
// "planes" of up to 128 bytes of each pixel's channels with the 16-byte
// chunks of each row swizzled (TMA's 32, 64 or 128-byte pattern, the chunk
// index XORed with bits 7 and up of its address): the eight rows an ldmatrix
// reads fall in distinct banks without padding. Elsewhere each thread copies
// 16-byte chunks (cp.async) into rows padded by 16 bytes.
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
constexpr bool tma_tiles = true;
#else
constexpr bool tma_tiles = false;
#endif
constexpr unsigned tma_align = 1024; // a plane starts where the 128-byte pattern does
// Bytes of a pixel's channels per plane (of channel_bytes, a multiple of
// 32): 32, 64 or 128; and the planes a tile takes.
constexpr unsigned plane_row_of(unsigned channel_bytes) {
    return std::gcd(channel_bytes, 128u);
}
template <class T, unsigned CIN> constexpr unsigned plane_row = plane_row_of(CIN* unsigned{sizeof(T)});
template <class T, unsigned CIN> constexpr unsigned tile_planes = CIN* unsigned{sizeof(T)} / plane_row<T, CIN>;
// The largest box side TMA takes.
constexpr unsigned tma_max_box = 256;

// A tile: whole rows of one image, or several whole images where an image
// has at most half a tile's pixels (the 8x8 and smaller layers would leave
// most warps idle otherwise). Each image's rows come with a row of halo above
// and below and a column left and right ("segments" in shared memory).
// Shared memory: the input tile's pixels (padded rows, or TMA's planes) and
// the block's filter rows ([n][tap]) padded by 16 bytes, so that the eight
// 16-byte rows an ldmatrix reads (consecutive pixels, or consecutive n) fall
// in distinct banks.
struct Geometry {
    TcConvShape s;
    unsigned mw;
    bool tma;
    unsigned images, tile_rows, tiles_per_image, tiles, seg_rows, cols_in, seg_pixels;
    unsigned pitch;       // bytes per filter row (and, without TMA, per pixel) in shared memory
    unsigned plane_bytes; // TMA: bytes between planes (a tile's pixels x plane_row, aligned)
    unsigned box_bytes;   // TMA: bytes a tile's copy brings
    unsigned mask_bytes;  // TcConvFirstWgrad: the ReLU's output under a tile (the first input tile after it)
    Div32 dw, dcols, dseg_rows, dseg_pixels;
    std::uint64_t x_bytes, w_bytes, shared;
    unsigned groups; // of conv_threads threads per block, each with its tile buffer (tc_conv_kernel's G)
};

Geometry geometry_for(const TcConvShape& s, unsigned mw, bool tma, unsigned groups = 1) {
    Geometry g{};
    g.s = s;
    g.mw = mw;
    g.tma = tma;
    g.groups = groups;
    const unsigned tile = conv_warps * 16 * mw, image = std::max(1u, s.h * s.w);
    g.images = image * 2 <= tile ? tile / image : 1;
    g.tile_rows = g.images > 1 ? s.h : std::max(1u, std::min(s.h, tile / std::max(1u, s.w)));
    g.tiles_per_image = (s.h + g.tile_rows - 1) / g.tile_rows;
    g.tiles = g.images > 1 ? (s.n + g.images - 1) / g.images : s.n * g.tiles_per_image;
    g.seg_rows = g.tile_rows + 2;
    g.cols_in = s.w + 2;
    g.seg_pixels = g.tile_rows * s.w;
    const unsigned channel_bytes = s.cin * (s.tf32 ? Elem<float>::size : Elem<bf16>::size);
    g.pitch = channel_bytes + row_pad;
    g.dw = Div32(s.w);
    g.dcols = Div32(g.cols_in);
    g.dseg_rows = Div32(g.seg_rows);
    g.dseg_pixels = Div32(g.seg_pixels);
    const std::uint64_t pixels = std::uint64_t{g.images} * g.seg_rows * g.cols_in;
    if (tma) {
        const unsigned row = plane_row_of(channel_bytes), planes = channel_bytes / row;
        g.plane_bytes = static_cast<unsigned>((pixels * row + tma_align - 1) / tma_align * tma_align);
        g.box_bytes = static_cast<unsigned>(pixels * channel_bytes);
        g.x_bytes = std::uint64_t{planes} * g.plane_bytes;
    } else {
        g.x_bytes = pixels * g.pitch;
    }
    g.w_bytes = std::uint64_t{block_n} * 9 * g.pitch;
    const unsigned stage_words = s.tf32 ? Elem<float>::stage_words : Elem<bf16>::stage_words;
    // TMA: room to align the tiles, and the barrier (8 bytes) after the staging rows.
    g.shared = (tma ? tma_align + 8 : 0) + g.x_bytes + g.w_bytes + std::uint64_t{conv_warps} * stage_words * 4;
    if (groups > 1) { // per group a tile, staging rows and a barrier; past two groups, the sums (stat_slot)
        g.shared = (tma ? tma_align : 0) + groups * (g.x_bytes + std::uint64_t{conv_warps} * stage_words * 4 + 8) +
                   g.w_bytes + (groups > 2 ? std::uint64_t{groups} * conv_warps * block_n * 2 * sizeof(double) : 0);
    }
    return g;
}

// Shared memory per block: up to 160 KB (more lets the float 64-channel
// tiles go wide, four row tiles per warp, measured slower on an H100), never
// more than the device allows (block_shared_limit: 99 KB on 8.6 and 8.9).
std::uint64_t max_shared() {
    return std::min<std::uint64_t>(160 * 1024, block_shared_limit());
}

Geometry geometry_of(const TcConvShape& s, bool tma) {
    const Geometry wide = geometry_for(s, wide_mtiles, tma);
    return wide.shared <= max_shared() ? wide : geometry_for(s, narrow_mtiles, tma);
}

// A block's float filters may serve up to three groups: a 32-channel float
// tile and its filters take over 76 KB, two blocks (eight warps) per SM at
// most with a group each, where one block of three groups fits (twelve
// warps); a 64-channel tile's one block per SM (four warps) becomes two
// groups. The own convolutions are latency-bound: more warps per SM, more
// products in flight. One block per SM where it has groups: their registers
// are bounded for that alone, and three groups leave a wide tile's fragments
// as many as they need. Not in bf16: its 64-channel tiles in three groups
// measured slower than in two blocks of one. DSTK_TC_GROUPS=N caps the groups (read at each launch: a
// graph keeps what held at its capture; 1 keeps a group per block).
constexpr unsigned max_groups = 3;
unsigned groups_cap() {
    const long v = env_long("DSTK_TC_GROUPS", max_groups);
    return static_cast<unsigned>(std::clamp(v, 1L, long{max_groups}));
}
// The geometry with the most warps per SM (by shared memory, each block
// reserving 1 KB of the SM's; one block where it has groups), wide tiles
// before narrow and fewer groups before more where they tie; geometry_of's
// in bf16, and where the threads copy the tiles (compiled before compute
// 9.0: groups measured only with TMA's copies, on an H100).
Geometry grouped_geometry(const TcConvShape& s, bool tma) {
    Geometry best = geometry_of(s, tma);
    if (!s.tf32 || !tma || s.one_group) return best;
    const auto warps = [per_sm = sm_shared_limit()](const Geometry& g) {
        const std::uint64_t blocks = per_sm / (g.shared + 1024);
        return g.groups * conv_warps * (g.groups > 1 ? std::min<std::uint64_t>(blocks, 1) : blocks);
    };
    const unsigned cap = groups_cap();
    const std::uint64_t limit = block_shared_limit();
    for (unsigned groups = 2; groups <= cap; ++groups)
        for (const unsigned mw : {wide_mtiles, narrow_mtiles}) {
            const Geometry g = geometry_for(s, mw, tma, groups);
            if (g.shared <= limit && warps(g) > warps(best)) best = g;
        }
    return best;
}

template <class T, unsigned CIN> constexpr unsigned shared_pitch = CIN * sizeof(T) + row_pad;

// A block has one group of conv_threads threads per tile buffer (groups,
// below): each group copies, multiplies and stores its own tiles, the block's
// filters shared. This thread's place in its group.
template <unsigned G> __device__ __forceinline__ unsigned group_thread() {
    return G == 1 ? threadIdx.x : threadIdx.x % conv_threads;
}

// The 16-byte chunks that this thread copies into shared memory (and, in
// float, rounds): f(row, chunk) for the block's filter rows (all its
// threads) and for the pixels of a tile (its group's; a row each, threads
// past a whole number of rows per step staying out, so that no two copy the
// same chunk).
template <class T, unsigned CIN, unsigned G, class F> __device__ __forceinline__ void for_filter_chunks(F&& f) {
    constexpr unsigned chunks = CIN / Elem<T>::per_chunk;
    for (unsigned e = threadIdx.x; e < block_n * 9 * chunks; e += G * conv_threads) f(e / chunks, e % chunks);
}
template <class T, unsigned CIN, unsigned G, class F>
__device__ __forceinline__ void for_tile_chunks(unsigned rows, F&& f) {
    constexpr unsigned chunks = CIN / Elem<T>::per_chunk, step = conv_threads / chunks;
    const unsigned i = group_thread<G>();
    if (i >= step * chunks) return;
    for (unsigned pix = i / chunks; pix < rows; pix += step) f(pix, i % chunks);
}

// The block's 32 filters as B[n][tap][c] (c the reduction's input channel):
// rows of the [cout][3][3][cin] filter (the forward's own, or the data
// gradient's, turned by turn_filters), copied asynchronously.
template <class T, unsigned CIN, unsigned G> __device__ void load_filters(const T* w, unsigned n0, char* ws) {
    for_filter_chunks<T, CIN, G>([&](unsigned row, unsigned ch) { // row = n * 9 + tap
        cp_async16(ws + row * shared_pitch<T, CIN> + ch * 16,
                   w + (std::uint64_t{n0} * 9 + row) * CIN + ch * Elem<T>::per_chunk, true);
    });
}

// Float operands rounded to tf32 in shared memory, to nearest (ties away):
// unrounded, the products would use a float's upper 19 bits as they are, a
// bias toward zero that the CPU comparisons measured; by the thread that
// copied them, once its copies have landed (the filters with the first tile;
// tiles that TMA copies come rounded, tile_map).
__device__ __forceinline__ void round_chunk_to_tf32(char* p) {
    uint4& v = *reinterpret_cast<uint4*>(p);
    v = to_tf32(v);
}
template <class T, unsigned CIN, unsigned G>
__device__ void round_copies(char* xs, char* ws, unsigned copied, bool filters) {
    if constexpr (std::is_same_v<T, float>) {
        const auto at = [](char* base) {
            return
                [base](unsigned row, unsigned ch) { round_chunk_to_tf32(base + row * shared_pitch<T, CIN> + ch * 16); };
        };
        if constexpr (!tma_tiles) for_tile_chunks<T, CIN, G>(copied, at(xs)); // (TMA converts: tile_map)
        if (filters) for_filter_chunks<T, CIN, G>(at(ws));
    }
}

// The data gradient's filter from the forward's: out[c][tap][k] =
// w[k][8 - tap][c] (dx = conv(dy) with the taps turned 180 degrees and the
// channels swapped), once per call into scratch.
template <class T> __global__ void turn_filters_kernel(const T* w, T* out, unsigned k, unsigned c) {
    await_predecessor();
    const unsigned total = 9 * k * c;
    for (unsigned e = blockIdx.x * blockDim.x + threadIdx.x; e < total; e += gridDim.x * blockDim.x) {
        const unsigned kk = e % k, rest = e / k, tap = rest % 9, cc = rest / 9; // e = (cc * 9 + tap) * k + kk
        out[e] = w[(std::uint64_t{kk} * 9 + (8 - tap)) * c + cc];
    }
}

// A tile's place: its first output pixel and how many it has.
struct TileSpan {
    std::uint64_t first = 0;
    unsigned pixels = 0;
    unsigned copied = 0; // pixels the threads copy (cp.async), the halo's included; none with TMA
};

// Where tile t starts: its first image, its first output row in it (0 for
// tiles of whole images) and how many images it has.
struct TileOrigin {
    unsigned img0, oy0, nimg;
};
__device__ __forceinline__ TileOrigin tile_origin(const Geometry& g, unsigned t) {
    if (g.images > 1) return {t * g.images, 0, min(g.images, g.s.n - t * g.images)};
    const unsigned img = t / g.tiles_per_image;
    return {img, (t - img * g.tiles_per_image) * g.tile_rows, 1};
}

// The TMA box of tile t, plane p: its channels, the column left of the
// images, the row above its first output row, its first image.
struct BoxAt {
    int c, x, y, n;
};
template <class T, unsigned CIN> __device__ __forceinline__ BoxAt box_at(const TileOrigin& o, unsigned p) {
    return {static_cast<int>(p * (plane_row<T, CIN> / sizeof(T))), -1, static_cast<int>(o.oy0) - 1,
            static_cast<int>(o.img0)};
}

// Starts the copy of the input rows under tile t (zero outside the images):
// by TMA, one thread announcing the box's bytes on the barrier at bar (the
// block's reads of the buffer ordered before it by the barrier before the
// call), or each thread keeping to one 16-byte chunk of the pixels' channels.
template <class T, unsigned CIN, unsigned G>
__device__ TileSpan load_tile(const T* x, const CUtensorMap& map, const Geometry& g, unsigned t, char* xs,
                              unsigned bar) {
    const TileOrigin o = tile_origin(g, t);
    const auto [img0, oy0, nimg] = o;
    TileSpan span;
    span.first = (std::uint64_t{img0} * g.s.h + oy0) * g.s.w;
    span.pixels = g.images > 1 ? nimg * g.seg_pixels : min(g.tile_rows, g.s.h - oy0) * g.s.w;
    if constexpr (tma_tiles) { // (copied: none by the threads)
        if (group_thread<G>() == 0) {
            fence_proxy_async();
            mbarrier_expect(bar, g.box_bytes);
            for (unsigned p = 0; p < tile_planes<T, CIN>; ++p) {
                const BoxAt b = box_at<T, CIN>(o, p);
                tma_load_4d(smem_address(xs + p * g.plane_bytes), map, b.c, b.x, b.y, b.n, bar);
            }
        }
        return span;
    }
    const unsigned total = nimg * g.seg_rows * g.cols_in;
    span.copied = total;
    for_tile_chunks<T, CIN, G>(total, [&](unsigned pix, unsigned ch) {
        const unsigned r = g.dcols.div(pix), rx = pix - r * g.cols_in;
        const unsigned seg = g.dseg_rows.div(r), ry = r - seg * g.seg_rows;
        const int iy = static_cast<int>(oy0 + ry) - 1, ix = static_cast<int>(rx) - 1;
        const bool in = iy >= 0 && iy < static_cast<int>(g.s.h) && ix >= 0 && ix < static_cast<int>(g.s.w);
        const std::uint64_t src =
            ((std::uint64_t{img0 + seg} * g.s.h + iy) * g.s.w + ix) * CIN + ch * Elem<T>::per_chunk;
        cp_async16(xs + pix * shared_pitch<T, CIN> + ch * 16, in ? x + src : x, in);
    });
    return span;
}

// TcConvFirstWgrad as the kernel takes it: the first convolution's tiles
// (TcParams) are this call's, whole rows of one image.
template <class T> struct FirstWgradArgs {
    const T* x0 = nullptr;
    const T* relu_out = nullptr;
    float* partials = nullptr;
    TcParams p{};
};
// The first convolution's input pixels in shared memory: four channels.
template <class T> using FirstPixel = std::conditional_t<std::is_same_v<T, bf16>, uint2, uint4>;

// The 16-byte chunk q of tile pixel `pixel`'s 32 channels of the ReLU's
// output in shared memory: four chunks a pixel in bf16; eight in float,
// XORed with the pixel's low bits, so that the eight pixels (rows) of a
// fragment's loads fall in different banks.
template <class T> __device__ __forceinline__ unsigned mask_chunk(unsigned pixel, unsigned q) {
    if constexpr (std::is_same_v<T, bf16>)
        return pixel * 4 + q;
    else
        return pixel * 8 + (q ^ (pixel & 7u));
}

// TcConvFirstWgrad: the ReLU's output under tile t (its 32 channels per
// pixel, where there is a ReLU) into fm and the first convolution's input
// rows under it into fx, asynchronously (cp.async, in the tile's group).
template <class T>
__device__ void copy_first_tiles(const FirstWgradArgs<T>& fw, const Geometry& g, unsigned t, std::uint32_t* fm,
                                 FirstPixel<T>* fx) {
    const TileOrigin o = tile_origin(g, t); // whole rows of one image
    if (fw.relu_out) {
        constexpr unsigned per_pixel = 32 / Elem<T>::per_chunk;
        const T* src = fw.relu_out + (std::uint64_t{o.img0} * g.s.h + o.oy0) * g.s.w * 32;
        const unsigned chunks = min(g.tile_rows, g.s.h - o.oy0) * g.s.w * per_pixel;
        for (unsigned e = threadIdx.x; e < chunks; e += conv_threads)
            cp_async16(fm + mask_chunk<T>(e / per_pixel, e % per_pixel) * 4, src + e * Elem<T>::per_chunk, true);
    }
    copy_input_pixels(fw.x0, fw.p, o.img0, o.oy0, fx);
}

// The input rows under tile t (the halo's included, where they exist) into
// L2, while the tile before it is multiplied: its copy into shared memory
// then waits on L2, not on memory. One contiguous range: whole images, or
// consecutive rows of one image.
template <class T, unsigned CIN, unsigned G>
__device__ void prefetch_tile(const T* x, const CUtensorMap& map, const Geometry& g, unsigned t) {
    const TileOrigin o = tile_origin(g, t);
    if constexpr (tma_tiles) { // the boxes themselves
        if (group_thread<G>() == 0) {
            for (unsigned p = 0; p < tile_planes<T, CIN>; ++p) {
                const BoxAt b = box_at<T, CIN>(o, p);
                tma_prefetch_4d(map, b.c, b.x, b.y, b.n);
            }
        }
        return;
    }
    const auto [img0, oy0, nimg] = o;
    // Rows y0 .. y1 - 1 of images img0 ..: whole images, or the tile's rows and their halo.
    const unsigned y0 = g.images > 1 ? 0 : (oy0 > 0 ? oy0 - 1 : 0);
    const unsigned y1 = g.images > 1 ? g.s.h : min(oy0 + g.tile_rows + 1, g.s.h);
    const std::uint64_t first = (std::uint64_t{img0} * g.s.h + y0) * g.s.w;
    const std::uint64_t pixels = (std::uint64_t{nimg - 1} * g.s.h + (y1 - y0)) * g.s.w;
    const char* base = reinterpret_cast<const char*>(x + first * CIN);
    const std::uint64_t bytes = pixels * CIN * sizeof(T);
    for (std::uint64_t off = std::uint64_t{group_thread<G>()} * 128; off < bytes; off += conv_threads * 128)
        prefetch_l2(base + off);
}

// Offset in pixels of this lane's ldmatrix row for output pixel p of the
// tile (tap 0, the window's top-left input pixel).
__device__ __forceinline__ unsigned pixel_base(const Geometry& g, unsigned p) {
    const unsigned seg = g.dseg_pixels.div(p), q = p - seg * g.seg_pixels, py = g.dw.div(q);
    return (seg * g.seg_rows + py) * g.cols_in + (q - py * g.s.w);
}

// One reduction step of a 16x8 tile: 16 bf16 or 8 tf32 channels.
template <class T>
__device__ __forceinline__ void mma_step(float (&d)[4], const std::uint32_t (&a)[4], std::uint32_t b0,
                                         std::uint32_t b1) {
    if constexpr (std::is_same_v<T, float>)
        mma_tf32_k8(d, a, b0, b1);
    else
        mma_bf16_k16(d, a, b0, b1);
}

// Batch-norm statistics of the output (TcConvStats), per block: each
// channel's sums of (v - pivot) and (v - pivot)^2 over the block's pixels, v
// the value as stored, pivot the running mean; per tile in float across a
// warp's rows and lanes, then in double per warp and channel (shared memory,
// one lane each), summed over the warps in order at the end.

// The per-warp sums live in the padding of the filter rows (16 bytes after
// each row's channels, which no ldmatrix reads): two doubles per row, the
// block's four warps x 32 channels x 2 sums in the first 128 rows, so that
// the statistics take no shared memory from the tiles (and no block per SM).
// Blocks of more than two groups keep them in a region of their own (extra).
template <class T, unsigned CIN, unsigned G>
__device__ __forceinline__ double& stat_slot(char* ws, double* extra, unsigned i) {
    if constexpr (G > 2) return extra[i];
    return reinterpret_cast<double*>(reinterpret_cast<T*>(ws) + (i / 2) * (CIN + Elem<T>::per_chunk) + CIN)[i % 2];
}

// One step of the reduce-scatter: with the lane off apart, keep the lower or
// upper W of 2 W sums (both lanes' sums of it) in v[0 .. W).
template <int W> __device__ __forceinline__ void halve(float (&v)[16], bool upper, unsigned off) {
#pragma unroll
    for (int i = 0; i < W; ++i) {
        const float lo = v[i], hi = v[W + i];
        v[i] = (upper ? hi : lo) + __shfl_xor_sync(0xffffffffu, upper ? lo : hi, off);
    }
}

// Per tile: each lane sums its rows' values of its eight channels (j * 8 +
// 2 t4 + e), then the eight lanes that share t4 halve their sixteen sums three
// times (a reduce-scatter: 14 shuffles instead of 48), so that each lane ends
// with both sums of one channel and adds them to its warp's doubles.
template <class T, unsigned CIN, unsigned MW, unsigned G>
__device__ void add_statistics(const float (&acc)[MW][4][4], const bool (&live)[MW], unsigned m0, unsigned pixels,
                               const float* pivot, char* ws, double* extra) {
    const unsigned lane = threadIdx.x % 32, gid = lane / 4, t4 = lane % 4;
    float v[16] = {}; // [j * 4 + e * 2 + k]: k 0 the sum, 1 the sum of squares
#pragma unroll
    for (unsigned m = 0; m < MW; ++m) {
        if (!live[m]) continue;
#pragma unroll
        for (unsigned half = 0; half < 2; ++half) {
            if ((m0 + m * conv_warps) * 16 + gid + 8 * half >= pixels) continue;
#pragma unroll
            for (int j = 0; j < 4; ++j)
#pragma unroll
                for (int e = 0; e < 2; ++e) {
                    const float d = stored<T>(acc[m][j][2 * half + e]) - __ldg(pivot + j * 8 + 2 * t4 + e);
                    v[j * 4 + e * 2] += d;
                    v[j * 4 + e * 2 + 1] = __fmaf_rn(d, d, v[j * 4 + e * 2 + 1]);
                }
        }
    }
    halve<8>(v, lane & 16, 16);
    halve<4>(v, lane & 8, 8);
    halve<2>(v, lane & 4, 4);
    // v[0], v[1]: channel (j, e) with j = 2 g2 + g1, e = g0 (gid's bits g2 g1 g0).
    const unsigned c = ((gid >> 2) * 2 + ((gid >> 1) & 1)) * 8 + 2 * t4 + (gid & 1);
    const unsigned first = (threadIdx.x / 32) * block_n * 2 + c * 2;
    stat_slot<T, CIN, G>(ws, extra, first) += v[0];
    stat_slot<T, CIN, G>(ws, extra, first + 1) += v[1];
}

// A 16-pixel row tile's four 8-channel column tiles into a warp's staging
// rows (pixel-major, as the output stores them): bf16 pairs, or float pairs.
template <class T>
__device__ __forceinline__ void stage_tile(const float (&acc)[4][4], std::uint32_t* stage, unsigned gid, unsigned t4) {
    constexpr unsigned p = Elem<T>::stage_pitch;
#pragma unroll
    for (int j = 0; j < 4; ++j) {
        if constexpr (std::is_same_v<T, float>) {
            *reinterpret_cast<float2*>(stage + gid * p + 8 * j + 2 * t4) = make_float2(acc[j][0], acc[j][1]);
            *reinterpret_cast<float2*>(stage + (gid + 8) * p + 8 * j + 2 * t4) = make_float2(acc[j][2], acc[j][3]);
        } else {
            stage[gid * p + 4 * j + t4] = pack_bf16(acc[j][0], acc[j][1]);
            stage[(gid + 8) * p + 4 * j + t4] = pack_bf16(acc[j][2], acc[j][3]);
        }
    }
}

// Which of a warp's 16-pixel row tiles m0, m0 + warps, ... exist.
template <unsigned MW> __device__ __forceinline__ void live_tiles(bool (&live)[MW], unsigned pixels, unsigned m0) {
#pragma unroll
    for (unsigned m = 0; m < MW; ++m) live[m] = m0 + m * conv_warps < (pixels + 15) / 16;
}

// Where this lane's ldmatrix row starts in a tile's shared memory: byte c0
// (a multiple of 32) of the channels of the pixel whose row starts at
// address row (with the lane's half, lane / 16, in bit 4). Padded rows take
// c0 as it is; TMA's swizzled planes take c0's plane and its 16-byte chunk
// XORed with bits 7 and up of the row's address (the tiles start aligned).
template <class T, unsigned CIN>
__device__ __forceinline__ unsigned a_row(unsigned row, unsigned c0, unsigned plane_bytes) {
    if constexpr (tma_tiles) {
        constexpr unsigned r = plane_row<T, CIN>;
        const unsigned swizzled = row ^ ((row >> 3) & ((r / 16 - 1) << 4));
        return (swizzled ^ (c0 % r)) + (c0 / r) * plane_bytes;
    } else {
        return row + c0;
    }
}

// A warp's 16-pixel row tiles m0, m0 + warps, ... (where they exist) times
// the block's four column tiles into acc. Shared memory is addressed in
// bytes from the buffers' converted addresses, the offsets of taps and
// channels constants where they can be.
template <class T, unsigned CIN, unsigned MW>
__device__ void multiply_tiles(const Geometry& g, const char* xs, const char* ws, unsigned pixels, unsigned m0,
                               float (&acc)[MW][4][4]) {
    constexpr unsigned mw = MW, pitch = shared_pitch<T, CIN>;
    constexpr unsigned xpitch = tma_tiles ? plane_row<T, CIN> : pitch; // bytes per tile pixel (row)
    const unsigned lane = threadIdx.x % 32, row_bytes = g.cols_in * xpitch;
    bool live[mw];
    live_tiles(live, pixels, m0);
    unsigned base[mw];
#pragma unroll
    for (unsigned m = 0; m < mw; ++m) {
        const unsigned mt = m0 + m * conv_warps;
        base[m] = smem_address(xs) + pixel_base(g, min(mt * 16 + lane % 16, pixels - 1)) * xpitch + (lane / 16) * 16;
#pragma unroll
        for (int j = 0; j < 4; ++j)
#pragma unroll
            for (int e = 0; e < 4; ++e) acc[m][j][e] = 0.0f;
    }
    // ldmatrix rows for B: lane l reads n = (2 jp + l / 16) * 8 + l % 8, k half (l / 8) % 2.
    const unsigned brow = smem_address(ws) + ((lane / 16) * 8 + lane % 8) * 9 * pitch + ((lane / 8) % 2) * 16;
    // The reduction in steps of 32 bytes of a tap's input channels, unrolled
    // (CIN a constant), each step's fragments loaded while the step before is
    // multiplied (two sets of registers).
    constexpr unsigned per_tap = CIN * sizeof(T) / 32, steps = 9 * per_tap;
    std::uint32_t a[2][mw][4], b[2][2][4];
    auto load = [&](unsigned k, unsigned set) {
        const unsigned tap = k / per_tap, c0 = (k % per_tap) * 32;
        const unsigned off = (tap / 3) * row_bytes + (tap % 3) * xpitch;
#pragma unroll
        for (unsigned jp = 0; jp < 2; ++jp) ldmatrix_x4(b[set][jp], brow + (jp * 16 * 9 + tap) * pitch + c0);
#pragma unroll
        for (unsigned m = 0; m < mw; ++m)
            if (live[m]) ldmatrix_x4(a[set][m], a_row<T, CIN>(base[m] + off, c0, g.plane_bytes));
    };
    load(0, 0);
#pragma unroll
    for (unsigned k = 0; k < steps; ++k) {
        if (k + 1 < steps) load(k + 1, (k + 1) % 2);
        const unsigned set = k % 2;
#pragma unroll
        for (unsigned m = 0; m < mw; ++m) {
            if (!live[m]) continue;
#pragma unroll
            for (int jp = 0; jp < 2; ++jp) {
                mma_step<T>(acc[m][2 * jp], a[set][m], b[set][jp][0], b[set][jp][1]);
                mma_step<T>(acc[m][2 * jp + 1], a[set][m], b[set][jp][2], b[set][jp][3]);
            }
        }
    }
}

// The products of multiply_tiles through the warp's staging rows to 16-byte
// stores of the output pixels' 32 channels (and, with Stats, into the
// statistics' sums).
template <class T, unsigned CIN, unsigned MW, bool Stats, unsigned G>
__device__ void store_tiles(const Geometry& g, const float (&acc)[MW][4][4], char* ws, double* extra, unsigned pixels,
                            unsigned m0, T* y, std::uint32_t* stage, const float* pivot) {
    constexpr unsigned mw = MW;
    const unsigned lane = threadIdx.x % 32, gid = lane / 4, t4 = lane % 4;
    bool live[mw];
    live_tiles(live, pixels, m0);
    if constexpr (Stats) add_statistics<T, CIN, mw, G>(acc, live, m0, pixels, pivot, ws, extra);
    constexpr unsigned chunks = block_n * sizeof(T) / 16; // 16-byte chunks per output pixel
#pragma unroll
    for (unsigned m = 0; m < mw; ++m) {
        if (!live[m]) continue;
        const unsigned mt = m0 + m * conv_warps;
        stage_tile<T>(acc[m], stage, gid, t4);
        __syncwarp();
        const unsigned valid = min(16u, pixels - mt * 16) * chunks;
        for (unsigned e = lane; e < valid; e += 32) {
            // The chunk's word in the staging rows (e * 4 where they are not padded).
            const unsigned word =
                Elem<T>::stage_pitch == chunks * 4 ? e * 4 : (e / chunks) * Elem<T>::stage_pitch + (e % chunks) * 4;
            *reinterpret_cast<uint4*>(y + std::uint64_t{mt * 16 + e / chunks} * g.s.cout +
                                      (e % chunks) * Elem<T>::per_chunk) =
                *reinterpret_cast<const uint4*>(stage + word);
        }
        __syncwarp();
    }
}

// The most partials rows a TcConvFirstWgrad call writes (its blocks). Its
// tiles are narrow (two row tiles per warp): the weight gradient's sums then
// stay in registers at four blocks per SM, where wide tiles measured slower
// in bf16 at the three that their registers leave (float tiles' shared
// memory leaves two blocks per SM either way).
unsigned first_wgrad_rows() {
    return sm_count() * blocks_per_sm;
}

// The first convolution's weight gradient from a warp's products (acc, 32
// channels of dy per pixel), one 16-pixel row tile from tile pixel p0 at a
// time. Staged as direct_conv's weight gradient stages dy: masked by the
// ReLU's output (where mask), rounded as that kernel's dy is (bf16 as stored;
// float as stored, then to TF32), zero past the tile's pixels; bf16 in rows
// of four 16-byte chunks swizzled for ldmatrix.trans, float in rows of 40
// words (Elem<float>::stage_pitch: a fragment's eight channels and four
// pixels in different banks).
__device__ __forceinline__ unsigned first_dy_chunk(unsigned r, unsigned q) {
    return r * 4 + (q ^ ((r >> 1) & 3u));
}
template <class T>
__device__ __forceinline__ void stage_first_dy(const float (&acc)[4][4], std::uint32_t* stage, const std::uint32_t* fm,
                                               bool mask, unsigned pixels, unsigned p0) {
    const unsigned lane = threadIdx.x % 32, gid = lane / 4, t4 = lane % 4;
#pragma unroll
    for (unsigned half = 0; half < 2; ++half) {
        const unsigned r = gid + 8 * half, q = p0 + r, mq = min(q, pixels - 1);
#pragma unroll
        for (int j = 0; j < 4; ++j) {
            const float v0 = q < pixels ? acc[j][2 * half] : 0.0f, v1 = q < pixels ? acc[j][2 * half + 1] : 0.0f;
            if constexpr (std::is_same_v<T, bf16>) { // the mask tile: 16 words of bf16 pairs per pixel
                const std::uint32_t v = pack_bf16(v0, v1);
                stage[first_dy_chunk(r, j) * 4 + t4] = mask ? relu_masked_bf16x2(v, fm[mq * 16 + 4 * j + t4]) : v;
            } else { // channels 8 j + 2 t4, + 1: chunk 2 j + t4 / 2
                std::uint32_t w0 = to_tf32(v0), w1 = to_tf32(v1);
                if (mask) {
                    const uint2 m =
                        *reinterpret_cast<const uint2*>(fm + mask_chunk<T>(mq, 2 * j + t4 / 2) * 4 + t4 % 2 * 2);
                    w0 = relu_masked_f32(w0, m.x), w1 = relu_masked_f32(w1, m.y);
                }
                *reinterpret_cast<uint2*>(stage + r * Elem<T>::stage_pitch + 8 * j + 2 * t4) = make_uint2(w0, w1);
            }
        }
    }
}
// Then the row tile's two k8 steps against the input tile fx, into sums.
template <class T>
__device__ __forceinline__ void first_wgrad_steps(const std::uint32_t* stage, const FirstPixel<T>* fx,
                                                  const TcParams& p, unsigned pixels, unsigned p0,
                                                  float (&sums)[2][tcw_ntiles][4]) {
    const unsigned lane = threadIdx.x % 32, gid = lane / 4, t4 = lane % 4;
#pragma unroll
    for (unsigned ks = 0; ks < 2; ++ks) {
        if constexpr (std::is_same_v<T, bf16>) {
            std::uint32_t v[4];
            ldmatrix_x4_trans(v, stage + first_dy_chunk(ks * 8 + lane % 8, lane / 8) * 4);
            const std::uint32_t a[2][2] = {{v[0], v[1]}, {v[2], v[3]}};
            const unsigned q = p0 + ks * 8 + 2 * t4;
            tcw_products_bf16<2, true>(a, fx, p, q, q + 1, pixels, sums);
        } else { // A: rows gid, gid + 8 (channels) of pixels t4, t4 + 4
            constexpr unsigned row = Elem<T>::stage_pitch;
            const unsigned r0 = ks * 8 + t4;
            std::uint32_t a[2][4];
#pragma unroll
            for (int m = 0; m < 2; ++m) {
                const unsigned k = 16 * m + gid;
                a[m][0] = stage[r0 * row + k], a[m][1] = stage[r0 * row + k + 8];
                a[m][2] = stage[(r0 + 4) * row + k], a[m][3] = stage[(r0 + 4) * row + k + 8];
            }
            tcw_products_tf32<2, true, true>(a, fx, p, p0 + r0, p0 + r0 + 4, pixels, sums); // fx as copied
        }
    }
}
template <class T, unsigned MW>
__device__ void add_first_wgrad(const float (&acc)[MW][4][4], std::uint32_t* stage, const std::uint32_t* fm,
                                const FirstPixel<T>* fx, const FirstWgradArgs<T>& fw, unsigned pixels, unsigned m0,
                                float (&sums)[2][tcw_ntiles][4]) {
    bool live[MW];
    live_tiles(live, pixels, m0);
#pragma unroll
    for (unsigned m = 0; m < MW; ++m) {
        if (!live[m]) continue;
        const unsigned p0 = (m0 + m * conv_warps) * 16;
        stage_first_dy<T>(acc[m], stage, fm, fw.relu_out != nullptr, pixels, p0);
        __syncwarp();
        first_wgrad_steps<T>(stage, fx, fw.p, pixels, p0, sums);
        __syncwarp();
    }
}

// Whether the next tile's copy starts before the products are stored (and
// runs while they are, once every warp has multiplied): measured faster in
// float (twice the bytes per tile); in bf16 each warp storing as soon as it
// has multiplied measured faster. Never with TcConvFirstWgrad: its epilogue
// reads the tile's mask and input tiles, which the next copy overwrites.
template <class T, bool First> constexpr bool early_copy = std::is_same_v<T, float> && !First;

// The barrier among a group's threads (group_thread): the block's where it
// has one group, else a named barrier per group (0 is __syncthreads').
template <unsigned G> __device__ __forceinline__ void group_sync() {
    if constexpr (G == 1)
        __syncthreads();
    else
        asm volatile("bar.sync %0, %1;" ::"r"(1 + threadIdx.x / conv_threads), "n"(conv_threads) : "memory");
}

// Blocks stride over the pixel tiles with their 32 filters loaded once;
// blockIdx.y picks the output channels. One buffer per group of four warps
// (G groups per block, the filters shared): while a group waits for its
// tile's rows, the others on the SM multiply (a second buffer per block,
// fewer blocks per SM, measured slower); the next tile's copy starts once
// every warp of the group has multiplied (early_copy), its rows already on
// their way into L2 (prefetch_tile). With TMA (tma_tiles) the group's thread
// 0 starts each copy and the group waits on its barrier in shared memory,
// one phase per tile. Shared memory: the groups' tiles, the filters, the
// groups' staging rows, their barriers (and TcConvFirstWgrad's tiles, or the
// statistics' sums of more than two groups).
template <class T, unsigned CIN, unsigned MW, bool Stats, bool First, unsigned G = 1>
__global__ void __launch_bounds__(conv_threads* G, G == 1 ? min_blocks_per_sm<T, CIN> : 1)
    tc_conv_kernel(const T* x, const T* w, T* y, Geometry g, TcConvStats stats, FirstWgradArgs<T> fw,
                   const __grid_constant__ CUtensorMap map) {
    await_predecessor();
    static_assert(G == 1 || !First, "TcConvFirstWgrad's tiles are one group's");
    extern __shared__ uint4 smem[];
    char* const x0 =
        reinterpret_cast<char*>(smem) + (tma_tiles ? (tma_align - smem_address(smem) % tma_align) % tma_align : 0);
    const unsigned group = G == 1 ? 0 : threadIdx.x / conv_threads;
    char* const xs = x0 + group * g.x_bytes;
    char* const ws = x0 + G * g.x_bytes;
    auto* const stages = reinterpret_cast<std::uint32_t*>(ws + g.w_bytes);
    auto* stage = stages + (threadIdx.x / 32) * Elem<T>::stage_words;
    auto* const bars = stages + G * conv_warps * Elem<T>::stage_words;
    const unsigned bar = smem_address(bars + 2 * group); // TMA's barrier
    auto* const fm = bars + 4;                           // after the barrier, 16-byte aligned
    auto* const fx = reinterpret_cast<FirstPixel<T>*>(fm + g.mask_bytes / 4);
    double* const extra = G > 2 ? reinterpret_cast<double*>(bars + 2 * G) : nullptr; // (stat_slot)
    float sums[2][tcw_ntiles][4] = {}; // First: the first convolution's weight gradient
    if (tma_tiles && group_thread<G>() == 0) mbarrier_init(bar);
    const unsigned n0 = blockIdx.y * block_n;
    load_filters<T, CIN, G>(w, n0, ws);
    const float* const pivot = Stats ? stats.pivot + n0 : nullptr; // the block's channels' running means
    if constexpr (Stats)
        for (unsigned e = threadIdx.x; e < G * conv_warps * block_n * 2; e += G * conv_threads)
            stat_slot<T, CIN, G>(ws, extra, e) = 0.0;
    const unsigned m0 = group_thread<G>() / 32;
    if constexpr (tma_tiles) __syncthreads(); // the barrier is set up before anyone waits on it
    // (The block's index and the grid's size read where they are used, not
    // held in registers through the products.)
    TileSpan span{};
    if (G == 1 || blockIdx.x * G + group < g.tiles)
        span = load_tile<T, CIN, G>(x, map, g, blockIdx.x * G + group, xs, bar);
    if constexpr (First) copy_first_tiles(fw, g, blockIdx.x, fm, fx);
    cp_async_commit();
    if constexpr (G > 1) { // every group multiplies with every thread's filters
        cp_async_wait<0>();
        round_copies<T, CIN, G>(xs, ws, 0, true);
        __syncthreads();
    }
    for (unsigned t = blockIdx.x * G + group, phase = 0; t < g.tiles; t += gridDim.x * G, phase ^= 1) {
        if (t + gridDim.x * G < g.tiles) prefetch_tile<T, CIN, G>(x, map, g, t + gridDim.x * G);
        cp_async_wait<0>(); // this tile's rows (and, the first time, the filters)
        if constexpr (tma_tiles) mbarrier_wait(bar, phase);
        round_copies<T, CIN, G>(xs, ws, span.copied, G == 1 && t == blockIdx.x);
        group_sync<G>();
        float acc[MW][4][4];
        multiply_tiles<T, CIN, MW>(g, xs, ws, span.pixels, m0, acc);
        const TileSpan done = span;
        auto store = [&] {
            if constexpr (First)
                add_first_wgrad<T, MW>(acc, stage, fm, fx, fw, done.pixels, m0, sums);
            else
                store_tiles<T, CIN, MW, Stats, G>(g, acc, ws, extra, done.pixels, m0, y + done.first * g.s.cout + n0,
                                                  stage, pivot);
        };
        if constexpr (!early_copy<T, First>) store(); // each warp as soon as it has multiplied
        // Every warp is done with the buffer before the next tile's copy starts.
        group_sync<G>();
        if (t + gridDim.x * G < g.tiles) {
            span = load_tile<T, CIN, G>(x, map, g, t + gridDim.x * G, xs, bar);
            if constexpr (First) copy_first_tiles(fw, g, t + gridDim.x * G, fm, fx);
            cp_async_commit();
        }
        if constexpr (early_copy<T, First>) store();
    }
    if constexpr (First) {
        __syncthreads(); // every warp is done with the tiles (the sums' shared memory)
        float* row = fw.partials + std::uint64_t{blockIdx.x} * tcw_partials_row(fw.p.s.c, 32, true);
        write_tcw_partials<conv_warps, 2, true>(sums, reinterpret_cast<float*>(xs), fw.p.s.c, row);
    }
    if constexpr (Stats) {
        __syncthreads(); // every warp's sums are in
        if (threadIdx.x >= block_n * 2) return;
        double total = 0.0;
        for (unsigned wp = 0; wp < G * conv_warps; ++wp)
            total += stat_slot<T, CIN, G>(ws, extra, wp * block_n * 2 + threadIdx.x);
        const unsigned c = n0 + threadIdx.x / 2, k = threadIdx.x % 2;
        stats.partials[(std::uint64_t{c} * gridDim.x + blockIdx.x) * 2 + k] = total;
    }
}

// The tensor map of input x for TMA's tile copies ([n][h][w][c] as four
// dimensions, channels innermost; one box a tile's segments in one plane),
// or an unused one without TMA. Floats come as TF32 (TFLOAT32): TMA rounds
// them to nearest, ties to even (measured on an H100), where round_copies
// rounds ties away; both unbiased, which the CPU comparisons need.
CUtensorMap tile_map(const void* x, const Geometry& g) {
    if (!g.tma) return CUtensorMap{};
    const TcConvShape& s = g.s;
    const unsigned size = s.tf32 ? sizeof(float) : sizeof(bf16), row = plane_row_of(s.cin * size);
    const cuuint64_t dims[4] = {s.cin, s.w, s.h, s.n};
    const cuuint64_t strides[3] = {std::uint64_t{s.cin} * size, std::uint64_t{s.cin} * size * s.w,
                                   std::uint64_t{s.cin} * size * s.w * s.h};
    const cuuint32_t box[4] = {row / size, g.cols_in, g.seg_rows, g.images};
    const CUtensorMapSwizzle swizzle = row == 128  ? CU_TENSOR_MAP_SWIZZLE_128B
                                       : row == 64 ? CU_TENSOR_MAP_SWIZZLE_64B
                                                   : CU_TENSOR_MAP_SWIZZLE_32B;
    return encode_tensor_map(s.tf32 ? CU_TENSOR_MAP_DATA_TYPE_TFLOAT32 : CU_TENSOR_MAP_DATA_TYPE_BFLOAT16, 4, x, dims,
                             strides, box, swizzle, CU_TENSOR_MAP_L2_PROMOTION_L2_256B,
                             "tc_conv's input of " + std::to_string(s.n) + "x" + std::to_string(s.h) + "x" +
                                 std::to_string(s.w) + "x" + std::to_string(s.cin));
}

template <class T, unsigned CIN, unsigned MW, bool Stats, bool First = false, unsigned G = 1>
unsigned launch_for(const T* x, const T* filters, T* y, const Geometry& g, const TcConvStats& stats,
                    unsigned max_blocks, cudaStream_t s, const FirstWgradArgs<T>& fw = {}) {
    auto* kernel = tc_conv_kernel<T, CIN, MW, Stats, First, G>;
    static std::once_flag once;
    std::call_once(once, [&] {
        const std::uint64_t most = G == 1 ? max_shared() : block_shared_limit();
        CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(most)));
    });
    int per_sm = 0;
    CUDA_CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, kernel, conv_threads * G, g.shared));
    const unsigned ny = g.s.cout / block_n;
    const std::uint64_t slots = std::uint64_t{sm_count()} * static_cast<unsigned>(std::max(1, per_sm));
    const std::uint64_t block_tiles = (g.tiles + G - 1) / G; // the most blocks with a tile for every group
    const auto bx = static_cast<unsigned>(
        std::clamp<std::uint64_t>(slots / ny, 1, std::min<std::uint64_t>(block_tiles, max_blocks)));
    launch_kernel(kernel, dim3(bx, ny), conv_threads * G, g.shared, s, x, filters, y, g, stats, fw, tile_map(x, g));
    return bx;
}

// A forward or data gradient in blocks of G groups: the kernel for the
// tiles' width (g.mw) and for whether it sums statistics.
template <class T, unsigned CIN, unsigned G>
unsigned launch_tiles(const T* x, const T* filters, T* y, const Geometry& g, const TcConvStats& stats,
                      unsigned max_blocks, cudaStream_t s) {
    const bool wide = g.mw == wide_mtiles;
    if (stats.partials)
        return wide ? launch_for<T, CIN, wide_mtiles, true, false, G>(x, filters, y, g, stats, max_blocks, s)
                    : launch_for<T, CIN, narrow_mtiles, true, false, G>(x, filters, y, g, stats, max_blocks, s);
    return wide ? launch_for<T, CIN, wide_mtiles, false, false, G>(x, filters, y, g, stats, max_blocks, s)
                : launch_for<T, CIN, narrow_mtiles, false, false, G>(x, filters, y, g, stats, max_blocks, s);
}

// The forward or data gradient in stored type T (bf16, or float with tf32
// products), cin a multiple of 16 up to MaxCin (tc_conv_supported).
template <class T, unsigned MaxCin>
unsigned launch_typed(const void* x, const void* w, void* y, const Geometry& g, void* scratch, cudaStream_t stream,
                      const TcConvStats& stats, const FirstWgradArgs<T>* fw) {
    const TcConvShape& s = g.s;
    const T* filters = static_cast<const T*>(w);
    if (s.data_gradient && scratch) {
        launch_turn_filters(w, scratch, s, stream);
        filters = static_cast<const T*>(scratch);
    }
    const unsigned max_blocks = stats.partials ? stats.max_splits : ~0u;
    const auto* in = static_cast<const T*>(x);
    auto* outp = static_cast<T*>(y);
    unsigned blocks = 0;
    with_constant<MaxCin / 16>(s.cin / 16, [&](auto c) {
        constexpr unsigned cin = 16 * decltype(c)::value;
        if constexpr (cin <= max_cin_first_wgrad) {
            if (fw) {
                blocks = launch_for<T, cin, narrow_mtiles, false, true>(in, filters, outp, g, stats, first_wgrad_rows(),
                                                                        stream, *fw);
                return;
            }
        }
        if constexpr (std::is_same_v<T, float>) { // (groups: float only, grouped_geometry)
            if (g.groups > 1) {
                blocks = g.groups == 2
                             ? launch_tiles<T, cin, 2>(in, filters, outp, g, stats, max_blocks, stream)
                             : launch_tiles<T, cin, max_groups>(in, filters, outp, g, stats, max_blocks, stream);
                return;
            }
        }
        blocks = launch_tiles<T, cin, 1>(in, filters, outp, g, stats, max_blocks, stream);
    });
    return blocks;
}

} // namespace

// tma.cuh
CUtensorMap encode_tensor_map(CUtensorMapDataType type, unsigned rank, const void* base, const cuuint64_t* dims,
                              const cuuint64_t* strides, const cuuint32_t* box, CUtensorMapSwizzle swizzle,
                              CUtensorMapL2promotion promotion, const std::string& what) {
    static const PFN_cuTensorMapEncodeTiled_v12000 encode = [] {
        void* f = nullptr;
        cudaDriverEntryPointQueryResult found{};
        CUDA_CHECK(cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &f, 12000, cudaEnableDefault, &found));
        if (found != cudaDriverEntryPointSuccess || f == nullptr)
            throw Error(ExitCode::failure, "the CUDA driver has no cuTensorMapEncodeTiled, which the tensor "
                                           "memory accelerator needs: install an NVIDIA driver for CUDA 12 or later");
        return reinterpret_cast<PFN_cuTensorMapEncodeTiled_v12000>(f);
    }();
    CUtensorMap map{};
    const cuuint32_t steps[5] = {1, 1, 1, 1, 1};
    const CUresult r = encode(&map, type, rank, const_cast<void*>(base), dims, strides, box, steps,
                              CU_TENSOR_MAP_INTERLEAVE_NONE, swizzle, promotion, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
    if (r != CUDA_SUCCESS)
        throw Error(ExitCode::failure, "cuTensorMapEncodeTiled failed (error " + std::to_string(r) + ") for " + what);
    return map;
}

void launch_turn_filters(const void* w, void* out, const TcConvShape& s, cudaStream_t stream) {
    const unsigned total = 9 * s.cin * s.cout;
    if (s.tf32)
        launch_kernel(turn_filters_kernel<float>, (total + 255) / 256, 256, 0, stream, static_cast<const float*>(w),
                      static_cast<float*>(out), s.cin, s.cout);
    else
        launch_kernel(turn_filters_kernel<bf16>, (total + 255) / 256, 256, 0, stream, static_cast<const bf16*>(w),
                      static_cast<bf16*>(out), s.cin, s.cout);
}

std::uint64_t tc_conv_scratch(const TcConvShape& s) {
    return s.data_gradient ? std::uint64_t{9} * s.cin * s.cout * (s.tf32 ? sizeof(float) : sizeof(bf16)) : 0;
}

bool tc_conv_supported(const TcConvShape& s) {
    const unsigned max_cin = s.tf32 ? max_cin_float : max_cin_bf16;
    if (s.n < 1 || s.h < 1 || s.w < 1 || s.w > max_width) return false;
    if (s.cin == 0 || s.cin % 16 != 0 || s.cin > max_cin || s.cout == 0 || s.cout % block_n != 0) return false;
    if (std::uint64_t{s.n} * s.h * s.w * std::max(s.cin, s.cout) >= narrow_limit) return false;
    // Either way of copying tiles (launch_tc_conv picks by the code here); a
    // TMA box side (segment rows, images) of at most 256.
    const Geometry tma = geometry_of(s, true);
    if (tma.seg_rows > tma_max_box || tma.images > tma_max_box || tma.shared > max_shared()) return false;
    return geometry_of(s, false).shared <= max_shared();
}

namespace {

// TMA where the kernels' code here is compute_90's (tma_tiles).
bool tma_compiled(bool tf32) {
    return tf32 ? compiled_for_sm90(tc_conv_kernel<float, 16, narrow_mtiles, false, false>)
                : compiled_for_sm90(tc_conv_kernel<bf16, 16, narrow_mtiles, false, false>);
}

// The geometry with TcConvFirstWgrad's tiles after the barrier (16 bytes
// kept for it, unused without TMA): the ReLU's output under a tile, then the
// first convolution's input rows.
Geometry with_first_tile(Geometry g, const TcParams& p) {
    g.mask_bytes = g.tile_rows * g.s.w * 32 * (g.s.tf32 ? sizeof(float) : sizeof(bf16));
    const unsigned input_bytes = p.rows_in * p.cols_in * (g.s.tf32 ? sizeof(uint4) : sizeof(uint2));
    g.shared += (g.tma ? 8 : 16) + g.mask_bytes + input_bytes;
    return g;
}

} // namespace

bool tc_conv_takes_first_wgrad(const TcConvShape& s, const DirectConvShape& first) {
    if (!s.data_gradient || s.cout != block_n || s.cin > max_cin_first_wgrad || !tc_conv_supported(s)) return false;
    if (first.k != block_n || first.oh != s.h || first.ow != s.w || first.n < s.n || first.tf32 != s.tf32 ||
        !direct_conv_wgrad_takes_bn(s.tf32 ? ActType::f32 : ActType::bf16, first))
        return false;
    for (const bool tma : {false, true}) {
        const Geometry g = geometry_for(s, narrow_mtiles, tma);
        const Geometry f = with_first_tile(g, tc_params_with_rows(first, g.tile_rows));
        // Whole rows of one image per tile; the block's sums fit where its tiles were.
        if (g.images != 1 || f.shared > max_shared() || g.x_bytes + g.w_bytes < tcw_partials_shared(conv_warps, 2))
            return false;
    }
    return true;
}

std::uint64_t tc_conv_first_wgrad_workspace(const DirectConvShape& first) {
    return std::uint64_t{first_wgrad_rows()} * tcw_partials_row(first.c, first.k, true) * sizeof(float);
}

unsigned tc_conv_groups(const TcConvShape& s) {
    return grouped_geometry(s, tma_compiled(s.tf32)).groups;
}

unsigned launch_tc_conv(const void* x, const void* w, void* y, const TcConvShape& s, void* scratch, cudaStream_t stream,
                        const TcConvStats& stats, const TcConvFirstWgrad* first) {
    const bool tma = tma_compiled(s.tf32);
    const Geometry g = first ? geometry_of(s, tma) : grouped_geometry(s, tma);
    const auto typed = [&](auto tag) {
        using T = decltype(tag);
        constexpr unsigned max_cin = std::is_same_v<T, float> ? max_cin_float : max_cin_bf16;
        if (!first) return launch_typed<T, max_cin>(x, w, y, g, scratch, stream, stats, nullptr);
        FirstWgradArgs<T> fw;
        fw.x0 = static_cast<const T*>(first->x0);
        fw.relu_out = static_cast<const T*>(first->relu_out);
        fw.partials = first->partials;
        const Geometry narrow = geometry_for(s, narrow_mtiles, g.tma); // see first_wgrad_rows
        fw.p = tc_params_with_rows(first->first, narrow.tile_rows);
        fw.p.s.n = s.n;
        return launch_typed<T, max_cin>(x, w, y, with_first_tile(narrow, fw.p), scratch, stream, stats, &fw);
    };
    return s.tf32 ? typed(float{}) : typed(bf16{});
}

} // namespace dstk::train::cuda
