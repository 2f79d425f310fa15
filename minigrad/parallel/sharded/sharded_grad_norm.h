// clip_grad_norm_ for gradients split over the ranks (ZeRO-2, FSDP), as PyTorch's
// FullyShardedDataParallel.clip_grad_norm_: nn::utils::clip_grad_norm_ over this rank's
// shards, whose partial (the sum of |g|^p over its own elements, or their max |g|) is
// reduced over the process group before the root is taken. The shards are disjoint and
// their padding is zeros, so every element of the whole gradient counts once:
//
//   total = (allreduce_sum(sum of |g|^p over this rank's shards))^(1/p)
//   g    *= min(max_norm / (total + 1e-6), 1)          on every rank alike
#pragma once

#include <vector>

#include <minigrad/core/tensor.h>
#include <minigrad/parallel/c10d/process_group.h>

namespace mg::parallel {

// A collective: every rank calls it with its shards (tensors whose .grad is this rank's
// part of the gradient; those without one count as zeros), also a rank whose shards are
// padding alone. Returns the total norm (a float32 scalar on the shards' device).
Tensor clip_grad_norm_(const std::vector<Tensor>& shards, double max_norm, ProcessGroup& group,
                       double norm_type = 2.0);

}  // namespace mg::parallel
