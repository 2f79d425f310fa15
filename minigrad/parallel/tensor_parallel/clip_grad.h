// clip_grad_norm_ over a tensor-parallel model, as PyTorch's clip over DTensor
// parameters: the norm of the whole model's gradient, in which a parameter split over the
// ranks counts by its shards (each element once) and a replicated one once, not once per
// rank. nn::utils::clip_grad_norm_ over one rank's parameters would miss the other
// ranks' shards; over every rank's (TensorParallel::parameters()) it would count each
// replicated parameter (a RowParallelLinear's bias, a Linear left whole) size() times.
//
//   total = (sum over ranks of sum |g|^p over the sharded gradients
//            + sum |g|^p over the replicated gradients, taken once)^(1/p)
//   total = max of the two maxima |g|                     (p = infinity)
//   g    *= min(max_norm / (total + 1e-6), 1)             (every gradient, every rank)
//
// Sharded: a ColumnParallelLinear's weight and bias, a RowParallelLinear's weight.
// Everything else is replicated: its gradient is the same on every rank (functions.h).
#pragma once

#include <vector>

#include <minigrad/core/tensor.h>
#include <minigrad/nn/module.h>
#include <minigrad/parallel/tensor_parallel/group.h>
#include <minigrad/parallel/tensor_parallel/tensor_parallel.h>

namespace mg::parallel {

// One rank's parameters of `module`, split by placement (in module.parameters() order).
struct TensorParallelParameters {
  std::vector<Tensor> sharded;
  std::vector<Tensor> replicated;
};
TensorParallelParameters tensor_parallel_parameters(const nn::Module& module);

// Across processes: every rank of `group` calls it with its own module (a collective:
// one all-reduce, or an all-gather for p = infinity). Returns the total norm, the same on
// every rank, as a float32 scalar on group->device().
Tensor clip_grad_norm_(const nn::Module& module, const TensorParallelGroupPtr& group,
                       double max_norm, double norm_type = 2.0);

// In one process: every rank's module of `model`. Returns the total norm on
// model.devices()[0].
Tensor clip_grad_norm_(const TensorParallel& model, double max_norm, double norm_type = 2.0);

}  // namespace mg::parallel
