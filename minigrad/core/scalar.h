// Scalar: a number given to a tensor op (x * 2, x + 0.5, x.mul_(3)), as libtorch's
// c10::Scalar. It remembers whether it was written as an integer or as a floating-point
// number, because that category, never the value, decides the dtype of the result (torch's
// type promotion): an int64 tensor times 2 stays int64, times 2.0 or 2.5 becomes float32.
// The C++ type is the category: 2, 2L, true are integers; 2.0, 2.0f are floating-point.
#pragma once

#include <cstdint>
#include <limits>
#include <string>
#include <type_traits>

#include <fmt/format.h>

#include <minigrad/core/dtype.h>
#include <minigrad/core/error.h>

namespace mg {

class Scalar {
 public:
  // Any arithmetic value, implicitly (so that x * 2 and x * 0.5 both read as in Python).
  template <typename T, std::enable_if_t<std::is_arithmetic_v<T>, int> = 0>
  Scalar(T value) {  // NOLINT(google-explicit-constructor): implicit on purpose
    if constexpr (std::is_floating_point_v<T>) {
      floating_ = true;
      double_ = static_cast<double>(value);
    } else if constexpr (std::is_unsigned_v<T> && sizeof(T) >= sizeof(int64_t)) {
      MG_CHECK(value <= static_cast<T>(std::numeric_limits<int64_t>::max()),
               "Scalar: the integer {} does not fit in int64", value);
      int_ = static_cast<int64_t>(value);
    } else {
      int_ = static_cast<int64_t>(value);
    }
  }

  bool is_floating_point() const { return floating_; }
  bool is_integral() const { return !floating_; }
  // The value as a double (an integer past 2^53 rounds; to_int64 keeps it exact).
  double to_double() const { return floating_ ? double_ : static_cast<double>(int_); }
  // The integer; mg::Error for a floating-point scalar (which an integer op would truncate).
  int64_t to_int64() const {
    MG_CHECK(!floating_, "Scalar: {} is a floating-point number, not an integer", str());
    return int_;
  }
  // -value in the same category (an integer wraps at INT64_MIN, as int64 tensors do).
  Scalar operator-() const {
    if (floating_) return Scalar(-double_);
    return Scalar(static_cast<int64_t>(0ULL - static_cast<uint64_t>(int_)));
  }
  // "2" for an integer, "2.0" or "0.5" for a floating-point number (Python's spelling).
  std::string str() const;

 private:
  bool floating_ = false;
  double double_ = 0.0;
  int64_t int_ = 0;
};

// The dtype of a tensor of `tensor` dtype combined with `s`, by category (torch's
// result_type of a tensor and a Python number): an int64 tensor with a floating-point
// scalar gives float32, the default float dtype; otherwise the tensor's dtype.
inline DType promote_types(DType tensor, const Scalar& s) {
  return tensor == DType::Int64 && s.is_floating_point() ? DType::Float32 : tensor;
}

inline std::string Scalar::str() const {
  if (!floating_) return std::to_string(int_);
  std::string s = fmt::format("{}", double_);
  if (s.find_first_of(".eEn") == std::string::npos) s += ".0";  // not for inf and nan
  return s;
}

}  // namespace mg
