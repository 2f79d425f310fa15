// Helpers of the CUDA tests: every CUDA result is compared against the CPU backend
// computing the same thing from the same inputs.
#pragma once

#include <cmath>
#include <cstdint>
#include <vector>

#include <fmt/format.h>

#include "catch_compat.h"

#include <minigrad/core/ops.h>
#include <minigrad/cuda/cuda.h>
#include <minigrad/minigrad.h>

namespace mg::cuda_test {

inline Device gpu() { return Device::cuda(0); }

// Odd sizes, so that no kernel is only ever tried on multiples of a block or warp.
inline const std::vector<int64_t>& sizes() {
  static const std::vector<int64_t> values = {1, 7, 33, 1000, 4097};
  return values;
}

// |actual - expected| <= atol + rtol * |expected| element for element (NaNs and
// infinities must match exactly); names the first element that differs.
inline void require_close(const Tensor& actual, const Tensor& expected, double rtol = 1e-5,
                          double atol = 1e-6) {
  REQUIRE(actual.shape() == expected.shape());
  REQUIRE(actual.dtype() == expected.dtype());
  if (actual.dtype() == DType::Int64) {
    const auto a = actual.to_vector<int64_t>(), e = expected.to_vector<int64_t>();
    for (size_t i = 0; i < a.size(); ++i) {
      if (a[i] != e[i])
        FAIL(fmt::format("element {} of shape {}: {} on {} vs {} expected", i, actual.shape(),
                         a[i], actual.device(), e[i]));
    }
    return;
  }
  // float32 and float64 alike, compared in double.
  const auto a = ops::to_dtype(actual, DType::Float64).to_vector<double>();
  const auto e = ops::to_dtype(expected, DType::Float64).to_vector<double>();
  for (size_t i = 0; i < a.size(); ++i) {
    const double x = a[i], y = e[i];
    const bool both_nan = std::isnan(x) && std::isnan(y);
    const bool same_infinity = std::isinf(x) && x == y;
    const bool close = std::fabs(x - y) <= atol + rtol * std::fabs(y);
    if (!(both_nan || same_infinity || close))
      FAIL(fmt::format("element {} of shape {}: {} on {} vs {} expected (|diff| {:.3g}, "
                       "rtol {}, atol {})",
                       i, actual.shape(), x, actual.device(), y, std::fabs(x - y), rtol, atol));
  }
}

// Bit-for-bit equality of float tensors (ops whose CUDA arithmetic is the CPU's).
inline void require_equal(const Tensor& actual, const Tensor& expected) {
  require_close(actual, expected, 0.0, 0.0);
}

// Standard-normal values on the host, from a fixed seed per call site.
inline Tensor random_cpu(const Shape& shape, uint64_t seed) {
  manual_seed(seed);
  return randn(shape);
}

}  // namespace mg::cuda_test
