#include "training_state.h"

#include <minigrad/parallel/sharded/fully_sharded_data_parallel.h>
#include <minigrad/parallel/sharded/sharded_state.h>
#include <minigrad/parallel/sharded/zero_redundancy_optimizer.h>

namespace mg::samples {

namespace {

// The units of an FSDP run, whose shards its optimizer steps.
std::vector<const parallel::FlatParameter*> units_of(
    const parallel::FullyShardedDataParallel& fsdp) {
  std::vector<const parallel::FlatParameter*> units;
  for (size_t u = 0; u < fsdp.num_units(); ++u) units.push_back(&fsdp.unit(u));
  return units;
}

}  // namespace

nn::TensorDict TrainingState::model_state() const {
  if (auto* fsdp = dynamic_cast<parallel::FullyShardedDataParallel*>(&net_))
    return fsdp->full_state_dict();
  return nn::state_dict(model_);
}

nn::TensorDict TrainingState::optimizer_state() const {
  if (auto* zero = dynamic_cast<parallel::ZeroRedundancyOptimizer*>(&optimizer_))
    return zero->full_state_dict();
  if (auto* fsdp = dynamic_cast<parallel::FullyShardedDataParallel*>(&net_))
    return parallel::gather_full_optimizer_state(optimizer_.state_dict(), units_of(*fsdp),
                                                 *fsdp->process_group());
  return optimizer_.state_dict();
}

void TrainingState::check(const nn::TensorDict& model_state,
                          const nn::TensorDict& optimizer_state, const std::string& source) const {
  nn::check_state_dict(model_, model_state, source);  // names and shapes: nothing is read
  if (auto* zero = dynamic_cast<parallel::ZeroRedundancyOptimizer*>(&optimizer_)) {
    zero->check_state_dict(parallel::shard_full_optimizer_state(optimizer_state, zero->buckets(),
                                                                source),
                           source);
  } else if (auto* fsdp = dynamic_cast<parallel::FullyShardedDataParallel*>(&net_)) {
    optimizer_.check_state_dict(
        parallel::shard_full_optimizer_state(optimizer_state, units_of(*fsdp), source), source);
  } else {
    optimizer_.check_state_dict(optimizer_state, source);
  }
}

void TrainingState::load(const nn::TensorDict& model_state, const nn::TensorDict& optimizer_state,
                         const std::string& source) {
  check(model_state, optimizer_state, source);
  if (auto* fsdp = dynamic_cast<parallel::FullyShardedDataParallel*>(&net_)) {
    fsdp->load_full_state_dict(model_state, source);
    optimizer_.load_state_dict(
        parallel::shard_full_optimizer_state(optimizer_state, units_of(*fsdp), source), source);
    return;
  }
  nn::load_state_dict(model_, model_state, source);
  if (auto* zero = dynamic_cast<parallel::ZeroRedundancyOptimizer*>(&optimizer_)) {
    zero->load_full_state_dict(optimizer_state, source);
  } else {
    optimizer_.load_state_dict(optimizer_state, source);
  }
}

}  // namespace mg::samples
