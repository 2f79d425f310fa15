// Element types: float32 (the default), float64 (gradient checks in double, tight parity
// tests) and int64 (class labels and indices). A kernel that works on every floating type
// is written once as a template over its element type and instantiated through
// MG_DISPATCH_FLOATING_TYPES (core/dispatch.h), so a new float type (a 16-bit one, for
// mixed precision) is a new case there and new kernels, not new plumbing.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string_view>
#include <type_traits>

#include <fmt/format.h>

namespace mg {

enum class DType { Float32, Float64, Int64 };

inline std::size_t element_size(DType dtype) {
  switch (dtype) {
    case DType::Float32: return 4;
    case DType::Float64: return 8;
    case DType::Int64: return 8;
  }
  return 0;
}

inline std::string_view dtype_name(DType dtype) {
  switch (dtype) {
    case DType::Float32: return "float32";
    case DType::Float64: return "float64";
    case DType::Int64: return "int64";
  }
  return "?";
}

inline bool is_floating_point(DType dtype) {
  return dtype == DType::Float32 || dtype == DType::Float64;
}

// The dtype of a result computed from operands of dtypes a and b, as torch.result_type
// for tensors: a float beats an integer; the wider float beats the narrower.
inline DType promote_types(DType a, DType b) {
  if (a == b) return a;
  if (a == DType::Float64 || b == DType::Float64) return DType::Float64;
  return DType::Float32;  // one is float32, the other float32 or int64
}

// The DType of a C++ element type: dtype_of<float>() == DType::Float32.
template <typename T>
constexpr DType dtype_of() {
  static_assert(std::is_same_v<T, float> || std::is_same_v<T, double> ||
                    std::is_same_v<T, int64_t>,
                "minigrad tensors hold float, double or int64_t");
  if constexpr (std::is_same_v<T, float>) {
    return DType::Float32;
  } else if constexpr (std::is_same_v<T, double>) {
    return DType::Float64;
  } else {
    return DType::Int64;
  }
}

}  // namespace mg

template <>
struct fmt::formatter<mg::DType> : fmt::formatter<std::string_view> {
  template <typename Ctx>
  auto format(mg::DType d, Ctx& ctx) const {
    return fmt::formatter<std::string_view>::format(mg::dtype_name(d), ctx);
  }
};
