// Embedding lookup (rows of a table gathered by index) and its backward (rows scattered
// back and summed) on the host. The backward walks the indices in order, so a row that
// appears several times sums its gradients in the same order on every run. A 16-bit table
// gathers its rows as they are; its gradient sums in float32 and is rounded once
// (cpu/widen.h).
#include <algorithm>

#include <minigrad/core/cpu/cpu_backend.h>
#include <minigrad/core/cpu/widen.h>
#include <minigrad/core/dispatch.h>

namespace mg {

void CpuBackend::embedding(const Tensor& out, const Tensor& weight, const Tensor& indices) {
  const int64_t n = indices.numel(), vocab = weight.size(0), dim = weight.size(1);
  const auto* idx = static_cast<const int64_t*>(indices.data_ptr());
  for (int64_t i = 0; i < n; ++i)
    MG_CHECK(idx[i] >= 0 && idx[i] < vocab,
             "embedding: index {} (at position {} of the indices) is out of range for an "
             "embedding of {} rows (weight shape {})",
             idx[i], i, vocab, weight.shape());
  const int64_t rs = weight.stride(0), cs = weight.stride(1);
  MG_DISPATCH_FLOATING_TYPES_AND_REDUCED(weight.dtype(), "embedding", [&] {
    using T = scalar_t;
    const T* w = static_cast<const T*>(weight.data_ptr());
    T* o = static_cast<T*>(out.data_ptr());
    for (int64_t i = 0; i < n; ++i) {
      const T* row = w + idx[i] * rs;
      T* out_row = o + i * dim;
      if (cs == 1) {
        std::copy(row, row + dim, out_row);
      } else {
        for (int64_t j = 0; j < dim; ++j) out_row[j] = row[j * cs];
      }
    }
  });
}

void CpuBackend::embedding_backward(const Tensor& grad_weight, const Tensor& grad_out,
                                    const Tensor& indices) {
  const int64_t n = indices.numel(), dim = grad_weight.size(1);
  if (is_reduced_float(grad_weight.dtype())) {
    const Tensor wide = cpu::float32_stand_in(grad_weight, /*keep_values=*/true);  // it adds into it
    embedding_backward(wide, cpu::widen(grad_out), indices);
    return cpu::round_into(grad_weight, wide);
  }
  const auto* idx = static_cast<const int64_t*>(indices.data_ptr());
  MG_DISPATCH_FLOATING_TYPES(grad_weight.dtype(), "embedding_backward", [&] {
    using T = scalar_t;
    T* gw = static_cast<T*>(grad_weight.data_ptr());
    const T* g = static_cast<const T*>(grad_out.data_ptr());
    for (int64_t i = 0; i < n; ++i) {
      T* row = gw + idx[i] * dim;
      const T* g_row = g + i * dim;
      for (int64_t j = 0; j < dim; ++j) row[j] += g_row[j];
    }
  });
}

}  // namespace mg
