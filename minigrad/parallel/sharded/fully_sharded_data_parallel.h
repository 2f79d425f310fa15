// FullyShardedDataParallel: ZeRO-3 as a wrapper module, torch's FSDP1 spelling, built on
// fully_shard (fully_shard.h): each child of a Sequential that has parameters is sharded as
// one unit, then the Sequential itself (any other module is a single unit).
//
//   auto fsdp = std::make_shared<parallel::FullyShardedDataParallel>(model, pg);
//   optim::AdamW opt(fsdp->parameters(), ...);      // this rank's shards ("flat_shard_<u>")
//   for (batch in this rank's part of the data (data::DistributedSampler)) {
//     opt.zero_grad();
//     loss_fn(fsdp->forward(x), y).backward();      // leaves the averaged gradient's shards
//     opt.step();                                   // each rank steps 1/N of the model
//   }
//
// It is a module so that it goes where a module goes (a sample's model, nn::state_dict of
// this rank's shards for a sharded checkpoint); everything else is the FSDPModule of the
// wrapped module (fsdp()), whose units and memory it shares. Move the module to the
// group's device before wrapping it: afterwards its parameters are views of the units'
// buffers, freed between uses.
#pragma once

#include <memory>
#include <string>

#include <minigrad/nn/module.h>
#include <minigrad/nn/serialize.h>
#include <minigrad/parallel/c10d/process_group.h>
#include <minigrad/parallel/sharded/fully_shard.h>

namespace mg::parallel {

class FullyShardedDataParallel : public nn::Module {
 public:
  FullyShardedDataParallel(nn::ModulePtr module, std::shared_ptr<ProcessGroup> process_group,
                           FSDPOptions options = {});

  Tensor forward(const Tensor& input) override;

  const nn::ModulePtr& module() const { return module_; }
  const std::shared_ptr<ProcessGroup>& process_group() const { return fsdp_->process_group(); }
  const std::shared_ptr<FSDPModule>& fsdp() const { return fsdp_; }
  size_t num_units() const { return fsdp_->num_units(); }
  const FlatParameter& unit(size_t u) const { return fsdp_->unit(u); }

  Tensor clip_grad_norm_(double max_norm, double norm_type = 2.0) { return fsdp_->clip_grad_norm_(max_norm, norm_type); }
  nn::TensorDict full_state_dict() { return fsdp_->full_state_dict(); }
  void load_full_state_dict(const nn::TensorDict& state, const std::string& source = "state dict") {
    fsdp_->load_full_state_dict(state, source);
  }
  FSDPStats stats() const { return fsdp_->stats(); }
  void reset_peak_stats() { fsdp_->reset_peak_stats(); }
  ShardedReductionStats last_reduction_stats() const { return fsdp_->last_reduction_stats(); }

  std::string extra_repr() const override;

 protected:
  nn::ModulePtr copy_node() const override;

 private:
  nn::ModulePtr module_;
  std::shared_ptr<FSDPModule> fsdp_;
};

}  // namespace mg::parallel
