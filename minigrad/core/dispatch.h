// One switch from a runtime DType to a kernel's element type (PyTorch's
// AT_DISPATCH_FLOATING_TYPES). A kernel is a template over its element type, and
//
//   MG_DISPATCH_FLOATING_TYPES(t.dtype(), "gelu", [&] { gelu_rows<scalar_t>(...); });
//
// instantiates it for every floating type minigrad has, with `scalar_t` the element type;
// any other dtype is an mg::Error naming the op. Adding a float type (float16, bfloat16)
// adds one case here, and every kernel written against scalar_t gets it. Usable in host
// code of the CPU backend and in .cu files alike.
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

// Float32, Float64 and Int64: every dtype (copies, fills, sums, add/sub/mul/div).
#define MG_DISPATCH_ALL_TYPES(dtype, op, ...)                            \
  [&] {                                                                  \
    switch (dtype) {                                                     \
      MG_DISPATCH_CASE_(::mg::DType::Float32, float, __VA_ARGS__)        \
      MG_DISPATCH_CASE_(::mg::DType::Float64, double, __VA_ARGS__)       \
      MG_DISPATCH_CASE_(::mg::DType::Int64, int64_t, __VA_ARGS__)        \
    }                                                                    \
    MG_FAIL("{}: unsupported dtype {}", op, dtype);                     \
  }()
