#include "cpu_ops.hpp"

#include <algorithm>
#include <cstring>
#include <vector>

#if defined(__x86_64__)
#include <immintrin.h>
#endif

namespace dstk::train::cpu {
namespace {

constexpr int mr = 6, nr = 16;
constexpr int kc_block = 256, mc_block = 120, nc_block = 2048;

// Packs op(A)[i0:i0+mc, p0:p0+kc] into panels of mr rows, k-major, zero-padded.
void pack_a(bool ta, const float* a, int lda, int i0, int mc, int p0, int kc, float* out) {
    for (int i = 0; i < mc; i += mr) {
        const int rows = std::min(mr, mc - i);
        for (int p = 0; p < kc; ++p) {
            for (int r = 0; r < rows; ++r) {
                const int ii = i0 + i + r, pp = p0 + p;
                out[r] = ta ? a[static_cast<std::int64_t>(pp) * lda + ii] : a[static_cast<std::int64_t>(ii) * lda + pp];
            }
            for (int r = rows; r < mr; ++r) out[r] = 0.0f;
            out += mr;
        }
    }
}

// Packs op(B)[p0:p0+kc, j0:j0+nc] into panels of nr columns, k-major, zero-padded.
void pack_b(bool tb, const float* b, int ldb, int p0, int kc, int j0, int nc, float* out) {
    for (int j = 0; j < nc; j += nr) {
        const int cols = std::min(nr, nc - j);
        for (int p = 0; p < kc; ++p) {
            const int pp = p0 + p;
            if (!tb) {
                const float* src = b + static_cast<std::int64_t>(pp) * ldb + j0 + j;
                std::memcpy(out, src, sizeof(float) * cols);
            } else {
                for (int q = 0; q < cols; ++q) out[q] = b[static_cast<std::int64_t>(j0 + j + q) * ldb + pp];
            }
            for (int q = cols; q < nr; ++q) out[q] = 0.0f;
            out += nr;
        }
    }
}

// acc[mr][nr] = Ap * Bp over kc; then C[rows][cols] += alpha * acc.
void micro_generic(int kc, const float* ap, const float* bp, float alpha, float* c, int ldc, int rows, int cols) {
    float acc[mr][nr] = {};
    for (int p = 0; p < kc; ++p) {
        for (int r = 0; r < mr; ++r) {
            const float av = ap[p * mr + r];
            for (int q = 0; q < nr; ++q) acc[r][q] += av * bp[p * nr + q];
        }
    }
    for (int r = 0; r < rows; ++r)
        for (int q = 0; q < cols; ++q) c[static_cast<std::int64_t>(r) * ldc + q] += alpha * acc[r][q];
}

#if defined(__x86_64__)
__attribute__((target("avx2,fma"))) void micro_avx2(int kc, const float* ap, const float* bp, float alpha, float* c,
                                                    int ldc, int rows, int cols) {
    __m256 acc[mr][2];
    for (int r = 0; r < mr; ++r) acc[r][0] = acc[r][1] = _mm256_setzero_ps();
    for (int p = 0; p < kc; ++p) {
        const __m256 b0 = _mm256_loadu_ps(bp + p * nr), b1 = _mm256_loadu_ps(bp + p * nr + 8);
        for (int r = 0; r < mr; ++r) {
            const __m256 av = _mm256_broadcast_ss(ap + p * mr + r);
            acc[r][0] = _mm256_fmadd_ps(av, b0, acc[r][0]);
            acc[r][1] = _mm256_fmadd_ps(av, b1, acc[r][1]);
        }
    }
    const __m256 va = _mm256_set1_ps(alpha);
    if (cols == nr) {
        for (int r = 0; r < rows; ++r) {
            float* cr = c + static_cast<std::int64_t>(r) * ldc;
            _mm256_storeu_ps(cr, _mm256_fmadd_ps(va, acc[r][0], _mm256_loadu_ps(cr)));
            _mm256_storeu_ps(cr + 8, _mm256_fmadd_ps(va, acc[r][1], _mm256_loadu_ps(cr + 8)));
        }
        return;
    }
    alignas(32) float tmp[nr];
    for (int r = 0; r < rows; ++r) {
        _mm256_store_ps(tmp, acc[r][0]);
        _mm256_store_ps(tmp + 8, acc[r][1]);
        float* cr = c + static_cast<std::int64_t>(r) * ldc;
        for (int q = 0; q < cols; ++q) cr[q] += alpha * tmp[q];
    }
}
#endif

using MicroKernel = void (*)(int, const float*, const float*, float, float*, int, int, int);

MicroKernel pick_micro() {
#if defined(__x86_64__)
    if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma")) return micro_avx2;
#endif
    return micro_generic;
}

const MicroKernel micro = pick_micro();

} // namespace

void gemm(bool ta, bool tb, int m, int n, int k, float alpha, const float* a, int lda, const float* b, int ldb,
          float beta, float* c, int ldc) {
    if (m <= 0 || n <= 0) return;
    for (int i = 0; i < m; ++i) {
        float* cr = c + static_cast<std::int64_t>(i) * ldc;
        if (beta == 0.0f)
            std::fill(cr, cr + n, 0.0f);
        else if (beta != 1.0f)
            for (int j = 0; j < n; ++j) cr[j] *= beta;
    }
    if (k <= 0 || alpha == 0.0f) return;
    thread_local std::vector<float> abuf, bbuf;
    abuf.resize(static_cast<std::size_t>(mc_block + mr) * kc_block);
    bbuf.resize(static_cast<std::size_t>(nc_block + nr) * kc_block);
    for (int j0 = 0; j0 < n; j0 += nc_block) {
        const int nc = std::min(nc_block, n - j0);
        for (int p0 = 0; p0 < k; p0 += kc_block) {
            const int kc = std::min(kc_block, k - p0);
            pack_b(tb, b, ldb, p0, kc, j0, nc, bbuf.data());
            for (int i0 = 0; i0 < m; i0 += mc_block) {
                const int mc = std::min(mc_block, m - i0);
                pack_a(ta, a, lda, i0, mc, p0, kc, abuf.data());
                for (int j = 0; j < nc; j += nr)
                    for (int i = 0; i < mc; i += mr)
                        micro(kc, abuf.data() + static_cast<std::size_t>(i) * kc,
                              bbuf.data() + static_cast<std::size_t>(j) * kc, alpha,
                              c + static_cast<std::int64_t>(i0 + i) * ldc + j0 + j, ldc, std::min(mr, mc - i),
                              std::min(nr, nc - j));
            }
        }
    }
}

void im2col(const ConvGeom& g, const float* x, float* col) {
    for (int ch = 0; ch < g.c; ++ch)
        for (int ky = 0; ky < g.k; ++ky)
            for (int kx = 0; kx < g.k; ++kx) {
                float* out = col + (static_cast<std::int64_t>(ch) * g.k * g.k + ky * g.k + kx) * g.oh * g.ow;
                const float* src = x + static_cast<std::int64_t>(ch) * g.h * g.w;
                for (int oy = 0; oy < g.oh; ++oy) {
                    const int iy = oy * g.stride - g.pad + ky;
                    float* o = out + oy * g.ow;
                    if (iy < 0 || iy >= g.h) {
                        std::fill(o, o + g.ow, 0.0f);
                        continue;
                    }
                    const float* row = src + iy * g.w;
                    if (g.stride == 1) {
                        const int lo = std::max(0, g.pad - kx), hi = std::min(g.ow, g.w + g.pad - kx);
                        for (int ox = 0; ox < lo; ++ox) o[ox] = 0.0f;
                        if (hi > lo) std::memcpy(o + lo, row + lo - g.pad + kx, sizeof(float) * (hi - lo));
                        for (int ox = std::max(lo, hi); ox < g.ow; ++ox) o[ox] = 0.0f;
                    } else {
                        for (int ox = 0; ox < g.ow; ++ox) {
                            const int ix = ox * g.stride - g.pad + kx;
                            o[ox] = (ix >= 0 && ix < g.w) ? row[ix] : 0.0f;
                        }
                    }
                }
            }
}

void col2im(const ConvGeom& g, const float* col, float* x) {
    std::fill(x, x + static_cast<std::int64_t>(g.c) * g.h * g.w, 0.0f);
    for (int ch = 0; ch < g.c; ++ch)
        for (int ky = 0; ky < g.k; ++ky)
            for (int kx = 0; kx < g.k; ++kx) {
                const float* in = col + (static_cast<std::int64_t>(ch) * g.k * g.k + ky * g.k + kx) * g.oh * g.ow;
                float* dst = x + static_cast<std::int64_t>(ch) * g.h * g.w;
                for (int oy = 0; oy < g.oh; ++oy) {
                    const int iy = oy * g.stride - g.pad + ky;
                    if (iy < 0 || iy >= g.h) continue;
                    float* row = dst + iy * g.w;
                    const float* c = in + oy * g.ow;
                    for (int ox = 0; ox < g.ow; ++ox) {
                        const int ix = ox * g.stride - g.pad + kx;
                        if (ix >= 0 && ix < g.w) row[ix] += c[ox];
                    }
                }
            }
}

} // namespace dstk::train::cpu
