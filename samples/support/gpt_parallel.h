// train_gpt --dp D --tp T --cp C [--sequence-parallel]: one rank's part of the GPT split over
// a DeviceMesh of D x C x T processes started by minigrad-run (docs/gpt-split-training.md).
//
//   minigrad-run --nproc-per-node 4 build/bin/train_gpt --devices cpu --dp 2 --tp 2
//
// Every rank builds the same GPT from the same seed and draws the same global windows of
// each step; the split decides which part of that work is its own:
//   dp  the rows of the global batch (--batch-size windows cut over dp; the first B % dp
//       ranks take one row more), so a step is the single-device step on the same windows;
//   tp  the shards of every layer (models::parallelize_gpt, Megatron's split; with
//       --sequence-parallel the activations between the layers split along T too);
//   cp  two chunks of every window's positions (ring attention; every rank holds the whole
//       model, the position embedding taken at its global positions).
// tp and cp compose: the tensor-parallel GPT takes the cp group from the mesh (ring
// attention on its heads, models/gpt_tensor_parallel.h); cp alone runs on the whole GPT
// with ring attention as its attention function (models/gpt_context_parallel.h).
//
// The loss. Each rank's loss is its share of the whole batch's mean: its tokens' summed
// losses / the global batch's B * T tokens (vocab-parallel cross-entropy with divide_by
// under tp; the cp group's mean scaled by the dp rank's rows / B under cp, and likewise
// the plain GPT::loss under dp alone). The shares add up over dp to the mean, and so do
// their gradients.
//
// The gradients: after the step's micro-batches (gradient accumulation included),
//   tp  finish_gradients(): with sequence parallelism, the replicated parameters' sums over tp;
//   cp  the sum over the cp group (each rank's positions' share; under tp inside
//       finish_gradients);
//   dp  the sum over the dp group: one all-reduce, with the step's loss riding along.
// A plain all-reduce rather than DistributedDataParallel: DDP averages (it would need
// divide_by / dp, and no_sync() for gradient accumulation), while the sum of the shares is
// the mean as it stands, the same kind of reduction as cp's; one all-reduce per step after
// accumulation is what DDP's no_sync would give, and on the CPU there is no overlap with
// backward to lose. The ranks start equal because they build the model from one seed.
//
// Clipping under tp counts every element once: the sharded gradients' squared norms
// summed over tp, plus the replicated ones (the same on every tp rank) once.
//
// --pp P > 1: the 4-D pipeline (models/gpt_mesh_pipeline.h) on a dp x pp x cp x tp mesh.
// It runs its own forward and backward (pipeline_step: the micro-batches of the 1F1B or
// interleaved schedule), its loss already the whole batch's on every rank; its gradients
// finished once per step (finish_gradients: sp, cp, the tied sum, dp), clipped by
// models::clip_mesh_grad_norm_. Evaluation goes through the pipeline too: a step in eval
// mode whose gradients are thrown away (the pipeline has no forward-only schedule).
//
// --zero over dp: 1 and 2 shard AdamW's state (and, 2, the gradients, reduce-scattered in
// backward) with parallel::ZeroRedundancyOptimizer, 1 over any split (each rank's own
// parameters: tp shards, pipeline chunks), 2 and 3 with --dp alone; 3 wraps the GPT in FSDP by
// block (models::fully_shard_gpt: fully_shard on each block, then on the GPT). The library's ZeRO 2/3 average the gradients over dp,
// so the loss shares are scaled by dp before backward (backward_scale). Under 3 AdamW steps
// FSDP's flat shards, which mix the 2-D weights with biases and LayerNorms: weight decay
// only on the weights cannot be had, so --zero 3 needs --weight-decay 0.
//
// Checkpoints and the sample (gpt_parallel_checkpoint.cpp): under every split the whole
// model in nanoGPT's names and the single-device AdamW's state, gathered from the tp
// shards, the pp stages, the ZeRO and FSDP shards, and scattered back on resume.
#pragma once

#include <memory>
#include <string>
#include <utility>
#include <vector>

#include <minigrad/core/device.h>
#include <minigrad/core/tensor.h>
#include <minigrad/models/gpt.h>
#include <minigrad/models/gpt_mesh_pipeline.h>
#include <minigrad/models/gpt_tensor_parallel.h>
#include <minigrad/nn/optim/adam.h>
#include <minigrad/nn/optim/optimizer.h>
#include <minigrad/parallel/c10d/device_mesh.h>
#include <minigrad/parallel/c10d/process_group.h>
#include <minigrad/parallel/sharded/fully_shard.h>
#include <minigrad/parallel/sharded/zero_redundancy_optimizer.h>

#include "distributed_run.h"

namespace mg::samples {

struct GPTSplit {
  int dp = 1, tp = 1, pp = 1, cp = 1;
  bool sequence_parallel = false;
  // --pp > 1: the 4-D pipeline's options (--schedule, --micro-batches, --model-chunks).
  bool interleaved = false;
  int64_t micro_batches = 0;  // 0: pp
  int model_chunks = 1;
  // --zero 1|2|3 over dp (0: none) and --recompute (block checkpointing).
  int zero = 0;
  bool recompute = false;
  int ranks() const { return dp * tp * pp * cp; }
  // "dp 2 x tp 2 x cp 1, sequence parallel"
  std::string str() const;
};

// What the flags ask, checked before any rank joins: dp * tp * cp against the launcher's
// world size (1 without one), --sequence-parallel without tp, the batch over dp,
// the block over 2 * cp and (sequence parallel) its cp part over tp, dropout under cp. OptionError
// naming the numbers.
void check_split(const GPTSplit& split, int64_t batch_size, int64_t block_size, double dropout,
                 double weight_decay = 0.0);

// Joins the job (Gloo on the CPU, NCCL on GPUs; this rank's device: `devices` at
// LOCAL_RANK, which becomes the list's only entry).
DistributedRun join_split_run(double timeout_seconds, std::vector<Device>& devices);

class SplitGPT {
 public:
  // `gpt`: the whole model, built from the seed on this rank's device, the same on every
  // rank. Makes the mesh (dp, cp, tp) over dist.group and this rank's model: `gpt` itself
  // (dp, cp: ring attention set on its blocks) or its tp shards.
  SplitGPT(std::shared_ptr<models::GPT> gpt, const GPTSplit& split, const DistributedRun& dist,
           uint64_t seed);

  // The parameters this rank trains, in the order of trained().named_parameters().
  std::vector<Tensor> parameters() const;
  nn::Module& trained() const;
  const parallel::DeviceMesh& mesh() const { return *mesh_; }
  const GPTSplit& split() const { return split_; }

  // The global batch x, y [B, T] (every rank the same) -> this rank's share of the batch's
  // mean loss (see above): differentiable; summed over dp it is the mean.
  Tensor loss_share(const Tensor& x, const Tensor& y);
  // After the step's backward passes: the gradients reduced as above, and `step_loss`
  // (the sum of this rank's shares) summed over dp, in place: the step's loss.
  void reduce_gradients(Tensor& step_loss);
  // The shares of several evaluation batches [n] summed over dp, in place.
  void sum_over_dp(Tensor& shares);

  // --pp: the pipeline runs forward and backward itself. pipeline_step: one micro-batch
  // of gradient accumulation, the global batch x, y [B, T]; its loss is the token losses'
  // sum / divide_by (B T times the accumulation's count), the whole batch's on every rank,
  // detached. eval_loss: the batch's mean loss (eval mode, gradients dropped).
  bool pipelined() const { return pipeline_ != nullptr; }
  Tensor pipeline_step(const Tensor& x, const Tensor& y, double divide_by);
  double eval_loss(const Tensor& x, const Tensor& y);
  // eval() / train() on this rank's model (the pipeline's chunks under --pp).
  void set_training(bool on);

  // --zero 2 and 3 reduce-scatter the gradients as averages over dp (the library's ZeRO and
  // FSDP follow DDP): each rank's loss share is multiplied by dp before backward.
  double backward_scale() const { return split_.zero >= 2 ? split_.dp : 1.0; }
  // --zero 1|2: the optimizer sharded over dp, two ZeroRedundancyOptimizers of AdamW over
  // the GPT's parameters, one over the 2-D weights (decayed), one over the rest (a flat
  // shard mixes tensors, so one AdamW over it could not decay only the weights).
  // Set by the trainer; clip_grad_norm_ and step() then work on them.
  std::vector<std::unique_ptr<optim::Optimizer>> make_zero_optimizers(const optim::AdamWOptions& options);
  // The GPT to sample from after finish_for_sampling (on rank 0; under --zero 3 a fresh
  // GPT with the gathered weights).
  std::shared_ptr<models::GPT> whole_model() const { return gpt_; }
  // clip_grad_norm_ of the whole model's gradient (each element once), the same on every rank.
  Tensor clip_grad_norm_(double max_norm);

  // ---- the single-device layout (support/gpt_parallel_checkpoint.cpp) ----
  // Checkpoints and the sample hold the whole model in nanoGPT's names and the state of
  // an AdamW `whole` over gpt's parameters, grouped as the single-device run's; a split
  // that shards the model or AdamW's state (tp, pp, --zero) gathers them first, and a
  // resume scatters them back, so a run saved under one split resumes under another.
  bool shards_state() const { return split_.tp > 1 || split_.pp > 1 || split_.zero > 0; }
  // Every rank: the whole model gathered; returns the GPT that holds it on rank 0 (`gpt`
  // itself, its shards all-gathered over tp and broadcast over pp; under --zero 3 a GPT
  // of its own, null on the other ranks).
  std::shared_ptr<models::GPT> gather_whole_model();
  // gather_whole_model, and the attention back to the single-device one (cp): for a sample.
  void finish_for_sampling();
  // Every rank: the state of `optimizers` (the trainer's: AdamW over this rank's part, or
  // the two ZeroRedundancyOptimizers of --zero 1|2) gathered into `whole`, on rank 0 at
  // least. scatter_whole_state: after a resume checked `model` (a whole state dict) and
  // loaded `whole`, sets this rank's part of the parameters and of their state from them.
  void gather_optimizer(const std::vector<optim::Optimizer*>& optimizers, optim::Optimizer& whole);
  void scatter_whole_state(const nn::TensorDict& model, const optim::Optimizer& whole,
                           const std::vector<optim::Optimizer*>& optimizers);

 private:
  // The whole tensor of parameter `name` (or a tensor of its shape) from this rank's part
  // (all-gathered over tp with the indices each rank holds); the part itself when replicated.
  Tensor gather(const std::string& name, const Tensor& part);
  // --pp: the same, then broadcast over pp from the stage that holds `name` (`part` is
  // read there only; `like`: a tensor of the part's dtype, for the other stages' buffers).
  Tensor gather_over_pipeline(const std::string& name, const Tensor& part, const Tensor& like);
  // The pp rank whose stage holds the single-device parameter `name` (the tied head's
  // copy aside: wte is the first stage's).
  int pipeline_owner(const std::string& name) const;
  // This rank's parameters by name (the tp shards or the pipeline's chunks), and the part of
  // the single-device tensor `full` of parameter `name` this rank holds under that name.
  std::vector<nn::NamedTensor> named_parts() const;
  Tensor shard_of(const std::string& name, const Tensor& full) const;
  // The name of this rank's parameter `p` and the index of gpt's parameter `name` (or
  // tensor `p`) among `whole`'s parameters.
  std::string name_of(const Tensor& p) const;
  size_t whole_index(const optim::Optimizer& whole, const std::string& name) const;
  size_t whole_index(const optim::Optimizer& whole, const Tensor& p) const;

  std::shared_ptr<models::GPT> gpt_;
  GPTSplit split_;
  std::unique_ptr<parallel::DeviceMesh> mesh_;
  std::shared_ptr<models::TensorParallelGPT> tp_model_;  // null without tp (or with pp)
  std::shared_ptr<models::GPTMeshPipeline> pipeline_;     // --pp > 1
  std::shared_ptr<parallel::FSDPModule> fsdp_;  // --zero 3: the GPT's
  std::vector<parallel::ZeroRedundancyOptimizer*> zero_;       // --zero 1|2, owned by the trainer
  std::shared_ptr<models::GPT> gathered_;  // --zero 3, rank 0: FSDP's parameters gathered
};

}  // namespace mg::samples
