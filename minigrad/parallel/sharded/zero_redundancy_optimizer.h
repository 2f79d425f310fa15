// ZeroRedundancyOptimizer: ZeRO stages 1 and 2 around any optimizer, as PyTorch's
// torch.distributed.optim.ZeroRedundancyOptimizer (stage 1) and DeepSpeed's stage 2.
//
// Stage 1 -- the optimizer state is sharded. With DistributedDataParallel, every rank has
// the whole averaged gradient after backward, as before:
//
//   auto make_adamw = [](std::vector<Tensor> shards) {   // any optim::Optimizer
//     return std::make_unique<optim::AdamW>(std::move(shards), optim::AdamWOptions(1e-3));
//   };
//   auto ddp = std::make_shared<parallel::DistributedDataParallel>(model, pg);
//   parallel::ZeroRedundancyOptimizer zero(model->parameters(), pg, make_adamw);
//   zero.zero_grad(); loss_fn(ddp->forward(x), y).backward(); zero.step();
//
// Stage 2 -- the gradients too. No DDP: backward reduce-scatters each bucket's gradients
// into its owner's shard through post-accumulate hooks, and frees them:
//
//   ZeroOptions options; options.stage = 2;
//   parallel::ZeroRedundancyOptimizer zero(model->parameters(), pg, make_adamw, options);
//   zero.zero_grad(); loss_fn(model->forward(x), y).backward(); zero.step();
//
// The parameters are laid into buckets of about bucket_cap_mb (last parameter first, as
// DDP's buckets), each a FlatParameter (flat_parameter.h) with ShardStorage::ViewOfFull:
// every rank keeps all the parameters, and the optimizer it was given (the "local"
// optimizer) is built over its shards of the buckets -- one 1-D tensor per bucket, a view
// of its slot of the flat buffer. step():
//
//   stage 1: each shard's gradient is copied out of the parameters' (DDP-averaged) ones;
//   stage 2: the hooks put it there during backward (ShardedGradReducer);
//   then:    the local optimizer steps the shards only (1/N of the work and of the
//            state), and an all_gather per bucket fills every rank's flat buffers, so all
//            the parameters, with everyone's update.
//
// It is itself an optim::Optimizer over this rank's shards (as FSDP's parameters() are its
// shards): parameters() are the shards; set_lr, state(i) and state_dict() are the local
// optimizer's (state "<name>.<bucket>": a sharded checkpoint); zero_grad() also clears the
// full gradients of stage 1. full_state_dict() gathers the state an unsharded optimizer
// over the original parameters would hold.
//
// Placements (parallel/placement.h): the parameters, which every rank keeps whole, are
// recorded Replicate over "dp"; each shard holds pieces of them, flat ranges over "dp"
// (FlatParameter::record_spec), which full_optimizer_state reads.
//
// Any elementwise optimizer (SGD, Adam, AdamW) steps a shard exactly as it would the
// same elements inside whole tensors, so the parameters follow those of a single process.
// A parameter without a gradient counts as a zero gradient (its elements share a flat
// shard with others); only when no parameter has one is the step skipped.
#pragma once

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include <minigrad/nn/module.h>
#include <minigrad/nn/optim/optimizer.h>
#include <minigrad/nn/serialize.h>
#include <minigrad/parallel/c10d/process_group.h>
#include <minigrad/parallel/sharded/flat_parameter.h>
#include <minigrad/parallel/sharded/sharded_grad_reducer.h>

namespace mg::parallel {

struct ZeroOptions {
  // 1: optimizer state sharded (use with DistributedDataParallel); 2: gradients as well
  // (reduce-scattered in backward; use the plain module, not DDP).
  int stage = 1;
  // The size of a bucket: the unit of the gradient reduce-scatter and the all-gather.
  double bucket_cap_mb = 25.0;
};

// Builds the local optimizer over the shards it is given.
using OptimizerFactory =
    std::function<std::unique_ptr<optim::Optimizer>(std::vector<Tensor> shards)>;

// What a rank holds and sends, for benchmarks and memory checks.
struct ZeroStats {
  size_t parameter_bytes = 0;   // every bucket's flat buffer: all the parameters
  size_t shard_bytes = 0;       // this rank's shards of them
  size_t optimizer_state_bytes = 0;
  size_t all_gather_bytes = 0;  // flat buffers filled by the last step's all-gathers
};

class ZeroRedundancyOptimizer : public optim::Optimizer {
 public:
  ZeroRedundancyOptimizer(std::vector<Tensor> params, std::shared_ptr<ProcessGroup> process_group,
                          const OptimizerFactory& make_optimizer, ZeroOptions options = {});
  // The same over a model's named_parameters(), whose names (the single-device model's)
  // name the pieces of the shards (name_placements, placement.h), for full_optimizer_state.
  ZeroRedundancyOptimizer(const std::vector<nn::NamedTensor>& params,
                          std::shared_ptr<ProcessGroup> process_group,
                          const OptimizerFactory& make_optimizer, ZeroOptions options = {});
  ~ZeroRedundancyOptimizer() override;

  // Steps this rank's shards, then gathers every rank's update into all the parameters.
  void step() override;
  // The shards' gradients, the original parameters' and the local optimizer's own (an
  // optim::MasterWeights' float32 masters: 4 bytes per shard element otherwise kept).
  void zero_grad(bool set_to_none = true) override;
  // Stage 1: each shard's gradient taken out of the full ones now rather than in step(), so
  // that what reads parameters()' gradients before the step (amp::GradScaler::unscale_, a
  // clip of the shards) changes the gradients the step uses; then the local optimizer's.
  void prepare_gradients() override;
  // The norm of the whole gradient, clipped to max_norm as nn::utils::clip_grad_norm_
  // would: parallel::clip_grad_norm_ (parallel/clip_grad.h) over the process group, on the
  // full gradients (stage 1: every rank holds them, rank 0's counted) or on the shards
  // (stage 2). Call between backward and step(). With other dimensions beside ZeRO's (a
  // tensor-parallel model), call parallel::clip_grad_norm_(parameters(), mesh) instead.
  Tensor clip_grad_norm_(double max_norm, double norm_type = 2.0);

  double lr() const override { return local_->lr(); }
  void set_lr(double lr) override { local_->set_lr(lr); }
  // mg::Error: a ZeroRedundancyOptimizer is built over a model's parameters, not shards.
  std::unique_ptr<optim::Optimizer> make_like(std::vector<Tensor> params) const override;

  // The parameters it was given, which every rank keeps whole.
  const std::vector<Tensor>& full_parameters() const { return full_params_; }
  const ZeroOptions& options() const { return options_; }
  size_t num_buckets() const { return buckets_.size(); }
  const FlatParameter& bucket(size_t b) const { return *buckets_[b]; }
  std::vector<const FlatParameter*> buckets() const;

  // ---- state: the local optimizer's, one entry per bucket shard ----
  std::vector<std::string> state_names() const override { return local_->state_names(); }
  optim::TensorDict state(size_t index) const override { return local_->state(index); }
  // A collective: on rank 0, the state an unsharded optimizer over full_parameters()
  // would hold ("<name>.<i>"), loadable by it; an empty dict on the other ranks.
  nn::TensorDict full_state_dict();
  // Every rank passes the same full state (e.g. read from one file); each keeps its shard.
  void load_full_state_dict(const nn::TensorDict& state, const std::string& source = "state dict");

  ZeroStats stats() const;
  ShardedReductionStats last_reduction_stats() const;

 protected:
  void check_param_state(size_t index, const optim::TensorDict& state,
                         const std::function<std::string(const std::string&)>& key,
                         std::vector<std::string>& problems) const override;
  void set_param_state(size_t index, const optim::TensorDict& state) override;

 private:
  struct Buckets;  // the buckets and their shards, made before the base class
  bool shards_prepared_ = false;  // stage 1: the shards' gradients taken since the last step
  ZeroRedundancyOptimizer(Buckets&& buckets, std::vector<Tensor> params,
                          std::shared_ptr<ProcessGroup> process_group,
                          const OptimizerFactory& make_optimizer, ZeroOptions options);

  std::vector<Tensor> full_params_;
  std::shared_ptr<ProcessGroup> process_group_;
  ZeroOptions options_;
  std::vector<std::unique_ptr<FlatParameter>> buckets_;
  std::unique_ptr<optim::Optimizer> local_;      // over the shards
  std::shared_ptr<ShardedGradReducer> reducer_;  // stage 2
  size_t all_gather_bytes_ = 0;
};

}  // namespace mg::parallel
