// Matrix multiply through OpenBLAS's cblas_sgemm (float32) and cblas_dgemm (float64), one
// matrix or a batch of them (a loop of GEMMs over the batch dimensions). A transposed view
// is handed to BLAS as a transpose flag with its leading dimension, not copied.
// bfloat16 and float16 multiply float32 copies with sgemm and round the product once
// (cpu/widen.h says why not cblas_sbgemm): float32 accumulation, as cuBLAS's
// CUBLAS_COMPUTE_32F on a GPU.
#include <algorithm>

#include <minigrad/core/cpu/blas.h>
#include <minigrad/core/cpu/cpu_backend.h>
#include <minigrad/core/cpu/strided_loop.h>
#include <minigrad/core/cpu/widen.h>
#include <minigrad/core/dispatch.h>

namespace mg {
namespace {

using cpu::blas_gemm;

// How BLAS should read a [rows, cols] operand: directly, transposed, or (for views
// BLAS cannot describe) from a contiguous copy held in `copy`.
template <typename T>
struct GemmOperand {
  CBLAS_TRANSPOSE trans = CblasNoTrans;
  int ld = 1;
  const T* data = nullptr;
  Tensor copy;
};

// A [rows, cols] matrix at `data` with strides rs, cs (element offsets).
template <typename T>
GemmOperand<T> gemm_operand(const T* data, int64_t rows, int64_t cols, int64_t rs, int64_t cs) {
  GemmOperand<T> op;
  // A size-1 dimension's stride is meaningless; any leading dimension works there.
  if (cs == 1 && (rs >= cols || rows == 1)) {
    op.trans = CblasNoTrans;
    op.ld = static_cast<int>(std::max<int64_t>({rs, cols, 1}));
    op.data = data;
  } else if (rs == 1 && (cs >= rows || cols == 1)) {
    op.trans = CblasTrans;
    op.ld = static_cast<int>(std::max<int64_t>({cs, rows, 1}));
    op.data = data;
  } else {
    op.copy = empty(Shape{rows, cols}, dtype_of<T>(), Device::cpu());
    T* c = static_cast<T*>(op.copy.data_ptr());
    for (int64_t i = 0; i < rows; ++i)
      for (int64_t j = 0; j < cols; ++j) c[i * cols + j] = data[i * rs + j * cs];
    op.trans = CblasNoTrans;
    op.ld = static_cast<int>(std::max<int64_t>(cols, 1));
    op.data = c;
  }
  return op;
}

// c[m,n] = a @ b + beta * c for one matrix: a [m,k] and b [k,n] strided, c contiguous rows
// with leading dimension n.
template <typename T>
void gemm_one(T* c, const T* a, int64_t m, int64_t k, int64_t ars, int64_t acs, const T* b,
              int64_t n, int64_t brs, int64_t bcs, T beta) {
  if (m == 0 || n == 0) return;
  if (k == 0) {
    if (beta == T(0)) std::fill(c, c + m * n, T(0));
    return;
  }
  const GemmOperand<T> lhs = gemm_operand(a, m, k, ars, acs);
  const GemmOperand<T> rhs = gemm_operand(b, k, n, brs, bcs);
  blas_gemm(lhs.trans, rhs.trans, static_cast<int>(m), static_cast<int>(n), static_cast<int>(k),
            T(1), lhs.data, lhs.ld, rhs.data, rhs.ld, beta, c, static_cast<int>(n));
}

template <typename T>
void gemm(const Tensor& out, const Tensor& a, const Tensor& b, T beta) {
  gemm_one(static_cast<T*>(out.data_ptr()), static_cast<const T*>(a.data_ptr()), a.size(0),
           a.size(1), a.stride(0), a.stride(1), static_cast<const T*>(b.data_ptr()), b.size(1),
           b.stride(0), b.stride(1), beta);
}

}  // namespace

void CpuBackend::matmul(const Tensor& out, const Tensor& a, const Tensor& b) {
  if (is_reduced_float(a.dtype())) {
    const Tensor wide = cpu::float32_stand_in(out);
    matmul(wide, cpu::widen(a), cpu::widen(b));
    return cpu::round_into(out, wide);
  }
  MG_DISPATCH_FLOATING_TYPES(a.dtype(), "matmul", [&] { gemm<scalar_t>(out, a, b, scalar_t(0)); });
}

void CpuBackend::addmm(const Tensor& out, const Tensor& bias, const Tensor& a, const Tensor& b) {
  if (is_reduced_float(a.dtype())) {  // the bias added in float32 too: one rounding
    const Tensor wide = cpu::float32_stand_in(out);
    addmm(wide, cpu::widen(bias), cpu::widen(a), cpu::widen(b));
    return cpu::round_into(out, wide);
  }
  // Start every row of out as the bias, then let BLAS accumulate the product into it
  // (beta = 1): the bias add costs one pass over a row the GEMM is about to read anyway.
  MG_DISPATCH_FLOATING_TYPES(a.dtype(), "addmm", [&] {
    using T = scalar_t;
    const int64_t m = out.size(0), n = out.size(1);
    auto* c = static_cast<T*>(out.data_ptr());
    const auto* bias_row = static_cast<const T*>(bias.data_ptr());
    for (int64_t i = 0; i < m; ++i) std::copy(bias_row, bias_row + n, c + i * n);
    gemm<T>(out, a, b, T(1));
  });
}

// One GEMM per matrix of the batch; the batch dimensions are walked with their strides,
// so a broadcast operand (stride 0) is read in place, never copied per matrix.
void CpuBackend::bmm(const Tensor& out, const Tensor& a, const Tensor& b) {
  if (is_reduced_float(a.dtype())) {
    // widen() copies a broadcast operand's one matrix per batch index: the 16-bit path
    // pays memory for simplicity here.
    const Tensor wide = cpu::float32_stand_in(out);
    bmm(wide, cpu::widen(a), cpu::widen(b));
    return cpu::round_into(out, wide);
  }
  const int64_t nd = out.dim();
  const int64_t m = a.size(-2), k = a.size(-1), n = b.size(-1);
  const Shape batch(std::vector<int64_t>(out.shape().sizes().begin(), out.shape().sizes().end() - 2));
  const auto batch_strides = [nd](const Tensor& t) {
    return std::vector<int64_t>(t.strides().begin(), t.strides().begin() + (nd - 2));
  };
  const std::vector<int64_t> so = batch_strides(out), sa = batch_strides(a), sb = batch_strides(b);
  MG_DISPATCH_FLOATING_TYPES(a.dtype(), "matmul", [&] {
    using T = scalar_t;
    T* o = static_cast<T*>(out.data_ptr());
    const T* pa = static_cast<const T*>(a.data_ptr());
    const T* pb = static_cast<const T*>(b.data_ptr());
    cpu::for_each_element<3>(batch, {&so, &sa, &sb}, [&](const std::array<int64_t, 3>& k3) {
      gemm_one<T>(o + k3[0], pa + k3[1], m, k, a.stride(-2), a.stride(-1), pb + k3[2], n,
                  b.stride(-2), b.stride(-1), T(0));
    });
  });
}

}  // namespace mg
