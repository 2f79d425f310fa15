// An optimizer's state under the single-device names, from any split, and back into any
// other split (torch.distributed.checkpoint's get_optimizer_state_dict with
// full_state_dict=True), read off the placements of the optimizer's parameters
// (placement.h): tp shards, a pipeline stage's parameters, ZeRO's and FSDP's flat shards.
//
//   full_optimizer_state(opt, names, world)
//     -> {"0.weight": {"exp_avg": [8, 6], "exp_avg_sq": [8, 6], "step": []}, ...}
//
// A state tensor shaped like its parameter (AdamW's exp_avg, SGD's momentum) is placed as
// the parameter is, so it travels and assembles as the parameter's pieces do
// (piece_exchange.h); any other (AdamW's step, one per shard tensor) is one value for every
// single-device parameter the tensor holds a piece of, and the ranks must agree on it.
// Loading builds each parameter's state from the whole ones (local_part of each piece; a
// flat shard's padding gets zeros) and hands the optimizer all of it at once
// (Optimizer::load_state_dict: checked first, a bad state changes nothing). A parameter
// the full state does not name gets no state, as after load_state_dict; a flat shard whose
// pieces have state for some of their parameters and not others is an mg::Error.
//
// `named`: names for the optimizer's parameters whose placements name none (found by
// tensor): a model's named_parameters(); may be empty when every spec names its pieces.
// The trainer maps the names to a single-device optimizer's indices with
// indexed_optimizer_state (and back with named_optimizer_state).
#pragma once

#include <map>
#include <memory>
#include <string>
#include <vector>

#include <minigrad/nn/module.h>
#include <minigrad/nn/optim/optimizer.h>
#include <minigrad/parallel/c10d/process_group.h>

namespace mg::parallel {

// Single-device parameter name -> its state by name, each tensor whole (on the CPU).
using OptimizerState = std::map<std::string, optim::TensorDict>;

// A collective over `world` (null: every rank's parameters are in this process); the whole
// state on every rank.
OptimizerState full_optimizer_state(const optim::Optimizer& optimizer, const std::vector<nn::NamedTensor>& named,
                                    const std::shared_ptr<ProcessGroup>& world);

// Not a collective: every rank passes the same whole state.
void load_full_optimizer_state(optim::Optimizer& optimizer, const std::vector<nn::NamedTensor>& named,
                               const OptimizerState& state, const std::string& source = "optimizer state");

// The state dict of a single-device optimizer over the parameters `names` (in its order):
// "<state>.<i>" for parameter i = names[i]; mg::Error for a name of `state` not in `names`.
optim::TensorDict indexed_optimizer_state(const OptimizerState& state, const std::vector<std::string>& names);
// The inverse: a single-device optimizer's state_dict() under its parameters' names.
OptimizerState named_optimizer_state(const optim::TensorDict& state_dict, const std::vector<std::string>& names);

}  // namespace mg::parallel
