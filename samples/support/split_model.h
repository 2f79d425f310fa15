// train_gpt --model gpt|llama --dp D --tp T --pp P --cp C [--sequence-parallel] [--zero 1|2|3]:
// one rank's part of a model split over a DeviceMesh of D x P x C x T processes started by
// minigrad-run (docs/gpt-split-training.md). Nothing here names a module: the model comes
// with its models::SplitSpec (models/split_spec.h: its plans, FSDP units, pipeline cut,
// recompute, loss), and every model is split by the same code.
//
//   minigrad-run --nproc-per-node 4 build/bin/train_gpt --devices cpu --dp 2 --tp 2
//   minigrad-run --nproc-per-node 8 build/bin/train_gpt --model llama --devices cpu --dp 2 --tp 2 --pp 2
//
// Every rank builds the same model from the same seed and draws the same global windows of
// each step; the split decides which part of that work is its own:
//   cp, tp  spec.parallelize: the cp plan (ring attention, the chunks' positions), then the
//           tp plan (Megatron's column/row layers, the vocabulary-parallel embedding and
//           head; with --sequence-parallel the residual stream cut along T);
//   pp      parallel::MeshPipeline over spec.pipeline_cut: the stages of 1F1B or interleaved
//           1F1B, tied weights' copies summed by their placement;
//   dp      the rows of the global batch (the first B % dp ranks one more); --zero 1|2
//           shard AdamW's state (and, 2, the gradients) with ZeroRedundancyOptimizer, --zero
//           3 shards everything with spec.fully_shard (FSDP per block).
//
// The loss: each rank's share of the whole batch's mean -- its rows' mean (vocabulary- and
// context-parallel under parallel::LossParallel) times its rows / B -- whose sum over dp is
// the mean. The gradients after the step's micro-batches: reduce_partial_gradients (the
// placements say what is a share: SP's replicated weights over tp, everything over cp, the
// tied copies, and every parameter over dp when the ranks' shares are summed rather than
// averaged by ZeRO-2/FSDP). The clip: parallel::clip_grad_norm_ over the mesh. Checkpoints
// and the sample: parallel::full_state_dict and full_optimizer_state gather the single-device
// names from any split (and scatter them into any other), so a run saved under one split
// resumes under another.
#pragma once

#include <memory>
#include <string>
#include <utility>
#include <vector>

#include <minigrad/core/device.h>
#include <minigrad/core/generator.h>
#include <minigrad/core/tensor.h>
#include <minigrad/models/split_spec.h>
#include <minigrad/nn/optim/adam.h>
#include <minigrad/nn/optim/master_weights.h>
#include <minigrad/nn/optim/optimizer.h>
#include <minigrad/parallel/c10d/device_mesh.h>
#include <minigrad/parallel/c10d/process_group.h>
#include <minigrad/parallel/full_optimizer_state.h>
#include <minigrad/parallel/pipeline/mesh_pipeline.h>
#include <minigrad/parallel/sharded/fully_shard.h>
#include <minigrad/parallel/sharded/zero_redundancy_optimizer.h>

#include "distributed_run.h"

namespace mg::samples {

struct ModelSplit {
  int dp = 1, tp = 1, pp = 1, cp = 1;
  bool sequence_parallel = false;
  // --pp > 1: the pipeline's options (--schedule, --micro-batches, --model-chunks).
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

// What the flags ask, checked before any rank joins: dp * tp * pp * cp against the
// launcher's world size (1 without one), --sequence-parallel without tp, the batch over dp,
// the block over 2 * cp and (sequence parallel) its cp part over tp, dropout under cp, the
// --zero stages a split composes with. OptionError naming the numbers.
void check_split(const ModelSplit& split, int64_t batch_size, int64_t block_size, double dropout,
                 double weight_decay = 0.0);


class SplitModel {
 public:
  // `spec.model`: the whole model, built from the seed on this rank's device, the same on
  // every rank; split in place by its plans (cp, tp), sharded by its FSDP units (--zero 3,
  // with `fsdp`'s options: FSDP's MixedPrecisionPolicy), or copied into this rank's pipeline
  // stages (--pp; the model then keeps the single-device layout and names for checkpoints).
  SplitModel(models::SplitSpec spec, const ModelSplit& split, const DistributedRun& dist, uint64_t seed,
             parallel::FSDPOptions fsdp = {});

  // What this rank's optimizer steps: the model's parameters (its plan's shards), the
  // pipeline's stages', or FSDP's flat shards; named as the single-device model names them
  // (a flat shard as FSDP does; its pieces carry the names).
  std::vector<Tensor> parameters() const;
  std::vector<nn::NamedTensor> named_parameters() const;
  const parallel::DeviceMesh& mesh() const { return *mesh_; }
  const ModelSplit& split() const { return split_; }

  // The global batch x, y [B, T] (every rank the same) -> this rank's share of the batch's
  // mean loss (see above): differentiable; summed over dp it is the mean.
  Tensor loss_share(const Tensor& x, const Tensor& y);
  // After the step's backward passes: the partial gradients summed (placements), and
  // `step_loss` (the sum of this rank's shares) summed over dp, in place: the step's loss.
  void reduce_gradients(Tensor& step_loss);
  // The shares of several evaluation batches [n] summed over dp, in place.
  void sum_over_dp(Tensor& shares);

  // --pp: the pipeline runs forward and backward itself. pipeline_step: one micro-batch
  // of gradient accumulation, the global batch x, y [B, T]; its loss is the token losses'
  // sum / divide_by (B T times the accumulation's count), the whole batch's on every rank,
  // detached. eval_loss: the batch's mean loss (eval mode, gradients dropped).
  bool pipelined() const { return pipeline_ != nullptr; }
  // `loss_scale` (--precision 16-mixed's GradScaler) multiplies what backward starts from;
  // the loss returned is divided by it again (both exact: the scale is a power of 2).
  Tensor pipeline_step(const Tensor& x, const Tensor& y, double divide_by, double loss_scale = 1.0);
  double eval_loss(const Tensor& x, const Tensor& y);
  // eval() / train() on this rank's model (the pipeline's stages under --pp).
  void set_training(bool on);

  // --zero 2 and 3 reduce-scatter the gradients as averages over dp (the library's ZeRO and
  // FSDP follow DDP): each rank's loss share is multiplied by dp before backward.
  double backward_scale() const { return split_.zero >= 2 ? split_.dp : 1.0; }
  // --zero 1|2: the optimizer sharded over dp, two ZeroRedundancyOptimizers of AdamW over
  // this rank's parameters, one over the 2-D weights (decayed), one over the rest (a flat
  // shard mixes tensors, so one AdamW over it could not decay only the weights). Set by the
  // trainer; clip_grad_norm_ then clips their gradients.
  // `master_weights` (bf16-true): each ZeroRedundancyOptimizer's local optimizer is an
  // optim::MasterWeights over its bfloat16 shards, AdamW over their float32 masters: float32
  // master shards, the ZeRO paper's 2 + 2 + 12 bytes per parameter.
  std::vector<std::unique_ptr<optim::Optimizer>> make_zero_optimizers(const optim::AdamWOptions& options,
                                                                      bool master_weights = false);
  // clip_grad_norm_ of the whole model's gradient (each element once), the same on every rank:
  // of the tensors holding it after backward, or of `holders` (what the optimizers step:
  // MasterWeights' masters, ZeRO-1's shards once prepared), each with its placements.
  Tensor clip_grad_norm_(double max_norm);
  Tensor clip_grad_norm_(const std::vector<Tensor>& holders, double max_norm);
  // amp::GradScaler's agreement: the found-inf flag summed over every rank of the mesh (each
  // holds a part of the model), so that one rank's inf or NaN skips the step on all.
  void reduce_found_inf(Tensor& found_inf) const;
  // optim::MasterWeights over this rank's parameters: each master takes the placements (and
  // single-device name) of the parameter it stands for, so that the clip and the full
  // optimizer state read the masters as they read the parameters.
  void place_masters(const optim::MasterWeights& masters) const;

  // ---- the single-device layout: checkpoints and the sample ----
  // Collectives: the whole model's state dict under the single-device names (the model's
  // own state_dict(): spec.state_dict_of adds the GPT's tied lm_head.weight), and the
  // state of `optimizers` (the trainer's AdamW over this rank's parameters, or the --zero
  // pair) as the single-device AdamW's state_dict() -- the same file under every split.
  nn::TensorDict model_state_dict();
  optim::TensorDict optimizer_state_dict(const std::vector<optim::Optimizer*>& optimizers);
  // Not collectives: every rank takes its part of a whole (checked) state dict and of the
  // single-device AdamW's state.
  void load_model_state_dict(const nn::TensorDict& state, const std::string& source);
  void load_optimizer_state_dict(const std::vector<optim::Optimizer*>& optimizers, const optim::TensorDict& state,
                                 const std::string& source);
  // Dropout's generator differs per dp rank (other rows, other masks), so a checkpoint keeps
  // each one's. A collective: every dp rank's state, in dp order. Not one: this rank takes
  // its own from them; saved under another dp size (or on one device), a rank beyond them
  // takes rank 0's offset on its own seed -- masks of its own, not a copy of rank 0's.
  std::vector<Generator::State> dp_generator_states() const;
  void set_dp_generator_state(const std::vector<Generator::State>& states) const;

 private:
  // The tensors holding this rank's gradients after backward: ZeRO-2's shards, or the
  // parameters.
  std::vector<Tensor> gradient_holders() const;
  // The single-device AdamW's parameters in its order (nanoGPT's two groups), by name.
  std::vector<std::string> whole_optimizer_names() const;

  models::SplitSpec spec_;
  ModelSplit split_;
  uint64_t seed_;
  std::unique_ptr<parallel::DeviceMesh> mesh_;
  std::unique_ptr<parallel::MeshPipeline> pipeline_;    // --pp > 1
  std::shared_ptr<parallel::FSDPModule> fsdp_;           // --zero 3
  std::vector<parallel::ZeroRedundancyOptimizer*> zero_;  // --zero 1|2, owned by the trainer
};

}  // namespace mg::samples
