// Element types: float32 (the default), float64 (gradient checks in double, tight parity
// tests), int64 (class labels and indices), and the two 16-bit floats of mixed precision,
// bfloat16 and float16 (core/bfloat16.h, core/float16.h: storage types that kernels
// convert to float, compute in float and round once on the way out). A kernel that works
// on every floating type is written once as a template over its element type and
// instantiated through core/dispatch.h, so a new float type is new cases there and new
// kernels, not new plumbing.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string_view>
#include <type_traits>

#include <fmt/format.h>

#include <minigrad/core/bfloat16.h>
#include <minigrad/core/float16.h>

namespace mg {

enum class DType { Float32, Float64, Int64, BFloat16, Float16 };

inline std::size_t element_size(DType dtype) {
  switch (dtype) {
    case DType::Float32: return 4;
    case DType::Float64: return 8;
    case DType::Int64: return 8;
    case DType::BFloat16: return 2;
    case DType::Float16: return 2;
  }
  return 0;
}

inline std::string_view dtype_name(DType dtype) {
  switch (dtype) {
    case DType::Float32: return "float32";
    case DType::Float64: return "float64";
    case DType::Int64: return "int64";
    case DType::BFloat16: return "bfloat16";
    case DType::Float16: return "float16";
  }
  return "?";
}

constexpr bool is_floating_point(DType dtype) { return dtype != DType::Int64; }

// bfloat16 and float16: the 16-bit floats, stored in 2 bytes and computed in float32
// (torch's "reduced floating point" types).
constexpr bool is_reduced_float(DType dtype) {
  return dtype == DType::BFloat16 || dtype == DType::Float16;
}

// The dtype of a result computed from operands of dtypes a and b, as torch.result_type
// for tensors: a float beats an integer; the wider float beats the narrower; bfloat16
// and float16, neither of which holds the other (range against precision), meet in
// float32.
constexpr DType promote_types(DType a, DType b) {
  if (a == b) return a;
  if (a == DType::Int64) return b;
  if (b == DType::Int64) return a;
  if (a == DType::Float64 || b == DType::Float64) return DType::Float64;
  return DType::Float32;  // float32 with a 16-bit float, or bfloat16 with float16
}

// The dtype a tensor of `dtype` computes in, and keeps statistics in (layer norm's mean
// and 1/std, attention's log-sum-exp): float32 for the 16-bit floats, else dtype itself
// (PyTorch's toOpMathType).
constexpr DType compute_dtype(DType dtype) { return is_reduced_float(dtype) ? DType::Float32 : dtype; }

// The DType of a C++ element type: dtype_of<float>() == DType::Float32.
template <typename T>
constexpr DType dtype_of() {
  static_assert(std::is_same_v<T, float> || std::is_same_v<T, double> ||
                    std::is_same_v<T, int64_t> || std::is_same_v<T, bfloat16> ||
                    std::is_same_v<T, float16>,
                "minigrad tensors hold float, double, int64_t, bfloat16 or float16");
  if constexpr (std::is_same_v<T, float>) {
    return DType::Float32;
  } else if constexpr (std::is_same_v<T, double>) {
    return DType::Float64;
  } else if constexpr (std::is_same_v<T, bfloat16>) {
    return DType::BFloat16;
  } else if constexpr (std::is_same_v<T, float16>) {
    return DType::Float16;
  } else {
    return DType::Int64;
  }
}

// The type a kernel computes an element of type T in (PyTorch's at::opmath_type): float
// for the 16-bit floats, T itself otherwise.
template <typename T>
using compute_t =
    std::conditional_t<std::is_same_v<T, bfloat16> || std::is_same_v<T, float16>, float, T>;

}  // namespace mg

template <>
struct fmt::formatter<mg::DType> : fmt::formatter<std::string_view> {
  template <typename Ctx>
  auto format(mg::DType d, Ctx& ctx) const {
    return fmt::formatter<std::string_view>::format(mg::dtype_name(d), ctx);
  }
};
