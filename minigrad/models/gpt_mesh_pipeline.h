// The GPT on all four dimensions of a DeviceMesh (dp x pp x cp x tp): a pipeline (the
// blocks cut as gpt_plan.h's gpt_pipeline_cut cuts them, PipelineStage's schedules) whose
// stages are tensor-parallel, context-parallel pieces of the GPT (gpt_tensor_parallel.h),
// the whole replicated over dp. (To become the GPT's plan on the tp and cp groups, then
// parallel::split_module over pp.)
// docs/gpt-pipeline.md, "The GPT in four dimensions", walks through one step.
//
// Rank (dp d, pp s, cp c, tp t) holds pp stage s (its blocks, as gpt_pipeline_cut deals them),
// every block split over its tp group as TensorParallelGPT splits it:
//   s = 0      the vocabulary-parallel embedding (wte rows t V/tp ..), wpe whole
//   s = p-1    ln_f and the vocabulary-parallel head: "lm_head.weight", a copy of the same
//              wte rows, equal at the start and kept equal by summing its gradient with
//              stage 0's over the embedding group {0, p-1} of this rank's pp group (the
//              ranks of the same d, c, t)
// and runs them on dp rank d's rows of the batch, cp rank c's two chunks of each sequence.
// Between stages travel [mb, T/cp, C] activations ([mb, T/(cp tp), C] with sequence
// parallelism), forward and back; float64 as int64 bits (pipeline_stage.h).
//
// With tp 1 and cp 1 (pp, dp x pp) the model is the GPT cut by module name: the generic
// parallel::MeshPipeline over gpt_pipeline_cut (split_module's stages, the tie and dp sums
// by placement); the rest of this file is then the loss and the bookkeeping.
//
// The loss: the last stage's vocabulary-parallel cross entropy of each micro-batch, its
// tokens' summed loss over the whole batch's count of targets (every dp rank, every cp
// chunk), summed over cp; the micro-batches' parts add up (no weighting by rows). After
// backward train_step finishes the gradients, every sum in this order: sequence
// parallelism's replicated parameters over tp, every gradient over cp, the tied weight's
// over the embedding group, every gradient over dp (a plain all-reduce: the loss already
// divides by the whole batch's count). The loss is then broadcast over pp and summed over
// dp, so every rank returns the whole batch's mean.
//
// A trainer's step on rank `world->rank()`:
//   parallel::DeviceMesh mesh(world, {{"dp", 2}, {"pp", 2}, {"cp", 1}, {"tp", 2}});
//   manual_seed(1337); models::GPT gpt(config);              // the same GPT on every rank
//   models::GPTMeshPipelineOptions options;                  // micro-batches, schedule, SP
//   auto model = models::pipeline_gpt_on_mesh(gpt, mesh, options);  // gpt may be freed now
//   optim::AdamW opt(optim::weight_decay_groups(model->parameters(), adamw_options));
//   model->zero_grad();
//   Tensor loss = model->train_step(model->local_batch(x), model->local_batch(y));
//   opt.step();                                              // loss: the batch's mean, every rank
#pragma once

#include <memory>
#include <string>
#include <vector>

#include <minigrad/models/gpt.h>
#include <minigrad/models/gpt_tensor_parallel.h>
#include <minigrad/parallel/c10d/device_mesh.h>
#include <minigrad/parallel/pipeline/mesh_pipeline.h>
#include <minigrad/parallel/pipeline/pipeline_stage.h>

namespace mg::models {

// One model chunk of the 4-D pipeline: blocks [first_block, first_block + blocks) of the
// GPT split over `group` (and cp), the embedding in front when `embedding`, ln_f and the
// vocabulary-parallel head behind when `head`. forward: token ids [B, T/cp] int64
// (embedding) or activations [B, T', C] -> activations [B, T', C] or, with the head, this
// tp rank's logits [B, T/cp, V/tp].
class TensorParallelGPTStage : public nn::Cloneable<TensorParallelGPTStage> {
 public:
  TensorParallelGPTStage(const GPT& gpt, parallel::TensorParallelGroupPtr group,
                         const TensorParallelGPTOptions& options,
                         std::shared_ptr<Generator> sharded_generator,
                         std::shared_ptr<parallel::ProcessGroup> cp, int64_t first_block,
                         int64_t blocks, bool embedding, bool head);
  Tensor forward(const Tensor& x) override;

  bool has_embedding() const { return embedding_; }
  bool has_head() const { return head_; }
  // This chunk's copy of the tied shard: transformer.wte.weight or lm_head.weight.
  Tensor& tied_weight();

 private:
  parallel::TensorParallelGroupPtr group_;
  bool sequence_parallel_, embedding_, head_;
};

// The pipeline's part of the options.
struct GPTPipelineOptions {
  int64_t micro_batches = 1;  // PipelineStageOptions::chunks; every rank the same
  parallel::Schedule schedule = parallel::Schedule::OneFOneB;
  int model_chunks = 1;  // per rank; more than one needs Schedule::Interleaved1F1B
  parallel::Checkpoint checkpoint = parallel::Checkpoint::Never;
};

struct GPTMeshPipelineOptions {
  GPTPipelineOptions pipeline;
  // sequence_parallel, seed (gpt_tensor_parallel.h)
  TensorParallelGPTOptions tensor_parallel;
  // train_step ends with finish_gradients(). Gradient accumulation over several
  // train_steps turns this off and calls finish_gradients() once before the optimizer
  // step (summing after every step would add the earlier steps' sums again).
  bool finish_gradients = true;
};

class GPTMeshPipeline {
 public:
  // Every rank of the mesh calls it with the same GPT (config, seed) and options. The mesh
  // needs a pp and a tp dimension (either may be of size 1; dp and cp may be absent). mg::Error where the GPT
  // does not split: fewer blocks than pp x model chunks, n_head, vocab_size or 4 n_embd
  // not divisible by tp, dropout under cp (ring attention has none). `gpt` is left as it
  // is; this rank copies its shards.
  GPTMeshPipeline(const GPT& gpt, const parallel::DeviceMesh& mesh,
                  GPTMeshPipelineOptions options = {});

  // This rank's part of a batch x [B, T, ...] of the whole job: dp rank d's rows (the
  // first B mod dp dp ranks one more) and, under cp, its two chunks of each sequence.
  Tensor local_batch(const Tensor& x) const;

  // One step: idx and targets [B_d, T/cp] int64, this rank's local_batch of the batch
  // (read on the first and the last pp stage; elsewhere they may be undefined). Gradients
  // accumulate into this rank's parameters, finished as the header says. `divide_by`: the
  // whole batch's count of targets that are not -1; 0 counts them (on the last stage, an
  // all-reduce over cp and dp). Returns the batch's loss (sum of the token losses /
  // divide_by) on every rank, a scalar of the parameters' dtype.
  Tensor train_step(const Tensor& idx, const Tensor& targets, double divide_by = 0);

  // The sums after backward, in the header's order (train_step calls it unless
  // options.finish_gradients is off).
  void finish_gradients();

  // This rank's parameters, nanoGPT's names (the last stage's head copy "lm_head.weight").
  std::vector<nn::NamedTensor> named_parameters() const;
  std::vector<Tensor> parameters() const;
  void zero_grad(bool set_to_none = true);
  // The part of the single-device GPT's tensor `full` named `name` this rank holds.
  Tensor shard_of(const std::string& name, const Tensor& full) const;

  const std::vector<nn::ModulePtr>& chunks() const { return chunks_; }
  parallel::PipelineStage& stage() { return cut_ ? cut_->stage() : *stage_; }
  const parallel::TensorParallelGroupPtr& tp_group() const { return tp_; }
  // {first, last} stage of this rank's pp group; null on the middle stages and with pp 1.
  const std::shared_ptr<parallel::ProcessGroup>& embedding_group() const { return embedding_group_; }

 private:
  void sum_tied_gradient();

  GPTConfig config_;
  GPTMeshPipelineOptions options_;
  int dp_size_ = 1, dp_rank_ = 0;
  std::shared_ptr<parallel::ProcessGroup> pp_, dp_, cp_, embedding_group_;
  parallel::TensorParallelGroupPtr tp_;
  std::vector<nn::ModulePtr> chunks_;
  std::unique_ptr<parallel::PipelineStage> stage_;
  std::unique_ptr<parallel::MeshPipeline> cut_;  // tp 1, cp 1: the generic pipeline
};

// The trainer's entry: this rank's part of `gpt` on the mesh (GPTMeshPipeline's constructor).
std::shared_ptr<GPTMeshPipeline> pipeline_gpt_on_mesh(const GPT& gpt,
                                                      const parallel::DeviceMesh& mesh,
                                                      GPTMeshPipelineOptions options = {});

}  // namespace mg::models
