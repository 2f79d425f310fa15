// Sequence parallelism's two conjugate functions (Megatron-LM's mappings.py:
// gather_from_sequence_parallel_region and reduce_scatter_to_sequence_parallel_region),
// autograd functions over the sequence dimension T of activations [B, T, C]:
//
//   function                              forward                   backward
//   gather_from_sequence_parallel         all-gather along T        reduce-scatter along T
//   reduce_scatter_to_sequence_parallel   reduce-scatter along T    all-gather along T
//   scatter_to_sequence_parallel          keep this rank's T/n      all-gather along T
//
// Between two transformer blocks' column and row layers the activations are the same on
// every tensor-parallel rank (replicated), so LayerNorm, dropout and the residual adds
// repeat the same work n times and keep n copies. Sequence parallelism cuts that region
// along T instead: rank r holds positions r*T/n .. (r+1)*T/n. Entering a column layer
// all-gathers the positions (it needs every position, and replaces copy_to_parallel);
// leaving a row layer reduce-scatters its partial sums along T (replacing the all-reduce
// of reduce_from_parallel: an all-reduce is a reduce-scatter then an all-gather, so the
// bytes are the same, and the activations in between are 1/n the size).
// Backward: the all-gather's gradient is each rank's slice of the sum of the gradients the
// column layers' shards send back (a reduce-scatter); the reduce-scatter's gradient is
// every rank's slice, side by side (an all-gather).
//
// T must divide by the group's size (an mg::Error otherwise). With a group of one rank
// both return their input as it is.
#pragma once

#include <minigrad/core/tensor.h>
#include <minigrad/parallel/tensor_parallel/group.h>

namespace mg::parallel {

// x [B, T/n, ...] -> [B, T, ...]
Tensor gather_from_sequence_parallel(const Tensor& x, const TensorParallelGroupPtr& group);
// x [B, T, ...] (the same on every rank) -> this rank's positions [B, T/n, ...]; backward
// all-gathers the ranks' gradients along T (Megatron's scatter_to_sequence_parallel_region:
// where a replicated activation enters a sequence-parallel region).
Tensor scatter_to_sequence_parallel(const Tensor& x, const TensorParallelGroupPtr& group);
// x [B, T, ...] (a partial sum on each rank) -> this rank's positions of the sum [B, T/n, ...]
Tensor reduce_scatter_to_sequence_parallel(const Tensor& x, const TensorParallelGroupPtr& group);

}  // namespace mg::parallel
