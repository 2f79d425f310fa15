// bfloat16 and float16 for the CUDA kernels that compute in their element type (the row
// ops: softmax, log_softmax, cross-entropy, layer norm; attention; sum, argmax, abs_max;
// embedding's backward): the op runs its float32 kernel on float32 copies of its 16-bit
// inputs, made on the device by the conversion kernel (exact), and each 16-bit output is
// rounded once from the float32 result, as core/cpu/widen.h does on the host. The
// elementwise ops, gelu, dropout, masked_fill, the embedding gather, copies, fills and the
// GEMMs (cuBLAS with CUBLAS_COMPUTE_32F) take 16-bit memory directly. The copies cost
// memory traffic, not accuracy: these kernels still accumulate in float32. Internal to cuda/.
#pragma once

#include <minigrad/cuda/backend.h>

namespace mg::cuda {

// A float32 contiguous copy of a 16-bit float tensor; any other (or undefined) tensor as it is.
inline Tensor widen(const Tensor& t) {
  if (!t.defined() || !is_reduced_float(t.dtype())) return t;
  Tensor wide = empty(t.shape(), DType::Float32, t.device());
  if (wide.numel() > 0) cuda_backend().convert(wide, t);
  return wide;
}

// Where an op writes a 16-bit `out`: a float32 tensor of its shape (holding out's values
// when the op adds into them); any other out itself.
inline Tensor float32_stand_in(const Tensor& out, bool keep_values = false) {
  if (!out.defined() || !is_reduced_float(out.dtype())) return out;
  return keep_values ? widen(out) : empty(out.shape(), DType::Float32, out.device());
}

// Rounds the stand-in's values into `out` (nothing when the stand-in is out itself).
inline void round_into(const Tensor& out, const Tensor& stand_in) {
  if (!out.defined() || out.is_same(stand_in) || out.numel() == 0) return;
  cuda_backend().convert(out, stand_in);
}

}  // namespace mg::cuda
