// What a style has done to an activation, written on the activation itself: that it is now
// whole (Replicate) over a tensor-parallel group and that the backward of the step that made
// it whole sums its gradient. DTensor carries such a placement on every activation; minigrad's
// activations stay plain tensors, and only this one fact needs to travel: a
// ColumnParallelLinear given an input that PrepareModuleInput has already gathered (a
// Llama's q, k and v projections share one gathered input) must not add copy_to_parallel's
// all-reduce to the gather's reduce-scatter, which would count the gradient n times.
#pragma once

#include <minigrad/core/tensor.h>
#include <minigrad/parallel/tensor_parallel/group.h>

namespace mg::parallel {

// Marks `x` (a new tensor a style produced) as made whole over `group`.
void mark_made_whole(const Tensor& x, const TensorParallelGroup& group);
// Whether `x` carries that mark for `group`.
bool is_made_whole_for(const Tensor& x, const TensorParallelGroup& group);

}  // namespace mg::parallel
