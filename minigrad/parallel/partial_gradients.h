// The sums of partial gradients, read from placements (placement.h): after backward, a
// parameter whose placement says its gradient is Partial on a dimension holds this rank's
// share of the sum -- sequence parallelism's replicated weights (each rank saw its
// positions), every parameter under context parallelism (each rank saw its chunks' tokens),
// a pipeline's tied copies (each stage its use of the weight). One function sums them all,
// whatever form placed them:
//
//   loss.backward();
//   parallel::reduce_partial_gradients(model->parameters());
//   optimizer.step();
//
// Coalesced: per (dimension, group, dtype) one all-reduce of a flat buffer of its gradients
// laid end to end (the whole gradient, or a flat shard's ranges of it: FSDP over a
// sequence-parallel model). The buffers go in a fixed order every rank agrees on -- tied,
// tp, cp, then any other dimension by name; within one, by single-device name -- so every
// rank of a group must pass the same parameters split alike (the ranks of a tp group hold
// the same parameters, sharded or replicated; a pipeline's tied copies the same tensor under
// other local names, in another order). A parameter without a gradient reduces zeros
// and gets the sum, so every rank of a group reduces the same list. The sums go through the
// group's tensor-parallel view (tensor_parallel/group.h: counted in its stats; float64 as
// its bits, added in rank order, the same sum on every rank). With gradient accumulation,
// call it once, after the last micro-step.
//
// Under FSDP pass the shards (FSDPModule::parameters()): its reduce-scatter over dp ran in
// backward, and the sum over tp commutes with it (the tp ranks of a dp group lay their equal
// units out alike); the model's parameters hold no gradient there, and are refused.
#pragma once

#include <vector>

#include <minigrad/core/tensor.h>

namespace mg::parallel {

// A collective over every group some gradient is Partial on (a dimension of one rank is
// skipped). mg::Error for a Partial placement without a process group (ranks that are
// threads of one process), naming the parameter. Returns the number of all-reduces it ran.
int reduce_partial_gradients(const std::vector<Tensor>& parameters);

}  // namespace mg::parallel
