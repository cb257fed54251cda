#include "epilogue_gemm.hpp"

#include <cstdint>

#include "cudnn_check.hpp"

namespace dstk::train::cuda {

unsigned pointer_alignment(const void* p) {
    const auto a = reinterpret_cast<std::uintptr_t>(p);
    unsigned align = 1;
    while (align < 256 && (a & (2 * align - 1)) == 0) align *= 2;
    return align;
}

namespace {

template <class T> void set(cublasLtMatmulDesc_t d, cublasLtMatmulDescAttributes_t attr, const T& v) {
    CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(d, attr, &v, sizeof v));
}

template <class T> void set(cublasLtMatmulPreference_t p, cublasLtMatmulPreferenceAttributes_t attr, const T& v) {
    CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(p, attr, &v, sizeof v));
}

// Rows and columns of a column-major matrix that op() turns into rows x cols.
cublasLtMatrixLayout_t layout(cudaDataType_t t, cublasOperation_t op, int rows, int cols, int ld) {
    cublasLtMatrixLayout_t l = nullptr;
    const bool tr = op == CUBLAS_OP_T;
    CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&l, t, static_cast<std::uint64_t>(tr ? cols : rows),
                                            static_cast<std::uint64_t>(tr ? rows : cols), ld));
    return l;
}

} // namespace

EpilogueGemm::EpilogueGemm(cublasLtHandle_t lt, const EpilogueGemmShape& s, std::size_t workspace_bytes)
    : lt_(lt), workspace_bytes_(workspace_bytes) {
    CUBLAS_CHECK(cublasLtMatmulDescCreate(&desc_, s.compute, CUDA_R_32F));
    set(desc_, CUBLASLT_MATMUL_DESC_TRANSA, s.ta);
    set(desc_, CUBLASLT_MATMUL_DESC_TRANSB, s.tb);
    set(desc_, CUBLASLT_MATMUL_DESC_EPILOGUE, s.epilogue);
    if (s.bias) { // the heuristic reads the pointer's alignment, so it is set first
        set(desc_, CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE, CUDA_R_32F);
        set(desc_, CUBLASLT_MATMUL_DESC_BIAS_POINTER, s.bias);
    }
    a_ = layout(s.a_type, s.ta, s.m, s.k, s.lda);
    b_ = layout(s.b_type, s.tb, s.k, s.n, s.ldb);
    d_ = layout(s.d_type, CUBLAS_OP_N, s.m, s.n, s.ldd);
    cublasLtMatmulPreference_t pref = nullptr;
    CUBLAS_CHECK(cublasLtMatmulPreferenceCreate(&pref));
    set(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, std::uint64_t{workspace_bytes});
    set(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, std::uint32_t{s.a_align});
    set(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, std::uint32_t{s.b_align});
    set(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, std::uint32_t{s.d_align});
    set(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, std::uint32_t{s.d_align});
    cublasLtMatmulHeuristicResult_t pick{};
    int found = 0;
    // A refusal (no algorithm, or a type or epilogue this cuBLASLt does not
    // take) is an answer, not an error: the caller falls back.
    const cublasStatus_t st = cublasLtMatmulAlgoGetHeuristic(lt_, desc_, a_, b_, d_, d_, pref, 1, &pick, &found);
    cublasLtMatmulPreferenceDestroy(pref);
    found_ = st == CUBLAS_STATUS_SUCCESS && found > 0 && pick.state == CUBLAS_STATUS_SUCCESS;
    if (found_) algo_ = pick.algo;
}

EpilogueGemm::~EpilogueGemm() {
    for (auto l : {a_, b_, d_})
        if (l) cublasLtMatrixLayoutDestroy(l);
    if (desc_) cublasLtMatmulDescDestroy(desc_);
}

void EpilogueGemm::run(const void* a, const void* b, void* d, void* workspace, cudaStream_t stream) const {
    const float one = 1.0f, zero = 0.0f;
    CUBLAS_CHECK(cublasLtMatmul(lt_, desc_, &one, a, a_, b, b_, &zero, d, d_, d, d_, &algo_, workspace,
                                workspace_bytes_, stream));
}

} // namespace dstk::train::cuda
