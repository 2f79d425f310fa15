// Layer normalisation over the rows of a [rows, cols] tensor, forward and backward, on the
// host. Row statistics accumulate in double (two passes: the mean, then the variance about
// it, so that rows with a large mean keep their precision). bfloat16 and float16 run the
// float32 kernels on widened copies (cpu/widen.h); their mean and rstd are float32
// (compute_dtype), as PyTorch keeps them, so backward meets the statistics unrounded.
#include <cmath>
#include <vector>

#include <minigrad/core/cpu/cpu_backend.h>
#include <minigrad/core/cpu/widen.h>
#include <minigrad/core/dispatch.h>

namespace mg {
namespace {

template <typename T>
void layer_norm_typed(const Tensor& out, const Tensor& mean, const Tensor& rstd, const Tensor& in,
                      const Tensor& weight, const Tensor& bias, double eps) {
  const int64_t rows = in.size(0), cols = in.size(1);
  const T* x = static_cast<const T*>(in.data_ptr());
  T* y = static_cast<T*>(out.data_ptr());
  T* mu_out = static_cast<T*>(mean.data_ptr());
  T* rstd_out = static_cast<T*>(rstd.data_ptr());
  const T* w = weight.defined() ? static_cast<const T*>(weight.data_ptr()) : nullptr;
  const T* b = bias.defined() ? static_cast<const T*>(bias.data_ptr()) : nullptr;
  for (int64_t i = 0; i < rows; ++i) {
    const T* row = x + i * cols;
    double sum = 0.0;
    for (int64_t j = 0; j < cols; ++j) sum += static_cast<double>(row[j]);
    const double mu = sum / static_cast<double>(cols);
    double sq = 0.0;
    for (int64_t j = 0; j < cols; ++j) {
      const double d = static_cast<double>(row[j]) - mu;
      sq += d * d;
    }
    const double r = 1.0 / std::sqrt(sq / static_cast<double>(cols) + eps);
    mu_out[i] = static_cast<T>(mu);
    rstd_out[i] = static_cast<T>(r);
    const auto m = static_cast<T>(mu), s = static_cast<T>(r);
    T* out_row = y + i * cols;
    for (int64_t j = 0; j < cols; ++j) {
      T v = (row[j] - m) * s;
      if (w) v = v * w[j];
      if (b) v = v + b[j];
      out_row[j] = v;
    }
  }
}

// With xhat = (x - mean) * rstd and dxhat = grad_out * weight:
//   grad_in = rstd * (dxhat - mean(dxhat) - xhat * mean(dxhat * xhat))
//   grad_weight = sum over rows of grad_out * xhat;  grad_bias = sum over rows of grad_out
template <typename T>
void layer_norm_backward_typed(const Tensor& grad_in, const Tensor& grad_weight,
                               const Tensor& grad_bias, const Tensor& grad_out, const Tensor& in,
                               const Tensor& mean, const Tensor& rstd, const Tensor& weight) {
  const int64_t rows = in.size(0), cols = in.size(1);
  const T* x = static_cast<const T*>(in.data_ptr());
  const T* g = static_cast<const T*>(grad_out.data_ptr());
  const T* mu = static_cast<const T*>(mean.data_ptr());
  const T* rs = static_cast<const T*>(rstd.data_ptr());
  const T* w = weight.defined() ? static_cast<const T*>(weight.data_ptr()) : nullptr;
  T* gi = static_cast<T*>(grad_in.data_ptr());
  std::vector<double> gw(grad_weight.defined() ? static_cast<size_t>(cols) : 0, 0.0);
  std::vector<double> gb(grad_bias.defined() ? static_cast<size_t>(cols) : 0, 0.0);
  std::vector<T> xhat(static_cast<size_t>(cols)), dxhat(static_cast<size_t>(cols));
  for (int64_t i = 0; i < rows; ++i) {
    const T* row = x + i * cols;
    const T* g_row = g + i * cols;
    double sum_dxhat = 0.0, sum_dxhat_xhat = 0.0;
    for (int64_t j = 0; j < cols; ++j) {
      const auto ju = static_cast<size_t>(j);
      xhat[ju] = (row[j] - mu[i]) * rs[i];
      dxhat[ju] = w ? g_row[j] * w[j] : g_row[j];
      sum_dxhat += static_cast<double>(dxhat[ju]);
      sum_dxhat_xhat += static_cast<double>(dxhat[ju]) * static_cast<double>(xhat[ju]);
      if (!gw.empty()) gw[ju] += static_cast<double>(g_row[j]) * static_cast<double>(xhat[ju]);
      if (!gb.empty()) gb[ju] += static_cast<double>(g_row[j]);
    }
    const auto mean_dxhat = static_cast<T>(sum_dxhat / static_cast<double>(cols));
    const auto mean_dxhat_xhat = static_cast<T>(sum_dxhat_xhat / static_cast<double>(cols));
    T* out_row = gi + i * cols;
    for (int64_t j = 0; j < cols; ++j) {
      const auto ju = static_cast<size_t>(j);
      out_row[j] = rs[i] * (dxhat[ju] - mean_dxhat - xhat[ju] * mean_dxhat_xhat);
    }
  }
  if (!gw.empty()) {
    T* p = static_cast<T*>(grad_weight.data_ptr());
    for (int64_t j = 0; j < cols; ++j) p[j] = static_cast<T>(gw[static_cast<size_t>(j)]);
  }
  if (!gb.empty()) {
    T* p = static_cast<T*>(grad_bias.data_ptr());
    for (int64_t j = 0; j < cols; ++j) p[j] = static_cast<T>(gb[static_cast<size_t>(j)]);
  }
}

}  // namespace

void CpuBackend::layer_norm(const Tensor& out, const Tensor& mean, const Tensor& rstd,
                            const Tensor& in, const Tensor& weight, const Tensor& bias,
                            double eps) {
  if (is_reduced_float(in.dtype())) {
    const Tensor wide = cpu::float32_stand_in(out);
    layer_norm(wide, mean, rstd, cpu::widen(in), cpu::widen(weight), cpu::widen(bias), eps);
    return cpu::round_into(out, wide);
  }
  MG_DISPATCH_FLOATING_TYPES(in.dtype(), "layer_norm", [&] {
    layer_norm_typed<scalar_t>(out, mean, rstd, in, weight, bias, eps);
  });
}

void CpuBackend::layer_norm_backward(const Tensor& grad_in, const Tensor& grad_weight,
                                     const Tensor& grad_bias, const Tensor& grad_out,
                                     const Tensor& in, const Tensor& mean, const Tensor& rstd,
                                     const Tensor& weight) {
  if (is_reduced_float(in.dtype())) {
    const Tensor gi = cpu::float32_stand_in(grad_in), gw = cpu::float32_stand_in(grad_weight),
                 gb = cpu::float32_stand_in(grad_bias);
    layer_norm_backward(gi, gw, gb, cpu::widen(grad_out), cpu::widen(in), mean, rstd,
                        cpu::widen(weight));
    cpu::round_into(grad_in, gi);
    cpu::round_into(grad_weight, gw);
    return cpu::round_into(grad_bias, gb);
  }
  MG_DISPATCH_FLOATING_TYPES(in.dtype(), "layer_norm_backward", [&] {
    layer_norm_backward_typed<scalar_t>(grad_in, grad_weight, grad_bias, grad_out, in, mean, rstd,
                                        weight);
  });
}

}  // namespace mg
