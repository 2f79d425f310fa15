// clip_grad_norm_ for gradients split over the ranks (ZeRO-2, FSDP), as PyTorch's
// FullyShardedDataParallel.clip_grad_norm_: the total 2-norm of the whole gradient is
// the square root of the sum, over the ranks, of each rank's sum of squares (the shards
// are disjoint and their padding is zeros, so every element counts once), and every rank
// scales its shards by the same factor:
//
//   total = sqrt(allreduce_sum(sum of g^2 over this rank's shards))
//   g    *= max_norm / (total + 1e-6)      when that factor is below 1
//
// the rule of nn::utils::clip_grad_norm_ on the unsharded gradients.
#pragma once

#include <vector>

#include <minigrad/core/tensor.h>
#include <minigrad/parallel/distributed/process_group.h>

namespace mg::parallel {

// A collective: every rank calls it with its shards (tensors whose .grad is this rank's
// part of the gradient; those without one count as zeros). Returns the total norm.
double clip_grad_norm_(const std::vector<Tensor>& shards, double max_norm, ProcessGroup& group);

}  // namespace mg::parallel
