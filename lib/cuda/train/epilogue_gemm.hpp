#pragma once
// A linear layer's GEMM through cuBLASLt with its bias, ReLU or bias gradient
// in the epilogue: one kernel where cublasGemmEx needs two or three, each a
// kernel boundary on the step's critical path. Planned once per shape: the
// algorithm is cuBLASLt's first heuristic pick and is kept, so results are the
// same run to run and nothing is chosen while a graph is captured. Where
// cuBLASLt offers no algorithm the plan says so (ok() false) and the caller
// runs its plain GEMM and kernels.
#include <cublasLt.h>

#include <cstddef>

namespace dstk::train::cuda {

// Column-major D[m][n] = op(A)[m][k] op(B)[k][n], float scale and accumulation.
struct EpilogueGemmShape {
    cublasOperation_t ta = CUBLAS_OP_N, tb = CUBLAS_OP_N;
    int m = 0, n = 0, k = 0;
    cudaDataType_t a_type = CUDA_R_32F, b_type = CUDA_R_32F, d_type = CUDA_R_32F;
    int lda = 0, ldb = 0, ldd = 0;
    // Alignment in bytes that every pointer passed to run() for that matrix has.
    unsigned a_align = 256, b_align = 256, d_align = 256;
    cublasComputeType_t compute = CUBLAS_COMPUTE_32F;
    cublasLtEpilogue_t epilogue = CUBLASLT_EPILOGUE_DEFAULT;
    // BIAS, RELU_BIAS: the fp32 bias added to every column (m values);
    // BGRADB: where the fp32 sums of op(B) over k go (n values).
    float* bias = nullptr;
};

// The largest power of two (at most 256) that divides p's address.
unsigned pointer_alignment(const void* p);

class EpilogueGemm {
  public:
    // workspace_bytes: what run()'s workspace holds; the pick needs at most that.
    EpilogueGemm(cublasLtHandle_t lt, const EpilogueGemmShape& s, std::size_t workspace_bytes);
    ~EpilogueGemm();
    EpilogueGemm(const EpilogueGemm&) = delete;
    EpilogueGemm& operator=(const EpilogueGemm&) = delete;

    bool ok() const { return found_; }
    void run(const void* a, const void* b, void* d, void* workspace, cudaStream_t stream) const;

  private:
    cublasLtHandle_t lt_;
    cublasLtMatmulDesc_t desc_ = nullptr;
    cublasLtMatrixLayout_t a_ = nullptr, b_ = nullptr, d_ = nullptr;
    cublasLtMatmulAlgo_t algo_{};
    std::size_t workspace_bytes_ = 0;
    bool found_ = false;
};

} // namespace dstk::train::cuda
