// Element types. minigrad computes in float32; int64 holds class labels and indices.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string_view>
#include <type_traits>

#include <fmt/format.h>

namespace mg {

enum class DType { Float32, Int64 };

inline std::size_t element_size(DType dtype) { return dtype == DType::Float32 ? 4 : 8; }

inline std::string_view dtype_name(DType dtype) {
  return dtype == DType::Float32 ? "float32" : "int64";
}

// The DType of a C++ element type: dtype_of<float>() == DType::Float32.
template <typename T>
constexpr DType dtype_of() {
  static_assert(std::is_same_v<T, float> || std::is_same_v<T, int64_t>,
                "minigrad tensors hold float or int64_t");
  return std::is_same_v<T, float> ? DType::Float32 : DType::Int64;
}

}  // namespace mg

template <>
struct fmt::formatter<mg::DType> : fmt::formatter<std::string_view> {
  template <typename Ctx>
  auto format(mg::DType d, Ctx& ctx) const {
    return fmt::formatter<std::string_view>::format(mg::dtype_name(d), ctx);
  }
};
