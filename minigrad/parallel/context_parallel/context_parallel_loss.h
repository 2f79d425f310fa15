// The data-parallel half of context parallelism: the loss over the whole sequence and the
// parameters' gradients summed over the cp group.
//
// Every cp rank holds the whole model and a different part of each sequence, so its
// parameter gradients are its tokens' share; as in data parallelism they are summed over
// the group (all_reduce_gradients) to give the gradient of the whole batch. The loss is
// the mean over the global tokens: each rank's summed token losses, all-reduced, divided
// by the global token count; backward through it gives each rank d(its own sum) / count,
// so the summed gradients are exactly the single-device mean's.
//
// A step under context parallelism (the model split by a plan: context_parallel/style.h):
//   parallelize_module(model, mesh, {"cp", {{"...attn", ContextParallel}, {"...wpe", ...}}})
//   idx_local = shard_sequence(idx, rank, cp); targets_local = shard_sequence(targets, ...)
//   loss = context_parallel_cross_entropy(model(idx_local), targets_local, *group)
//   loss.backward(); reduce_partial_gradients(model.parameters()); optimizer.step();
#pragma once

#include <vector>

#include <minigrad/core/tensor.h>
#include <minigrad/parallel/c10d/process_group.h>

namespace mg::parallel::context_parallel {

// GPT::loss over the whole sequence, from this rank's logits [B, Tl, V] and targets
// [B, Tl] (int64; -1 ignored): a 0-dim tensor whose value is the global mean of the token
// losses on every rank, and whose gradient reaches only this rank's logits (each rank's
// tokens count once, in its own backward). Every rank of the group calls it.
Tensor context_parallel_cross_entropy(const Tensor& logits, const Tensor& targets,
                                      ProcessGroup& group);

// A loss term over the whole group from this rank's part `local` (0-dim, differentiable):
// the value is the sum of every rank's `local`, the gradient reaches `local` alone (each
// rank's tokens count once, in its own backward). context_parallel_cross_entropy is this
// of the local sum over the global count; under tp and cp together LossParallel takes it of
// the vocabulary-parallel loss (loss_parallel.h).
Tensor context_parallel_sum(const Tensor& local, ProcessGroup& group);

// Sums every parameter's gradient over the group, in place (a parameter without one gets
// zeros first, so every rank reduces the same list). float32 in one coalesced all-reduce;
// float64 through sum_over_group (wire.h).
void all_reduce_gradients(const std::vector<Tensor>& parameters, ProcessGroup& group);

}  // namespace mg::parallel::context_parallel
