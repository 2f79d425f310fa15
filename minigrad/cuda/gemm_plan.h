// How a row-major matmul out[m, n] = a[m, k] @ b[k, n] with strided operands becomes one
// column-major GEMM call (cuBLAS's convention). Plain C++ with no CUDA header, so that
// tests/core checks the operand swapping and the leading dimensions on every machine,
// GPU or not; cuda/blas.cpp turns the plan into cublasGemmEx.
//
// The math. A row-major [r, c] matrix whose rows are `ld` elements apart is, read
// column-major, the [c, r] matrix (its transpose) with leading dimension ld. So
//   out = a @ b   <=>   out^T = b^T @ a^T,
// and cuBLAS computes C = op(A) op(B) with A := b's memory, B := a's memory and C := out's
// memory, M = n, N = m, K = k, ldc = n:
//   - b row-major (strides (ld, 1)): its memory is b^T, [n, k] column-major: op N, lda = ld
//     (cuBLAS needs lda >= M = n = b's cols);
//   - b a transposed view (strides (1, ld), e.g. w.t()): its memory is b itself, [k, n]
//     column-major: op T, lda = ld (cuBLAS needs lda >= K = k = b's rows);
//   - a the same way, with ldb >= K = k (a's cols) for op N and ldb >= N = m (a's rows)
//     for op T.
// A size-1 dim's stride is never stepped over, so it may be anything (narrowed or
// expanded views have odd ones); the leading dimension is then only raised to what
// cuBLAS requires. A view that is neither (every other column, a stride-0 broadcast of
// a row) is copied contiguously first and passed as op N with ld = cols.
//
// cuBLASLt (cuda/blas_lt.cpp, addmm) takes the same plan, plus the alignment of each
// matrix (gemm_alignment_bytes) so that its heuristic only offers kernels that can read
// views starting at an offset.
#pragma once

#include <algorithm>
#include <cstdint>

namespace mg::cuda {

// How GEMM reads one row-major operand of shape [rows, cols] with strides (rs, cs).
struct GemmOperandLayout {
  bool transpose = false;  // op T: the operand is stored column-major (a transposed view)
  bool pack = false;       // neither layout: pass a contiguous copy, op N, ld = cols
  int64_t ld = 1;          // the leading dimension to pass
};

inline GemmOperandLayout gemm_operand_layout(int64_t rows, int64_t cols, int64_t rs, int64_t cs) {
  GemmOperandLayout layout;
  if (cs == 1 && (rs >= cols || rows == 1)) {  // row-major
    layout.ld = std::max<int64_t>({rs, cols, 1});
  } else if (rs == 1 && (cs >= rows || cols == 1)) {  // column-major
    layout.transpose = true;
    layout.ld = std::max<int64_t>({cs, rows, 1});
  } else {
    layout.pack = true;
    layout.ld = std::max<int64_t>(cols, 1);
  }
  return layout;
}

// One cublasGemmEx call: C (gemm_m x gemm_n, ldc) = op(A) (gemm_m x gemm_k) op(B) (gemm_k x gemm_n).
struct GemmPlan {
  GemmOperandLayout lhs;  // cuBLAS's A: the memory of the product's right operand b
  GemmOperandLayout rhs;  // cuBLAS's B: the memory of the product's left operand a
  int64_t gemm_m = 0, gemm_n = 0, gemm_k = 0, ldc = 1;
};

// The plan for out[m, n] = a[m, k] @ b[k, n], `out` contiguous, a and b with the given
// strides (in elements).
inline GemmPlan gemm_plan(int64_t m, int64_t k, int64_t n, int64_t a_row_stride,
                          int64_t a_col_stride, int64_t b_row_stride, int64_t b_col_stride) {
  GemmPlan plan;
  plan.lhs = gemm_operand_layout(k, n, b_row_stride, b_col_stride);
  plan.rhs = gemm_operand_layout(m, k, a_row_stride, a_col_stride);
  plan.gemm_m = n;
  plan.gemm_n = m;
  plan.gemm_k = k;
  plan.ldc = std::max<int64_t>(n, 1);
  return plan;
}

// The alignment in bytes that a matrix at `address` keeps at the start of every column
// when columns are `ld` elements of `element_bytes` apart (ld = 0 for a vector): the
// largest power of two dividing both, at most 256 (what cuBLASLt assumes when not told).
// A narrowed view one float into its buffer gives 4, and so does an odd leading dimension.
inline uint32_t gemm_alignment_bytes(uintptr_t address, int64_t ld, int64_t element_bytes) {
  const uint64_t bits = static_cast<uint64_t>(address) |
                        static_cast<uint64_t>(ld) * static_cast<uint64_t>(element_bytes) | 256u;
  return static_cast<uint32_t>(bits & (~bits + 1));  // the lowest set bit
}

}  // namespace mg::cuda
