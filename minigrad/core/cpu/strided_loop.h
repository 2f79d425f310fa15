// for_each_row / for_each_element: visit every element of a shape once, over N strided
// tensors at a time. The innermost dimension is a row; outer dimensions advance an
// odometer. This is how the CPU backend supports views (transposes, narrows, broadcast
// stride-0) without copying them first.
#pragma once

#include <array>
#include <cstdint>
#include <vector>

#include <minigrad/core/shape.h>

namespace mg::cpu {

// Calls f(offsets, length) once per innermost row, with the element offset of the row's
// first element in each tensor. Kernels that see unit or zero strides along the row run
// their own tight (vectorisable) loop over it. A 0-d shape is one row of length 1.
template <std::size_t N, typename F>
void for_each_row(const Shape& shape, const std::array<const std::vector<int64_t>*, N>& strides,
                  F&& f) {
  const int64_t ndim = shape.dim();
  if (shape.numel() == 0) return;
  std::array<int64_t, N> offsets{};
  if (ndim == 0) {
    f(offsets, int64_t{1});
    return;
  }
  const int64_t inner = shape[ndim - 1];
  std::vector<int64_t> counter(static_cast<size_t>(ndim), 0);
  while (true) {
    f(offsets, inner);
    // Advance the odometer over the outer dimensions. Only offsets of elements that
    // exist are ever formed: a view may have any stride along a dimension of size 1
    // (as_strided allows INT64_MAX there), so one step past the last index may overflow.
    int64_t d = ndim - 2;
    for (; d >= 0; --d) {
      const auto du = static_cast<size_t>(d);
      if (++counter[du] < shape[d]) {
        for (std::size_t t = 0; t < N; ++t) offsets[t] += (*strides[t])[du];
        break;
      }
      for (std::size_t t = 0; t < N; ++t) offsets[t] -= (*strides[t])[du] * (shape[d] - 1);
      counter[du] = 0;
    }
    if (d < 0) return;
  }
}

// Calls f(offsets) for every element, with its offset in each tensor.
template <std::size_t N, typename F>
void for_each_element(const Shape& shape, const std::array<const std::vector<int64_t>*, N>& strides,
                      F&& f) {
  std::array<int64_t, N> inner_stride{};
  if (shape.dim() > 0)
    for (std::size_t t = 0; t < N; ++t) inner_stride[t] = strides[t]->back();
  for_each_row<N>(shape, strides, [&](std::array<int64_t, N> o, int64_t length) {
    for (int64_t i = 0;;) {
      f(static_cast<const std::array<int64_t, N>&>(o));
      if (++i == length) break;  // no step past the row's end (see for_each_row)
      for (std::size_t t = 0; t < N; ++t) o[t] += inner_stride[t];
    }
  });
}

}  // namespace mg::cpu
