// Tensor arithmetic on the host as PyTorch's: int64 sums, differences and products wrap
// around in two's complement; computed in uint64, since signed overflow is undefined
// behaviour in C++. Floats are plain float arithmetic. (Division is checked by
// ops::binary before a kernel sees it: a zero divisor or INT64_MIN / -1 would trap.)
#pragma once

#include <cstdint>
#include <type_traits>

namespace mg::cpu {

template <typename T>
T add(T x, T y) {
  if constexpr (std::is_integral_v<T>) {
    return static_cast<T>(static_cast<uint64_t>(x) + static_cast<uint64_t>(y));
  } else {
    return x + y;
  }
}

template <typename T>
T sub(T x, T y) {
  if constexpr (std::is_integral_v<T>) {
    return static_cast<T>(static_cast<uint64_t>(x) - static_cast<uint64_t>(y));
  } else {
    return x - y;
  }
}

template <typename T>
T mul(T x, T y) {
  if constexpr (std::is_integral_v<T>) {
    return static_cast<T>(static_cast<uint64_t>(x) * static_cast<uint64_t>(y));
  } else {
    return x * y;
  }
}

}  // namespace mg::cpu
