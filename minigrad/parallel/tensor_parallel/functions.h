// The four conjugate functions of tensor parallelism (Megatron-LM's mappings.py: its "f"
// and "g" and their two cousins), each an autograd function whose forward and backward
// are a collective and its transpose:
//
//   function                 forward                      backward
//   copy_to_parallel    (f)  identity                     all-reduce (sum)
//   reduce_from_parallel (g) all-reduce (sum)             identity
//   scatter_to_parallel      keep this rank's slice       all-gather the slices
//   gather_from_parallel     all-gather the slices        keep this rank's slice
//
// The slices are along the last dimension, of size() equal parts (rank r owns part r).
// Why these backwards: a tensor every rank holds whole (replicated) and feeds into its own
// shard of a layer gets, on each rank, only that shard's part of its gradient; the sum of
// the parts is the gradient (f). A sum of partial results (g) is one value that every rank
// then uses alike, so every rank's gradient of it is already the gradient of each part.
// docs/tensor-parallel.md draws where each one sits in an MLP block.
//
// With a group of one rank every function returns its input as it is.
#pragma once

#include <minigrad/core/tensor.h>
#include <minigrad/parallel/tensor_parallel/group.h>

namespace mg::parallel {

Tensor copy_to_parallel(const Tensor& x, const TensorParallelGroupPtr& group);
Tensor reduce_from_parallel(const Tensor& x, const TensorParallelGroupPtr& group);
Tensor scatter_to_parallel(const Tensor& x, const TensorParallelGroupPtr& group);
Tensor gather_from_parallel(const Tensor& x, const TensorParallelGroupPtr& group);

}  // namespace mg::parallel
