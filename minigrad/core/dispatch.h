// One switch from a runtime DType to a kernel's element type (PyTorch's
// AT_DISPATCH_FLOATING_TYPES). A kernel is a template over its element type, and
//
//   MG_DISPATCH_FLOATING_TYPES(t.dtype(), "gelu", [&] { gelu_rows<scalar_t>(...); });
//
// instantiates it for float and double, with `scalar_t` the element type; any other dtype
// is an mg::Error naming the op. The 16-bit floats (bfloat16, float16) are storage types a
// kernel cannot compute in: a kernel that loads each element as compute_t<scalar_t> (float
// for them, core/dtype.h) and rounds once when it stores takes them too, through the
// _AND_REDUCED forms (PyTorch's AT_DISPATCH_FLOATING_TYPES_AND2(Half, BFloat16, ...)).
// Usable in host code of the CPU backend and in .cu files alike.
#pragma once

#include <cstdint>

#include <minigrad/core/dtype.h>
#include <minigrad/core/error.h>

#define MG_DISPATCH_CASE_(enum_value, type, ...) \
  case enum_value: {                             \
    using scalar_t = type;                       \
    return __VA_ARGS__();                        \
  }

// Float32 and Float64.
#define MG_DISPATCH_FLOATING_TYPES(dtype, op, ...)                                        \
  [&] {                                                                                   \
    switch (dtype) {                                                                      \
      MG_DISPATCH_CASE_(::mg::DType::Float32, float, __VA_ARGS__)                         \
      MG_DISPATCH_CASE_(::mg::DType::Float64, double, __VA_ARGS__)                        \
      default:                                                                            \
        MG_FAIL("{}: expected a floating-point tensor (float32 or float64), got {}", op, \
                 dtype);                                                                  \
    }                                                                                     \
  }()

// Float32, Float64, BFloat16 and Float16: kernels that compute in compute_t<scalar_t>.
#define MG_DISPATCH_FLOATING_TYPES_AND_REDUCED(dtype, op, ...)                       \
  [&] {                                                                              \
    switch (dtype) {                                                                 \
      MG_DISPATCH_CASE_(::mg::DType::Float32, float, __VA_ARGS__)                    \
      MG_DISPATCH_CASE_(::mg::DType::Float64, double, __VA_ARGS__)                   \
      MG_DISPATCH_CASE_(::mg::DType::BFloat16, ::mg::bfloat16, __VA_ARGS__)          \
      MG_DISPATCH_CASE_(::mg::DType::Float16, ::mg::float16, __VA_ARGS__)            \
      default:                                                                       \
        MG_FAIL("{}: expected a floating-point tensor, got {}", op, dtype);          \
    }                                                                                \
  }()

// Float32, Float64 and Int64 (sums, add/sub/mul/div).
#define MG_DISPATCH_ALL_TYPES(dtype, op, ...)                            \
  [&] {                                                                  \
    switch (dtype) {                                                     \
      MG_DISPATCH_CASE_(::mg::DType::Float32, float, __VA_ARGS__)        \
      MG_DISPATCH_CASE_(::mg::DType::Float64, double, __VA_ARGS__)       \
      MG_DISPATCH_CASE_(::mg::DType::Int64, int64_t, __VA_ARGS__)        \
      default:                                                           \
        break;                                                           \
    }                                                                    \
    MG_FAIL("{}: unsupported dtype {}", op, dtype);                     \
  }()

// Every dtype: copies, conversions, fills, and arithmetic computed in compute_t<scalar_t>.
#define MG_DISPATCH_ALL_TYPES_AND_REDUCED(dtype, op, ...)                        \
  [&] {                                                                          \
    switch (dtype) {                                                             \
      MG_DISPATCH_CASE_(::mg::DType::Float32, float, __VA_ARGS__)                \
      MG_DISPATCH_CASE_(::mg::DType::Float64, double, __VA_ARGS__)               \
      MG_DISPATCH_CASE_(::mg::DType::Int64, int64_t, __VA_ARGS__)                \
      MG_DISPATCH_CASE_(::mg::DType::BFloat16, ::mg::bfloat16, __VA_ARGS__)      \
      MG_DISPATCH_CASE_(::mg::DType::Float16, ::mg::float16, __VA_ARGS__)        \
    }                                                                            \
    MG_FAIL("{}: unsupported dtype {}", op, dtype);                             \
  }()
