// The BLAS GEMM of each floating element type (cblas_sgemm, cblas_dgemm), row-major, so a
// kernel written over scalar_t calls one name.
#pragma once

#include <cblas.h>

namespace mg::cpu {

inline void blas_gemm(CBLAS_TRANSPOSE ta, CBLAS_TRANSPOSE tb, int m, int n, int k, float alpha,
                      const float* a, int lda, const float* b, int ldb, float beta, float* c,
                      int ldc) {
  cblas_sgemm(CblasRowMajor, ta, tb, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
}
inline void blas_gemm(CBLAS_TRANSPOSE ta, CBLAS_TRANSPOSE tb, int m, int n, int k, double alpha,
                      const double* a, int lda, const double* b, int ldb, double beta, double* c,
                      int ldc) {
  cblas_dgemm(CblasRowMajor, ta, tb, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
}

}  // namespace mg::cpu
