// Comparing a 16-bit result with the float32 one, for the tests of bfloat16 and float16
// (tests/core/reduced_float_ops_test.cpp, tests/autograd/reduced_float_grad_test.cpp,
// tests/cuda/reduced_float_test.cpp).
//
// The unit roundoff u of a format with p significant bits is 2^-p: rounding to nearest
// moves a value y in the normal range by at most u |y|. bfloat16 has 8 significant bits
// (u = 2^-8), float16 11 (u = 2^-11). float16's subnormals are spaced 2^-24 apart, so
// below 2^-14 the bound is absolute: half a spacing, 2^-25. bfloat16's subnormals are
// float32's range (2^-133 apart), far below any value these tests produce.
#pragma once

#include "catch_compat.h"

#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

#include <minigrad/core/ops.h>
#include <minigrad/core/tensor.h>

namespace mg::testing {

inline double unit_roundoff(DType dtype) {
  switch (dtype) {
    case DType::BFloat16: return std::ldexp(1.0, -8);
    case DType::Float16: return std::ldexp(1.0, -11);
    case DType::Float32: return std::ldexp(1.0, -24);
    default: return std::ldexp(1.0, -53);
  }
}

// Half the spacing of the format's subnormals: the absolute rounding error below its
// smallest normal.
inline double subnormal_half_spacing(DType dtype) {
  return dtype == DType::Float16 ? std::ldexp(1.0, -25) : 0.0;
}

inline std::vector<double> values_of(const Tensor& t) {
  return ops::to_dtype(ops::copy_to(t, Device::cpu()), DType::Float64).to_vector<double>();
}

inline double rms(const std::vector<double>& v) {
  double s = 0.0;
  for (double x : v) s += x * x;
  return v.empty() ? 0.0 : std::sqrt(s / static_cast<double>(v.size()));
}

// |low - reference| <= k u (|reference| + floor) + k * subnormal spacing, element for
// element, with u the unit roundoff of `dtype` (the format `low` was rounded to). k = 1,
// floor = 0 is one rounding of the reference, the tightest bound there is. A failure
// names the worst element. NaN and infinities must match exactly.
inline void check_within(const std::string& what, const Tensor& low, const Tensor& reference,
                         DType dtype, double k, double floor = 0.0) {
  INFO(what);
  REQUIRE(low.shape() == reference.shape());
  const std::vector<double> a = values_of(low), b = values_of(reference);
  const double u = unit_roundoff(dtype);
  size_t worst = 0;
  double worst_excess = -1.0;
  bool failed = false;
  for (size_t i = 0; i < a.size(); ++i) {
    if (std::isnan(b[i]) || std::isinf(b[i])) {
      const bool same = std::isnan(b[i]) ? std::isnan(a[i]) : a[i] == b[i];
      if (!same) {
        failed = true;
        worst = i;
        break;
      }
      continue;
    }
    const double bound = k * u * (std::fabs(b[i]) + floor) + k * subnormal_half_spacing(dtype);
    const double excess = std::fabs(a[i] - b[i]) / (bound > 0.0 ? bound : 1e-300);
    if (excess > worst_excess) {
      worst_excess = excess;
      worst = i;
    }
    if (!(std::fabs(a[i] - b[i]) <= bound)) failed = true;
  }
  if (failed) {
    INFO("element " << worst << ": " << dtype_name(dtype) << " " << a[worst] << ", reference "
                    << b[worst] << ", difference " << std::fabs(a[worst] - b[worst])
                    << ", bound k u (|ref| + floor) with k = " << k << ", u = " << u
                    << ", floor = " << floor);
    CHECK_FALSE(failed);
  }
}

}  // namespace mg::testing
