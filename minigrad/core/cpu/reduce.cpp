// Sums, argmax and the largest magnitude on the host. bfloat16 and float16 run the
// float32 kernels on widened copies (cpu/widen.h): a sum accumulates in float32's way
// (double for a whole-tensor sum) and rounds once.
#include <cmath>
#include <cstdint>
#include <type_traits>

#include <minigrad/core/cpu/cpu_backend.h>
#include <minigrad/core/cpu/strided_loop.h>
#include <minigrad/core/cpu/widen.h>
#include <minigrad/core/cpu/wrapping_math.h>
#include <minigrad/core/dispatch.h>

namespace mg {
namespace {

using cpu::add;  // int64 sums wrap around, as PyTorch's

template <typename T>
void sum_typed(const Tensor& out, const Tensor& in) {
  T* o = static_cast<T*>(out.data_ptr());
  const T* x = static_cast<const T*>(in.data_ptr());
  const Shape& shape = in.shape();

  if (out.numel() == 1) {  // a full reduction: floats accumulate in double for accuracy
    // int64 stays int64: a double cannot hold every integer past 2^53.
    using Acc = std::conditional_t<std::is_floating_point_v<T>, double, T>;
    Acc total = 0;
    cpu::for_each_element<1>(shape, {&in.strides()},
                             [&](const std::array<int64_t, 1>& k) { total = add(total, static_cast<Acc>(x[k[0]])); });
    o[0] = static_cast<T>(total);
    return;
  }
  // Rows of a contiguous 2-D input summed over columns (bias gradients: sum over dim 0).
  if (shape.dim() == 2 && in.is_contiguous() && out.shape()[0] == 1) {
    const int64_t rows = shape[0], cols = shape[1];
    for (int64_t j = 0; j < cols; ++j) o[j] = T(0);
    for (int64_t i = 0; i < rows; ++i) {
      const T* row = x + i * cols;
      for (int64_t j = 0; j < cols; ++j) o[j] = add(o[j], row[j]);
    }
    return;
  }
  // General case: view `out` with stride 0 along reduced dims, accumulate into it.
  std::vector<int64_t> out_strides(static_cast<size_t>(shape.dim()));
  for (int64_t d = 0; d < shape.dim(); ++d)
    out_strides[static_cast<size_t>(d)] = out.shape()[d] == 1 ? 0 : out.stride(d);
  const int64_t n = out.numel();
  for (int64_t i = 0; i < n; ++i) o[i] = T(0);
  cpu::for_each_element<2>(shape, {&out_strides, &in.strides()},
                           [&](const std::array<int64_t, 2>& k) { o[k[0]] = add(o[k[0]], x[k[1]]); });
}

}  // namespace

void CpuBackend::sum(const Tensor& out, const Tensor& in) {
  if (is_reduced_float(in.dtype())) {
    const Tensor wide = cpu::float32_stand_in(out);
    sum(wide, cpu::widen(in));
    return cpu::round_into(out, wide);
  }
  MG_DISPATCH_ALL_TYPES(in.dtype(), "sum", [&] { sum_typed<scalar_t>(out, in); });
}

namespace {
template <typename T>
void argmax_typed(const Tensor& out, const Tensor& in) {
  const int64_t rows = in.size(0), cols = in.size(1);
  const int64_t rs = in.stride(0), cs = in.stride(1);
  const auto* x = static_cast<const T*>(in.data_ptr());
  auto* o = static_cast<int64_t*>(out.data_ptr());
  // NaN is the maximum, as in PyTorch: the first NaN of a row wins; otherwise the first
  // of the largest values.
  const auto is_nan = [](T v) {
    if constexpr (std::is_floating_point_v<T>) {
      return std::isnan(v);
    } else {
      return false;
    }
  };
  for (int64_t i = 0; i < rows; ++i) {
    int64_t best = 0;
    T best_value = x[i * rs];
    for (int64_t j = 1; j < cols && !is_nan(best_value); ++j) {
      const T v = x[i * rs + j * cs];
      if (is_nan(v) || v > best_value) {
        best = j;
        best_value = v;
      }
    }
    o[i] = best;
  }
}

template <typename T>
void abs_max_typed(const Tensor& out, const Tensor& in) {
  const auto* x = static_cast<const T*>(in.data_ptr());
  const int64_t n = in.numel();
  T best = 0;
  for (int64_t i = 0; i < n; ++i) {
    const T a = std::fabs(x[i]);
    if (std::isnan(a)) {  // NaN wins, as torch.max does
      best = a;
      break;
    }
    best = a > best ? a : best;
  }
  *static_cast<T*>(out.data_ptr()) = best;
}
}  // namespace

void CpuBackend::argmax(const Tensor& out, const Tensor& in) {
  if (is_reduced_float(in.dtype())) return argmax(out, cpu::widen(in));  // widening is exact
  MG_DISPATCH_ALL_TYPES(in.dtype(), "argmax", [&] { argmax_typed<scalar_t>(out, in); });
}

void CpuBackend::abs_max(const Tensor& out, const Tensor& in) {
  if (is_reduced_float(in.dtype())) {
    const Tensor wide = cpu::float32_stand_in(out);
    abs_max(wide, cpu::widen(in));
    return cpu::round_into(out, wide);  // exact: the largest magnitude is one of the inputs
  }
  MG_DISPATCH_FLOATING_TYPES(in.dtype(), "abs_max", [&] { abs_max_typed<scalar_t>(out, in); });
}

}  // namespace mg
