// fully_shard: FSDP per module, as torch.distributed.fsdp.fully_shard (FSDP2). Parameters,
// gradients and optimizer state are split over the data-parallel ranks: at rest each rank
// holds 1/N of each.
//
//   for (auto& block : blocks) parallel::fully_shard(block, dp_group);   // each block,
//   auto fsdp = parallel::fully_shard(model, dp_group);                 // then the root
//   optim::AdamW opt(fsdp->parameters(), ...);  // this rank's shards of every unit
//   loss_fn((*model)(x), y).backward();         // call the model, not model->forward:
//   opt.step();                                 //   the root's hooks begin the step
//
// Each call makes one unit of its module: the module's parameters, minus those of modules
// sharded by earlier calls (its blocks), become one FlatParameter (flat_parameter.h) over the
// group, ShardStorage::Separate: this rank keeps its shard; the module's own parameter tensors
// become views of a flat buffer whose memory exists only while the unit is gathered. The
// module itself is unchanged and is called as before; hooks on it (nn/module.h) do the work:
//
//   forward pre-hook    all_gather the unit into its flat buffer (and start gathering the
//                       next unit in module order: forward_prefetch)
//   forward hook        free the buffer (Storage::resize_(0), the block kept) unless
//                       reshard_after_forward is false or the module is the root; put an
//                       UnshardBeforeBackward node on the output
//   that node           runs in backward as soon as the output's gradient is in, before any
//                       of the unit's own nodes: gathers the unit again into the same storage
//                       block -- the views autograd saved in forward read valid memory again --
//                       and starts gathering the unit before it (backward_prefetch)
//   gradients           once every gradient of the unit is in, its flat gradient is
//                       reduce-scattered (averaged) and the unit freed (ShardedGradReducer)
//
// The root -- the module of the last call, holding every earlier one -- is where a step begins
// and ends: its pre-hook frees whatever a step that never reached backward left gathered and
// reports a failed collective or a half-done backward; its own parameters stay gathered from
// its forward to the end of backward (FSDP2's rule for the root: backward would gather them
// at once). A rank holds, besides its shards, the root's unit and the gathered parameters of
// at most two more (the one computing, the one prefetched).
//
// The call order is FSDP2's: children first, then their parent. A parameter held by two
// modules (a tied embedding and head) belongs to the unit of their nearest common ancestor:
// leave both unsharded and it lands in that ancestor's unit (the GPT's wte and lm_head: the
// root's). Misuse is an mg::Error naming the modules: a module sharded twice, a parent sharded
// before its children, a tied parameter in the unit of one holder while another holder lies
// outside it, a parameter on another device than the group's, one that does not require grad.
//
// The units of one root are gathered in module order (named_modules: the root's own, then
// its submodules' depth first, which is a transformer's forward order) and their gradients
// reduce-scattered in the reverse: every rank issues the same collectives in the same order.
// With activation checkpointing (nn/checkpoint.h) on a unit's module, its first forward runs
// without a graph; the pre-hook gathers it again for the recompute in backward.
//
// Placements (parallel/placement.h): each unit's shard records the pieces of the
// single-device parameters it holds -- the name and shape, the placements the parameter
// already had (a tensor-parallel plan's Shard or Replicate on tp, with a Partial gradient
// under sequence parallelism), and a flat range over "dp" -- so the functions that read
// placements read FSDP's shards as any other split. FSDP composes with tensor parallelism on
// a dp x tp mesh (torchtitan's default): shard the plan's tp-local parameters over dp. The
// reduce-scatter is over dp alone; a Partial gradient's sum over tp commutes with it (the
// tp ranks of a dp group lay their equal shards out alike), so reduce_partial_gradients on
// the shards after backward sums the pieces, 1/dp of the bytes a sum before would move.
//
// Checkpoints: full_state_dict() gathers the unsharded parameters on rank 0 under the
// module's names (loadable into the plain module); optimizer state by gather_full_optimizer_state
// (sharded_state.h) with the units. The FSDP1-style wrapper FullyShardedDataParallel
// (fully_sharded_data_parallel.h) is built on these calls.
#pragma once

#include <cstddef>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <minigrad/nn/module.h>
#include <minigrad/nn/serialize.h>
#include <minigrad/parallel/c10d/device_mesh.h>
#include <minigrad/parallel/c10d/process_group.h>
#include <minigrad/parallel/sharded/flat_parameter.h>
#include <minigrad/parallel/sharded/sharded_grad_reducer.h>

namespace mg::parallel {

// FSDP2's MixedPrecisionPolicy (torchtitan's: param_dtype bfloat16, reduce_dtype float32):
// the shards stay in the parameters' dtype -- float32, the masters AdamW steps, with float32
// moments -- while the unit is all-gathered in param_dtype (the shard rounded: half the
// bytes, and the dtype forward and backward compute in) and its gradients are
// reduce-scattered in reduce_dtype (default: param_dtype) into the float32 shard's gradient.
// cast_forward_inputs casts a float input of the module to param_dtype (so that a float32
// batch meets bfloat16 weights); output_dtype casts its output (the root's logits to float32
// for the loss). None given: everything in the parameters' dtype, as before.
struct MixedPrecisionPolicy {
  std::optional<DType> param_dtype;
  std::optional<DType> reduce_dtype;
  std::optional<DType> output_dtype;
  bool cast_forward_inputs = true;
};

struct FSDPOptions {
  // FSDP2's reshard_after_forward: free the unit when its forward ends and gather it again
  // for backward. false keeps it gathered until its gradients are reduce-scattered (one
  // all-gather less, for the memory of the unit through the rest of forward): torchtitan's
  // choice for the last block, whose backward comes first. The root's always stay.
  bool reshard_after_forward = true;
  // In forward, start gathering the next unit while this one computes; in backward, the
  // unit before it (FSDP's BackwardPrefetch.BACKWARD_PRE): communication overlaps compute,
  // for the memory of one more gathered unit.
  bool forward_prefetch = true;
  bool backward_prefetch = true;
  // The dtypes of the unit (fully_shard per call, as FSDP2's mp_policy).
  MixedPrecisionPolicy mp_policy;
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

// What fully_shard returns: the sharded module's FSDP state (torch's FSDPModule methods;
// torch returns the module itself, whose class it changes). The module keeps it alive
// through its hooks; the handle may be dropped (fully_shard on each block, keep the root's).
class FSDPModule : public std::enable_shared_from_this<FSDPModule> {
 public:
  struct Unit;
  struct Tree;
  FSDPModule(const nn::ModulePtr& module, std::shared_ptr<ProcessGroup> group);  // fully_shard's
  FSDPModule(const FSDPModule&) = delete;
  FSDPModule& operator=(const FSDPModule&) = delete;

  // The module (mg::Error once it is gone).
  nn::ModulePtr module() const;
  const std::shared_ptr<ProcessGroup>& process_group() const { return group_; }
  // Whether no later fully_shard call has taken this module into its parent's.
  bool is_root() const { return root_; }

  // The units of this module: its own (when it has parameters of its own), then those of
  // the modules sharded inside it, in module order; unit_module(u) names u's module under
  // this one ("" for its own, "transformer.h.0").
  size_t num_units() const;
  const FlatParameter& unit(size_t u) const;
  std::string unit_module(size_t u) const;
  // This rank's shards of those units, in that order: what the optimizer steps. Their
  // .grad after backward is this rank's shard of the averaged gradient.
  std::vector<Tensor> parameters() const;

  // The norm of the whole gradient from the shards' (one all-reduce over the group),
  // clipped to max_norm as nn::utils::clip_grad_norm_ would (parallel/clip_grad.h). A
  // collective. Refused for parameters placed on another dimension too (FSDP x TP): their
  // norm needs the other dimension's sum as well, which a clip over the mesh reads from the
  // shards' placements.
  Tensor clip_grad_norm_(double max_norm, double norm_type = 2.0);

  // ---- checkpoints (collectives: every rank calls them) ----
  // The parameters (and buffers) under the module's names, on rank 0; an empty dict on the
  // other ranks. Under FSDP x TP these are the tp ranks' own parts.
  nn::TensorDict full_state_dict();
  // Every rank passes the same full state dict; each keeps its shards of it. Checked
  // against the module first (names, shapes, dtypes).
  void load_full_state_dict(const nn::TensorDict& state, const std::string& source = "state dict");

  // Of the root's whole tree (this module's root, once a parent is sharded).
  FSDPStats stats() const;
  void reset_peak_stats();
  ShardedReductionStats last_reduction_stats() const;

 private:
  friend std::shared_ptr<FSDPModule> fully_shard(nn::ModulePtr module, std::shared_ptr<ProcessGroup> group,
                                                 FSDPOptions options);
  void register_hooks();
  // The hooks' work (fully_shard.cpp): the pre-hook, the forward hook, and the node on the
  // output that begins this module's backward.
  void before_forward();
  Tensor after_forward(const Tensor& output);
  void before_backward();
  // The states of all modules sharded (torch keeps them on the modules): this module's, or
  // the one whose own unit holds `p` (null when none).
  static std::shared_ptr<FSDPModule> state_of(const nn::Module* module);
  static std::shared_ptr<FSDPModule> holder_of(const Tensor& p);
  static void remember(const nn::Module* module, const std::shared_ptr<FSDPModule>& state);

  std::weak_ptr<nn::Module> module_;
  std::string type_;  // the module's type, for messages
  std::shared_ptr<ProcessGroup> group_;
  FSDPOptions options_;
  std::shared_ptr<Unit> own_;                 // null: no parameters of its own
  std::vector<std::shared_ptr<Unit>> units_;  // own first, then the sharded submodules'
  std::shared_ptr<Tree> tree_;                // the root's, shared by every module under it
  std::string name_;                          // this module under the tree's root ("": the root)
  bool root_ = true;
};

// Shards `module` over `group` (see above) and returns its state. mg::Error for misuse.
std::shared_ptr<FSDPModule> fully_shard(nn::ModulePtr module, std::shared_ptr<ProcessGroup> group,
                                        FSDPOptions options = {});
// The same over the mesh's "dp" dimension (its other dimensions are a plan's: tp).
std::shared_ptr<FSDPModule> fully_shard(nn::ModulePtr module, const DeviceMesh& mesh, FSDPOptions options = {});

// The usual units of a model made of a stack of blocks (torchtitan's apply_fsdp): fully_shard
// on each block, then on the root, whose unit holds the rest. The last block stays gathered
// from its forward to its backward, which comes first (reshard_after_forward false for it);
// options.mp_policy's output_dtype is the root's alone (the blocks pass param_dtype on).
// Returns the root's state: parameters() for the optimizer.
std::shared_ptr<FSDPModule> fully_shard_blocks(const nn::ModulePtr& root, const std::vector<nn::ModulePtr>& blocks,
                                               std::shared_ptr<ProcessGroup> group, FSDPOptions options = {});

}  // namespace mg::parallel
