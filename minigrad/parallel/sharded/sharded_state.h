// Optimizer state between an optimizer over shards and one over the original parameters.
//
// ZeRO and FSDP build their optimizer over the shards: its parameter g is groups[g]->shard()
// (a FlatParameter's shard), so its state_dict() reads
//   sharded  "<name>.<g>"  a tensor of the shard's shape [S_g] for state kept per element
//                          (SGD's momentum_buffer, Adam's exp_avg), anything else (Adam's
//                          step) one value for every parameter of the group;
// while a single process's optimizer over the original parameters would hold
//   full     "<name>.<i>"  for every original parameter i (FlatParameter::indices()),
//                          shaped like it (per element) or as it was (per parameter).
// The full form is what an unsharded optimizer's load_state_dict() takes, so a checkpoint
// written by a sharded run can be resumed by a plain one and the other way round.
#pragma once

#include <string>
#include <vector>

#include <minigrad/nn/serialize.h>
#include <minigrad/parallel/c10d/process_group.h>
#include <minigrad/parallel/sharded/flat_parameter.h>

namespace mg::parallel {

// A collective (every rank calls it with its own sharded state, the same groups): the
// full state on rank 0, an empty dict on the others.
nn::TensorDict gather_full_optimizer_state(const nn::TensorDict& sharded,
                                           const std::vector<const FlatParameter*>& groups,
                                           ProcessGroup& group);

// This rank's sharded state out of a full one (no communication: every rank passes the
// same full state). mg::Error naming `source` for a key that is not "<name>.<index>", an
// index that is no parameter's, a tensor of the wrong shape, or a group whose parameters
// do not all have the state.
nn::TensorDict shard_full_optimizer_state(const nn::TensorDict& full,
                                          const std::vector<const FlatParameter*>& groups,
                                          const std::string& source = "optimizer state");

}  // namespace mg::parallel
