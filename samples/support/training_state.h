// What a checkpoint of train_fashion_mnist saves and restores: the model's parameters and
// the optimizer's state as one process would hold them (nn::state_dict(model)'s names,
// and the "<name>.<i>" of an optimizer over model.parameters()), however the run spreads
// them over its ranks:
//
//   --zero 0     the model and its optimizer, whole on every rank
//   --zero 1, 2  the model whole, the optimizer's state in shards (ZeroRedundancyOptimizer)
//   --zero 3     both in shards (FullyShardedDataParallel; its optimizer over the shards)
//
// so a checkpoint written by any run resumes another of the same model and options,
// sharded or not. Reading the sharded parts is a collective: every rank calls
// model_state() and optimizer_state(), rank 0 gets the whole (the others get nothing).
#pragma once

#include <string>

#include <minigrad/nn/module.h>
#include <minigrad/nn/optim/optimizer.h>
#include <minigrad/nn/serialize.h>

namespace mg::samples {

class TrainingState {
 public:
  // `model`: the plain model; `net`: what forward runs through (the model, DDP, or FSDP);
  // `optimizer`: what the loop steps (a plain one, or a ZeroRedundancyOptimizer).
  TrainingState(nn::Module& model, nn::Module& net, optim::Optimizer& optimizer)
      : model_(model), net_(net), optimizer_(optimizer) {}

  nn::TensorDict model_state() const;
  nn::TensorDict optimizer_state() const;
  // mg::Error naming `source` when the states do not fit the model and the optimizer;
  // nothing changes then.
  void check(const nn::TensorDict& model_state, const nn::TensorDict& optimizer_state,
             const std::string& source) const;
  // check(), then every rank keeps its part of the states.
  void load(const nn::TensorDict& model_state, const nn::TensorDict& optimizer_state,
            const std::string& source);

 private:
  nn::Module& model_;
  nn::Module& net_;
  optim::Optimizer& optimizer_;
};

}  // namespace mg::samples
