// SavedTensor: a tensor that forward keeps for backward (libtorch's SavedVariable), with
// the version of its memory at the moment it was saved.
//
// Backward computes with the values forward saw: MulBackward multiplies the incoming
// gradient by the other factor, ReluBackward masks with the output. If that memory is
// rewritten in place between forward and backward (an optimizer step, w.mul_(5) under a
// NoGradGuard, an all-gather into a parameter), backward would silently compute the
// gradient of a different function. Every in-place write bumps the storage's version
// counter (core/storage.h), so unpack() can tell: it throws, as PyTorch does, instead of
// returning a gradient that is wrong.
//
// Every backward in autograd/functions/ gets the tensors it needs through a SavedTensor
// captured by its closure, never through a captured Tensor:
//
//   record_function("MulBackward", {a, b}, {out},
//                   [a = SavedTensor(a), b = SavedTensor(b)](const BackwardArgs& g) {
//                     ... ops::binary(BinaryOp::Mul, g.grad(), b.unpack(g)) ...
//                   });
//
// unpack() checks only the tensors a backward actually uses, so (as in PyTorch)
// modifying a factor whose gradient is not needed is not an error. A deliberate
// rewrite that keeps what the graph expects can be hidden from the check with
// autograd::UnsafePreserveVersionCounter (autograd/version_counter.h).
#pragma once

#include <cstdint>

#include <minigrad/autograd/node.h>
#include <minigrad/core/tensor.h>

namespace mg {

class SavedTensor {
 public:
  SavedTensor() = default;
  // Keeps a detached alias of `t` (the node must not own its own output's grad_fn) and
  // t's version now. An undefined `t` saves nothing.
  explicit SavedTensor(const Tensor& t);

  // The saved tensor, once its version is checked: an mg::Error naming the node of
  // `args`, the in-place operation, the versions and the tensor's shape, dtype and device
  // if its memory was modified in place since it was saved.
  const Tensor& unpack(const BackwardArgs& args) const;

  bool defined() const { return data_.defined(); }
  uint64_t saved_version() const { return saved_version_; }

 private:
  Tensor data_;
  uint64_t saved_version_ = 0;
};

}  // namespace mg
