// RMS normalisation over the rows of a [rows, cols] tensor, forward and backward, on the
// host (the Llama's norm: layer_norm without the mean and the bias). The sum of squares
// accumulates in double. bfloat16 and float16 run the float32 kernels on widened copies
// (cpu/widen.h), their rstd float32 (compute_dtype), as layer_norm's statistics.
#include <cmath>
#include <vector>

#include <minigrad/core/cpu/cpu_backend.h>
#include <minigrad/core/cpu/widen.h>
#include <minigrad/core/dispatch.h>

namespace mg {
namespace {

template <typename T>
void rms_norm_typed(const Tensor& out, const Tensor& rstd, const Tensor& in, const Tensor& weight,
                    double eps) {
  const int64_t rows = in.size(0), cols = in.size(1);
  const T* x = static_cast<const T*>(in.data_ptr());
  T* y = static_cast<T*>(out.data_ptr());
  T* rstd_out = static_cast<T*>(rstd.data_ptr());
  const T* w = weight.defined() ? static_cast<const T*>(weight.data_ptr()) : nullptr;
  for (int64_t i = 0; i < rows; ++i) {
    const T* row = x + i * cols;
    double sq = 0.0;
    for (int64_t j = 0; j < cols; ++j) sq += static_cast<double>(row[j]) * static_cast<double>(row[j]);
    const auto r = static_cast<T>(1.0 / std::sqrt(sq / static_cast<double>(cols) + eps));
    rstd_out[i] = r;
    T* out_row = y + i * cols;
    for (int64_t j = 0; j < cols; ++j) out_row[j] = w ? row[j] * r * w[j] : row[j] * r;
  }
}

// With xhat = x * rstd and dxhat = grad_out * weight (the mean is not subtracted, so one
// term of layer_norm's goes):
//   grad_in = rstd * (dxhat - xhat * mean(dxhat * xhat));  grad_weight = sum over rows of grad_out * xhat
template <typename T>
void rms_norm_backward_typed(const Tensor& grad_in, const Tensor& grad_weight, const Tensor& grad_out,
                             const Tensor& in, const Tensor& rstd, const Tensor& weight) {
  const int64_t rows = in.size(0), cols = in.size(1);
  const T* x = static_cast<const T*>(in.data_ptr());
  const T* g = static_cast<const T*>(grad_out.data_ptr());
  const T* rs = static_cast<const T*>(rstd.data_ptr());
  const T* w = weight.defined() ? static_cast<const T*>(weight.data_ptr()) : nullptr;
  T* gi = static_cast<T*>(grad_in.data_ptr());
  std::vector<double> gw(grad_weight.defined() ? static_cast<size_t>(cols) : 0, 0.0);
  for (int64_t i = 0; i < rows; ++i) {
    const T* row = x + i * cols;
    const T* g_row = g + i * cols;
    double sum_dxhat_xhat = 0.0;
    for (int64_t j = 0; j < cols; ++j) {
      const T xhat = row[j] * rs[i];
      const T dxhat = w ? g_row[j] * w[j] : g_row[j];
      sum_dxhat_xhat += static_cast<double>(dxhat) * static_cast<double>(xhat);
      if (!gw.empty()) gw[static_cast<size_t>(j)] += static_cast<double>(g_row[j]) * static_cast<double>(xhat);
    }
    const auto mean_dxhat_xhat = static_cast<T>(sum_dxhat_xhat / static_cast<double>(cols));
    T* out_row = gi + i * cols;
    for (int64_t j = 0; j < cols; ++j) {
      const T xhat = row[j] * rs[i];
      const T dxhat = w ? g_row[j] * w[j] : g_row[j];
      out_row[j] = rs[i] * (dxhat - xhat * mean_dxhat_xhat);
    }
  }
  if (!gw.empty()) {
    T* p = static_cast<T*>(grad_weight.data_ptr());
    for (int64_t j = 0; j < cols; ++j) p[j] = static_cast<T>(gw[static_cast<size_t>(j)]);
  }
}

}  // namespace

void CpuBackend::rms_norm(const Tensor& out, const Tensor& rstd, const Tensor& in, const Tensor& weight,
                          double eps) {
  if (is_reduced_float(in.dtype())) {
    const Tensor wide = cpu::float32_stand_in(out);
    rms_norm(wide, rstd, cpu::widen(in), cpu::widen(weight), eps);
    return cpu::round_into(out, wide);
  }
  MG_DISPATCH_FLOATING_TYPES(in.dtype(), "rms_norm", [&] { rms_norm_typed<scalar_t>(out, rstd, in, weight, eps); });
}

void CpuBackend::rms_norm_backward(const Tensor& grad_in, const Tensor& grad_weight, const Tensor& grad_out,
                                   const Tensor& in, const Tensor& rstd, const Tensor& weight) {
  if (is_reduced_float(in.dtype())) {
    const Tensor gi = cpu::float32_stand_in(grad_in), gw = cpu::float32_stand_in(grad_weight);
    rms_norm_backward(gi, gw, cpu::widen(grad_out), cpu::widen(in), rstd, cpu::widen(weight));
    cpu::round_into(grad_in, gi);
    return cpu::round_into(grad_weight, gw);
  }
  MG_DISPATCH_FLOATING_TYPES(in.dtype(), "rms_norm_backward", [&] {
    rms_norm_backward_typed<scalar_t>(grad_in, grad_weight, grad_out, in, rstd, weight);
  });
}

}  // namespace mg
