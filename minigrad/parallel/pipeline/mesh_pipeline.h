// A model cut by module name (split_module.h) over the pp dimension of a DeviceMesh and
// replicated over its dp dimension: one rank's part of a dp x pp job, the pipeline half of
// torchtitan's pipeline_llm with plain data parallelism around it.
//
//   parallel::DeviceMesh mesh(world, {{"dp", 2}, {"pp", 2}});   // 4 ranks
//   manual_seed(1337);
//   MyModel model(...);                                          // the same on every rank
//   parallel::MeshPipeline pipe(model, mesh, cut, options);     // this rank's stages, copied
//   optim::AdamW opt(pipe.parameters(), ...);
//   pipe.zero_grad();
//   Tensor loss = pipe.train_step(pipe.local_batch(x), pipe.local_batch(y), loss_fn);
//   opt.step();                                                  // loss: the batch's, every rank
//
// The batch [B, ...] of the whole job is cut over dp by rows (local_batch: the first B mod
// dp ranks one more), each dp rank's rows into micro-batches over pp. `loss_fn(output,
// target)` gives a micro-batch's share of the whole batch's loss -- e.g. its tokens' summed
// loss over the whole batch's count of tokens -- so that the shares of every micro-batch and
// every dp rank add up to the batch's loss, however unevenly the rows fall
// (PipelineStageOptions::weight_by_rows off). train_step returns that sum on every rank:
// the last stage's broadcast over pp, summed over dp.
//
// Each parameter records its dp placement after the cut's: Replicate, gradient Partial (each
// dp rank's backward gives the gradient of its rows' shares). After the last backward of a
// step, finish_gradients -- train_step calls it unless options.finish_gradients is off, for
// gradient accumulation over several train_steps -- is reduce_partial_gradients
// (parallel/partial_gradients.h): the tied copies' gradients summed over their tie groups,
// then every gradient over dp (a plain sum: the shares already divide by the whole batch).
// What else reads placements (a clip, a full state dict) finds every copy and replica.
//
// The mesh's other dimensions (cp, tp) are a plan's (parallelize_module), applied to the model
// before the cut: every parameter must carry their placements (an mg::Error names one that
// does not), the stages keep the plan's swapped layers and hooks, and their sums (sequence
// parallelism's, cp's) are among the placements' generic ones. Under cp, local_batch also
// cuts every row into this rank's two chunks of its sequence, and the loss is the caller's
// over the whole sequences (parallel::LossParallel).
#pragma once

#include <memory>
#include <vector>

#include <minigrad/nn/module.h>
#include <minigrad/parallel/c10d/device_mesh.h>
#include <minigrad/parallel/pipeline/pipeline_stage.h>
#include <minigrad/parallel/pipeline/split_module.h>

namespace mg::parallel {

struct MeshPipelineOptions {
  int64_t micro_batches = 1;  // per dp rank's rows; every rank the same
  Schedule schedule = Schedule::OneFOneB;  // Interleaved1F1B when the cut gives v > 1 stages per rank
  Checkpoint checkpoint = Checkpoint::Never;
  bool finish_gradients = true;  // train_step ends with finish_gradients()
};

class MeshPipeline {
 public:
  // Every rank of the mesh calls it with the same model and cut (a collective call: the
  // tie groups are made from each pp group). The model is left as it is.
  MeshPipeline(const nn::Module& model, const DeviceMesh& mesh, const PipelineCut& cut,
               MeshPipelineOptions options = {});

  // This dp rank's rows of the job's batch x [B, T, ...], and under cp this cp rank's two
  // chunks of each (context_parallel/sequence_layout.h).
  Tensor local_batch(const Tensor& x) const;
  // One step on this rank's rows (input read on the first pp stage, target on the last;
  // elsewhere they may be undefined). Returns the batch's loss on every rank, a scalar.
  Tensor train_step(const Tensor& input, const Tensor& target, const PipeLoss& loss_fn);
  // The sums after backward (see above).
  void finish_gradients();

  // This rank's parameters, each once, under their single-device names (a tied copy under
  // its own: the GPT's last stage holds "lm_head.weight").
  std::vector<nn::NamedTensor> named_parameters() const { return chunk_parameters(chunks_); }
  std::vector<Tensor> parameters() const { return chunk_parameter_tensors(chunks_); }
  void zero_grad(bool set_to_none = true);
  void train(bool on = true);

  const std::vector<nn::ModulePtr>& chunks() const { return chunks_; }
  PipelineStage& stage() { return *stage_; }

 private:
  std::shared_ptr<ProcessGroup> pp_, dp_, cp_;  // dp_, cp_ null with one rank
  MeshPipelineOptions options_;
  std::vector<nn::ModulePtr> chunks_;
  std::unique_ptr<PipelineStage> stage_;
};

}  // namespace mg::parallel
