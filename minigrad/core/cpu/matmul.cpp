// Matrix multiply through OpenBLAS's cblas_sgemm. A transposed view is handed to BLAS
// as a transpose flag with its leading dimension, not copied.
#include <algorithm>

#include <cblas.h>

#include <minigrad/core/cpu/cpu_backend.h>

namespace mg {
namespace {

// How BLAS should read a [rows, cols] operand: directly, transposed, or (for views
// BLAS cannot describe) from a contiguous copy held in `copy`.
struct GemmOperand {
  CBLAS_TRANSPOSE trans = CblasNoTrans;
  int ld = 1;
  const float* data = nullptr;
  Tensor copy;
};

GemmOperand gemm_operand(const Tensor& t) {
  const int64_t rows = t.size(0), cols = t.size(1);
  const int64_t rs = t.stride(0), cs = t.stride(1);
  GemmOperand op;
  // A size-1 dimension's stride is meaningless; any leading dimension works there.
  if (cs == 1 && (rs >= cols || rows == 1)) {
    op.trans = CblasNoTrans;
    op.ld = static_cast<int>(std::max<int64_t>({rs, cols, 1}));
    op.data = static_cast<const float*>(t.data_ptr());
  } else if (rs == 1 && (cs >= rows || cols == 1)) {
    op.trans = CblasTrans;
    op.ld = static_cast<int>(std::max<int64_t>({cs, rows, 1}));
    op.data = static_cast<const float*>(t.data_ptr());
  } else {
    op.copy = empty(t.shape(), DType::Float32, Device::cpu());
    cpu_backend().copy(op.copy, t);
    op.trans = CblasNoTrans;
    op.ld = static_cast<int>(std::max<int64_t>(cols, 1));
    op.data = static_cast<const float*>(op.copy.data_ptr());
  }
  return op;
}

// c[m,n] = a @ b + beta * c, c contiguous.
void gemm(const Tensor& out, const Tensor& a, const Tensor& b, float beta) {
  const int64_t m = a.size(0), k = a.size(1), n = b.size(1);
  if (m == 0 || n == 0 || k == 0) return;
  const GemmOperand lhs = gemm_operand(a);
  const GemmOperand rhs = gemm_operand(b);
  cblas_sgemm(CblasRowMajor, lhs.trans, rhs.trans, static_cast<int>(m), static_cast<int>(n),
              static_cast<int>(k), 1.0f, lhs.data, lhs.ld, rhs.data, rhs.ld, beta,
              static_cast<float*>(out.data_ptr()), static_cast<int>(n));
}

}  // namespace

void CpuBackend::matmul(const Tensor& out, const Tensor& a, const Tensor& b) {
  if (a.size(1) == 0) fill(out, 0.0);
  gemm(out, a, b, 0.0f);
}

void CpuBackend::addmm(const Tensor& out, const Tensor& bias, const Tensor& a, const Tensor& b) {
  // Start every row of out as the bias, then let BLAS accumulate the product into it
  // (beta = 1): the bias add costs one pass over a row the GEMM is about to read anyway.
  const int64_t m = out.size(0), n = out.size(1);
  auto* c = static_cast<float*>(out.data_ptr());
  const auto* bias_row = static_cast<const float*>(bias.data_ptr());
  for (int64_t i = 0; i < m; ++i) std::copy(bias_row, bias_row + n, c + i * n);
  gemm(out, a, b, 1.0f);
}

}  // namespace mg
