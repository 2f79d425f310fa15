// bfloat16 and float16 in the kernels: __nv_bfloat16 and __half are storage, float is
// arithmetic. A kernel loads an element with to_compute (exact), computes in float and
// stores with from_compute (round to nearest even, once), as the CPU's compute_t does
// (core/dtype.h); for float, double and int64 both are the identity. Widened<S, F> runs a
// value function of elementwise.cu (written for float) on 16-bit storage that way.
#pragma once

#include <cstdint>
#include <type_traits>

#include <cuda_bf16.h>
#include <cuda_fp16.h>

namespace mg::cuda::kernels {

template <typename T>
struct ComputeType {
  using type = T;
};
template <>
struct ComputeType<__nv_bfloat16> {
  using type = float;
};
template <>
struct ComputeType<__half> {
  using type = float;
};
template <typename T>
using compute_t = typename ComputeType<T>::type;

template <typename T>
constexpr bool is_reduced_float_v = std::is_same_v<T, __nv_bfloat16> || std::is_same_v<T, __half>;

template <typename T>
__device__ __forceinline__ compute_t<T> to_compute(T x) {
  if constexpr (std::is_same_v<T, __nv_bfloat16>) {
    return __bfloat162float(x);
  } else if constexpr (std::is_same_v<T, __half>) {
    return __half2float(x);
  } else {
    return x;
  }
}

template <typename T>
__device__ __forceinline__ T from_compute(compute_t<T> x) {
  if constexpr (std::is_same_v<T, __nv_bfloat16>) {
    return __float2bfloat16_rn(x);
  } else if constexpr (std::is_same_v<T, __half>) {
    return __float2half_rn(x);
  } else {
    return x;
  }
}

// To from From, through float where either is 16-bit (as the CPU converts: a double or an
// int64 rounds to float first, then to 16 bits; a 16-bit value widens exactly).
template <typename To, typename From>
__device__ __forceinline__ To convert_value(From x) {
  if constexpr (std::is_same_v<To, From>) {
    return x;
  } else if constexpr (is_reduced_float_v<From>) {
    return static_cast<To>(to_compute(x));
  } else if constexpr (is_reduced_float_v<To>) {
    return from_compute<To>(static_cast<float>(x));
  } else {
    return static_cast<To>(x);
  }
}

// A value function F of 0, 1 or 2 float arguments run on 16-bit storage S.
template <typename S, typename F>
struct Widened {
  F f;
  __device__ S operator()() const { return from_compute<S>(f()); }
  __device__ S operator()(S x) const { return from_compute<S>(f(to_compute(x))); }
  __device__ S operator()(S a, S b) const { return from_compute<S>(f(to_compute(a), to_compute(b))); }
};
template <typename S, typename F>
Widened<S, F> widened(F f) {
  return Widened<S, F>{f};
}

}  // namespace mg::cuda::kernels
