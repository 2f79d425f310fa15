// FullyShardedDataParallel: ZeRO-3, as torch.distributed.fsdp. Parameters, gradients
// and optimizer state are all split over the ranks: at rest each rank holds 1/N of each.
//
//   auto fsdp = parallel::fully_shard(model, pg);   // model: a Sequential of layers or blocks
//   optim::AdamW opt(fsdp->parameters(), ...);      // its parameters are this rank's shards
//   for (batch in this rank's part of the data (data::DistributedSampler)) {
//     opt.zero_grad();
//     loss_fn(fsdp->forward(x), y).backward();      // leaves the averaged gradient's shards
//     opt.step();                                   // each rank steps 1/N of the model
//   }
//
// Units. Each child of a Sequential that has parameters is one unit (any other module is
// a single unit): its parameters become one FlatParameter (flat_parameter.h) with
// ShardStorage::Separate, whose shard is registered here as parameter "flat_shard_<u>".
// The wrapped module keeps its own parameter tensors, now views of the unit's flat
// buffer, whose memory exists only while the unit runs:
//
//   forward of unit u:  (a forward pre-hook on the unit's module, nn/module.h) allocate
//                       the flat buffer, all_gather the shards into it (and start
//                       gathering unit u+1: forward_prefetch); the module's own forward
//                       runs; (its forward hook) the output passes through an
//                       UnshardBeforeBackward node, and the buffer is freed
//                       (Storage::resize_(0)) as unit u+1's forward begins. The last unit
//                       stays gathered when a backward is to follow: its backward comes
//                       first, at once;
//   backward of unit u: that node runs as soon as u's output gradient is in, before any of
//                       u's own backward: it gathers u's parameters again into the same
//                       storage block -- so the views that u's autograd nodes saved in
//                       forward read valid memory again -- and starts gathering unit u-1
//                       (backward_prefetch), which then arrives while u computes;
//                       then u's backward runs, and once every gradient of u is in, the
//                       post-accumulate hooks reduce_scatter them (ShardedGradReducer)
//                       and free u's buffer once more.
//
// So a rank holds, besides its shards, the gathered parameters of at most two units (the
// one computing and the one being prefetched).
//
// Units named by the caller (an auto-wrap policy, e.g. gpt_fsdp.h): each
// FSDPUnit lists the submodules whose parameters form it; the hooks go on each of them.
// A unit stays gathered from its first module's forward until another unit's forward
// begins (so one unit of two modules, wte and wpe, is gathered once), and the unit in use
// when the forward ends stays for the backward that begins with it. A weight read again
// outside any module -- GPT's head, which is wte -- names the module after whose forward
// it is read (used_after): the unit is gathered again there, and after the backward of
// that use it is freed until its own modules' backward gathers it once more.
//
// With activation checkpointing (nn/checkpoint.h) on a unit's module, its forward runs
// without a graph and is rerun in backward; the hooks gather the unit for that rerun
// too (nn::is_recomputing()), and the reduce-scatter of its gradients frees it again.
//
// Why a freed storage block and not re-running the unit in backward (activation
// checkpointing): the autograd graph built in forward stays the graph backward runs, and
// the activations stay the ones forward computed; only the parameters' memory comes and
// goes. That is what FSDP does (its FlatParameter storage is resized to 0 and back).
//
// Every parameter must require grad (each is sharded and trained); buffers are broadcast
// from rank 0 at construction and stay whole. Move the module to the group's device
// before wrapping it: afterwards its parameters are views of the units' buffers.
//
// Placements (parallel/placement.h): each unit's shard records the pieces it holds, under
// the wrapped module's names (unless a parameter's spec names it), with the placements the
// parameters had (a tensor-parallel shard's), as flat ranges over "dp".
//
// Checkpoints: nn::state_dict(*fsdp) is this rank's shards ("flat_shard_<u>"), a sharded
// checkpoint for resuming on the same number of ranks; full_state_dict() gathers the
// unsharded parameters on rank 0 under the wrapped module's names, loadable into the
// plain module with nn::load_state_dict; optimizer state likewise (sharded_state.h).
#pragma once

#include <memory>
#include <string>
#include <vector>

#include <minigrad/nn/module.h>
#include <minigrad/nn/serialize.h>
#include <minigrad/parallel/c10d/process_group.h>
#include <minigrad/parallel/sharded/flat_parameter.h>
#include <minigrad/parallel/sharded/sharded_grad_reducer.h>

namespace mg::parallel {

struct FSDPOptions {
  // In backward, start gathering the next unit's parameters when a unit's own have
  // arrived (FSDP's BackwardPrefetch.BACKWARD_PRE): communication overlaps compute, for
  // the memory of one more gathered unit.
  bool backward_prefetch = true;
  // The same in forward (FSDP's forward_prefetch): unit u+1's gather runs while u computes.
  bool forward_prefetch = true;
};

// A unit of an explicit wrapping: the parameters of `modules` (submodules of the wrapped
// module), one FlatParameter; `used_after`: modules after whose forward these parameters
// are read again outside any module (a tied head).
struct FSDPUnit {
  std::vector<nn::ModulePtr> modules;
  std::vector<nn::ModulePtr> used_after;
};

// What a rank has held and sent, for benchmarks and memory checks.
struct FSDPStats {
  size_t shard_bytes = 0;          // every unit's shard: the parameters at rest
  size_t gathered_bytes = 0;       // unit buffers allocated now
  size_t peak_gathered_bytes = 0;  // the most allocated at once since reset_peak_stats()
  size_t largest_unit_bytes = 0;   // one gathered unit, padding included
  size_t all_gather_bytes = 0;     // flat buffers filled by all_gather since reset
  size_t all_gathers = 0;
};

class FullyShardedDataParallel : public nn::Module {
 public:
  FullyShardedDataParallel(nn::ModulePtr module, std::shared_ptr<ProcessGroup> process_group,
                           FSDPOptions options = {});
  // The units given: together they must hold every parameter, each exactly once; their
  // order is the forward order (prefetching follows it, and the gradients are
  // reduce-scattered in the reverse).
  FullyShardedDataParallel(nn::ModulePtr module, std::shared_ptr<ProcessGroup> process_group,
                           std::vector<FSDPUnit> units, FSDPOptions options = {});
  ~FullyShardedDataParallel() override;

  Tensor forward(const Tensor& input) override;

  const nn::ModulePtr& module() const { return module_; }
  const std::shared_ptr<ProcessGroup>& process_group() const { return process_group_; }
  size_t num_units() const;
  // Unit u's FlatParameter (its layout, its shard).
  const FlatParameter& unit(size_t u) const;

  // The norm of the whole gradient, from the shards' (one all-reduce), clipped to max_norm
  // as nn::utils::clip_grad_norm_ would: parallel::clip_grad_norm_ (parallel/clip_grad.h)
  // over the process group. A collective. With other dimensions beside FSDP's (a
  // tensor-parallel module), call parallel::clip_grad_norm_(parameters(), mesh) instead.
  Tensor clip_grad_norm_(double max_norm, double norm_type = 2.0);

  // ---- checkpoints (collectives: every rank calls them) ----
  // The parameters (and buffers) under the wrapped module's names, on rank 0; an empty
  // dict on the other ranks.
  nn::TensorDict full_state_dict();
  // Every rank passes the same full state dict (e.g. read from one file); each keeps its
  // shards of it. Checked against the wrapped module first (names, shapes, dtypes).
  void load_full_state_dict(const nn::TensorDict& state, const std::string& source = "state dict");

  FSDPStats stats() const;
  void reset_peak_stats();
  ShardedReductionStats last_reduction_stats() const { return reducer_->last_stats(); }

  std::string extra_repr() const override;

 protected:
  nn::ModulePtr copy_node() const override;

 private:
  struct Units;  // the units and their gathering; autograd nodes and hooks hold it weakly
  void build(std::vector<FSDPUnit> specs);
  void register_unit_hooks(const nn::ModulePtr& module, size_t u);
  void register_use_after(const nn::ModulePtr& module, size_t u);

  nn::ModulePtr module_;
  std::shared_ptr<ProcessGroup> process_group_;
  std::shared_ptr<Units> units_;
  std::shared_ptr<ShardedGradReducer> reducer_;
};

// FSDP2's spelling: shards `module` over `process_group` (see above).
std::shared_ptr<FullyShardedDataParallel> fully_shard(nn::ModulePtr module,
                                                      std::shared_ptr<ProcessGroup> process_group,
                                                      FSDPOptions options = {});
// The same with the units given (an auto-wrap policy's choice).
std::shared_ptr<FullyShardedDataParallel> fully_shard(nn::ModulePtr module,
                                                      std::shared_ptr<ProcessGroup> process_group,
                                                      std::vector<FSDPUnit> units,
                                                      FSDPOptions options = {});

}  // namespace mg::parallel
