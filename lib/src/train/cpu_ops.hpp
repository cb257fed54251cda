#pragma once
// CPU reference kernels for the training engine (NCHW float). Straight
// formulas except the matrix product, which is packed and register-blocked
// (AVX2+FMA where the CPU has it) because convolutions run as im2col + GEMM.
#include <cstdint>

namespace dstk::train::cpu {

// Row-major C[M,N] = alpha * op(A)[M,K] * op(B)[K,N] + beta * C.
// op(A) = A (lda >= K) or A^T (A is K x M, lda >= M); likewise B.
void gemm(bool trans_a, bool trans_b, int m, int n, int k, float alpha, const float* a, int lda, const float* b,
          int ldb, float beta, float* c, int ldc);

struct ConvGeom {
    int c, h, w; // input
    int k, stride, pad;
    int oh, ow; // output
    int rows() const { return c * k * k; }
    int cols() const { return oh * ow; }
};
// col[c*k*k][oh*ow] from one sample's x[c][h][w]; col2im accumulates back.
void im2col(const ConvGeom& g, const float* x, float* col);
void col2im(const ConvGeom& g, const float* col, float* x); // x is zeroed first

} // namespace dstk::train::cpu
