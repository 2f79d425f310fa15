// for_each_element: visits every element of a shape once, handing the callback the
// element offset in each of N strided tensors. The innermost dimension runs as a tight
// loop; outer dimensions advance an odometer. This is how the CPU backend supports
// views (transposes, narrows, broadcast stride-0) without copying them first.
#pragma once

#include <array>
#include <cstdint>
#include <vector>

#include <minigrad/core/shape.h>

namespace mg::cpu {

template <std::size_t N, typename F>
void for_each_element(const Shape& shape, const std::array<const std::vector<int64_t>*, N>& strides,
                      F&& f) {
  const int64_t ndim = shape.dim();
  if (shape.numel() == 0) return;
  std::array<int64_t, N> offsets{};
  if (ndim == 0) {
    f(offsets);
    return;
  }
  const int64_t inner = shape[ndim - 1];
  std::array<int64_t, N> inner_stride{};
  for (std::size_t t = 0; t < N; ++t) inner_stride[t] = (*strides[t])[static_cast<size_t>(ndim - 1)];
  std::vector<int64_t> counter(static_cast<size_t>(ndim), 0);
  while (true) {
    std::array<int64_t, N> o = offsets;
    for (int64_t i = 0; i < inner; ++i) {
      f(o);
      for (std::size_t t = 0; t < N; ++t) o[t] += inner_stride[t];
    }
    // Advance the odometer over the outer dimensions.
    int64_t d = ndim - 2;
    for (; d >= 0; --d) {
      const auto du = static_cast<size_t>(d);
      ++counter[du];
      for (std::size_t t = 0; t < N; ++t) offsets[t] += (*strides[t])[du];
      if (counter[du] < shape[d]) break;
      for (std::size_t t = 0; t < N; ++t) offsets[t] -= (*strides[t])[du] * shape[d];
      counter[du] = 0;
    }
    if (d < 0) return;
  }
}

}  // namespace mg::cpu
