// The data path's small kernels: the row gather of the resident placements and
// the benchmark's consumer.
#include "dstk/data/gpu_ops.hpp"

#include <cuda_runtime.h>

#include "cuda_check.hpp"

namespace dstk::data::kernels {
namespace {

cudaStream_t as_stream(void* s) {
    return static_cast<cudaStream_t>(s);
}

// One block per row, in the widest words the row's size and alignment allow.
template <typename Word>
__global__ void gather_kernel(Word* __restrict__ dst, const Word* __restrict__ src, std::uint64_t row_words,
                              const std::uint64_t* __restrict__ idx, std::uint32_t count) {
    const std::uint32_t row = blockIdx.x;
    if (row >= count) return;
    const Word* s = src + idx[row] * row_words;
    Word* d = dst + std::uint64_t{row} * row_words;
    for (std::uint64_t i = threadIdx.x; i < row_words; i += blockDim.x) d[i] = s[i];
}

// Rows of Word-sized words: a warp at least, up to 128 threads per row (a
// label's row is one thread's work).
template <typename Word>
void launch_gather(void* dst, const void* src, std::uint64_t row_bytes, const std::uint64_t* idx, std::uint32_t count,
                   cudaStream_t stream) {
    const std::uint64_t words = row_bytes / sizeof(Word);
    const unsigned threads = static_cast<unsigned>(words >= 128 ? 128 : (words + 31) / 32 * 32);
    gather_kernel<Word>
        <<<count, threads, 0, stream>>>(static_cast<Word*>(dst), static_cast<const Word*>(src), words, idx, count);
    CUDA_CHECK(cudaGetLastError());
}

bool aligned_rows(const void* dst, const void* src, std::uint64_t row_bytes, std::uint64_t word) {
    return row_bytes % word == 0 && reinterpret_cast<std::uintptr_t>(dst) % word == 0 &&
           reinterpret_cast<std::uintptr_t>(src) % word == 0;
}

} // namespace

void gather_rows_async(void* dst, const void* src, std::uint64_t row_bytes, const std::uint64_t* idx,
                       std::uint32_t count, void* stream) {
    if (count == 0 || row_bytes == 0) return;
    if (aligned_rows(dst, src, row_bytes, 16))
        launch_gather<uint4>(dst, src, row_bytes, idx, count, as_stream(stream));
    else if (aligned_rows(dst, src, row_bytes, 4))
        launch_gather<unsigned>(dst, src, row_bytes, idx, count, as_stream(stream));
    else
        launch_gather<unsigned char>(dst, src, row_bytes, idx, count, as_stream(stream));
}

namespace {

// Reads every word of [p, p + words) once, XOR-folded into *sink so that the
// reads cannot be optimised away: a consumer that touches a batch as a model's
// first layer would.
template <typename Word>
__global__ void consume_kernel(const Word* __restrict__ p, std::uint64_t words, unsigned long long* sink) {
    unsigned long long acc = 0;
    for (std::uint64_t i = blockIdx.x * std::uint64_t{blockDim.x} + threadIdx.x; i < words;
         i += std::uint64_t{gridDim.x} * blockDim.x) {
        const Word w = p[i];
        if constexpr (sizeof(Word) == 16)
            acc ^=
                (static_cast<unsigned long long>(w.x) << 32 | w.y) ^ (static_cast<unsigned long long>(w.z) << 32 | w.w);
        else
            acc ^= w;
    }
    if (acc != 0) atomicXor(sink, acc);
}

} // namespace

void consume_async(const void* p, std::uint64_t bytes, unsigned long long* sink, void* stream) {
    if (bytes == 0) return;
    const bool wide = bytes % 16 == 0 && reinterpret_cast<std::uintptr_t>(p) % 16 == 0;
    const std::uint64_t words = wide ? bytes / 16 : bytes;
    const std::uint64_t want = (words + 255) / 256;
    const unsigned blocks = static_cast<unsigned>(want < 1024 ? want : 1024);
    if (wide)
        consume_kernel<uint4><<<blocks, 256, 0, as_stream(stream)>>>(static_cast<const uint4*>(p), words, sink);
    else
        consume_kernel<unsigned char>
            <<<blocks, 256, 0, as_stream(stream)>>>(static_cast<const unsigned char*>(p), words, sink);
    CUDA_CHECK(cudaGetLastError());
}

} // namespace dstk::data::kernels
