// bfloat16 and float16 on the host, for the ops whose float32 kernel does more than map
// one element to one element (GEMMs, reductions, softmax, layer norm, attention, ...):
// the op runs its float32 kernel on float32 copies of its 16-bit inputs ("widened":
// exact) and rounds each 16-bit output once (convert in, compute in float32, round once
// on the way out). The result is therefore exactly the float32 op's on the same 16-bit
// inputs, rounded, which is what the table test (tests/core/reduced_float_ops_test.cpp)
// checks. Why not 16-bit arithmetic: OpenBLAS 0.3.21 as Debian builds it has no bfloat16
// GEMM (cblas_sbgemm is declared in its header but not in the library), and the library
// is compiled for the baseline x86-64, which has no 16-bit float instructions; the cost
// is the copies (docs/performance.md). The elementwise ops need none of this: their
// kernels load each element as float and round when they store (compute_t, core/dtype.h).
#pragma once

#include <minigrad/core/cpu/cpu_backend.h>

namespace mg::cpu {

// A float32 contiguous copy of a 16-bit float tensor; any other tensor (or an undefined
// one) as it is.
inline Tensor widen(const Tensor& t) {
  if (!t.defined() || !is_reduced_float(t.dtype())) return t;
  Tensor wide = empty(t.shape(), DType::Float32, Device::cpu());
  if (wide.numel() > 0) cpu_backend().convert(wide, t);
  return wide;
}

// Where an op writes `out`: a float32 tensor of its shape when out is a 16-bit float
// (holding out's values when the op reads them, as an accumulating backward does), else
// out itself.
inline Tensor float32_stand_in(const Tensor& out, bool keep_values = false) {
  if (!out.defined() || !is_reduced_float(out.dtype())) return out;
  return keep_values ? widen(out) : empty(out.shape(), DType::Float32, Device::cpu());
}

// Rounds the stand-in's values into `out` (nothing when the stand-in is out itself).
inline void round_into(const Tensor& out, const Tensor& stand_in) {
  if (!out.defined() || out.is_same(stand_in) || out.numel() == 0) return;
  cpu_backend().convert(out, stand_in);
}

}  // namespace mg::cpu
