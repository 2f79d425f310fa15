// PipelineStage: pipeline parallelism across processes (torch.distributed.pipelining).
// Rank r of a process group holds stage r of the model, on the group's device; the ranks
// hand activations forward and gradients back with ProcessGroup::send / recv, in the
// order the same schedules as the in-process Pipe say (schedule.h), and each stage's
// forward and backward are the same StageRunner's (stage_runner.h).
//
//   auto group = parallel::init_process_group("gloo");       // started by minigrad-run
//   manual_seed(0);                                          // the same model on every rank
//   auto model = make_model();
//   const auto balance = parallel::even_balance(model->size(), group->size());
//   parallel::PipelineStage stage(parallel::split_stage(model, balance, group->rank()),
//                                 group, options);
//   optim::SGD sgd(stage.module()->parameters(), optim::SGDOptions(0.1));
//   sgd.zero_grad();
//   Tensor loss = stage.train_step(x, y, parallel::cross_entropy_loss);  // x on rank 0, y on the last
//   sgd.step();                                           // each rank its own layers
//
// What travels, per micro-batch j, between neighbours s and s + 1:
//   s -> s+1  a header (int64: micro-batches, rows, dtype, rank, sizes), tag 3j: the
//             receiver learns the activation's shape, and stage s > 0 learns the step's
//             micro-batch count from micro-batch 0's header;
//   s -> s+1  the activation, tag 3j + 1;
//   s+1 -> s  its gradient, tag 3j + 2 (of the shape s sent, which s knows).
//
// Model chunks (virtual stages, for the interleaved schedule): a rank may hold v modules,
// rank r's chunk c being virtual stage k = c p + r of v p; the input enters virtual stage
// 0 (rank 0's chunk 0) and the loss is the last one's (rank p-1's chunk v-1). The same
// messages then run between virtual stages k and k + 1 -- on ranks k mod p and
// (k + 1) mod p, rank p-1 handing on to rank 0 between rounds -- with tags
// 3 (j v p + k) + 0, 1, 2, so that every boundary of every micro-batch has tags of its
// own. One chunk per rank is the case above (k = s). Float64 activations and gradients
// travel as the bits of int64 (context_parallel/wire.h): process groups carry float32
// and int64.
// Sends are asynchronous and kept until the end of the step; receives wait. Because
// every rank follows its list in order and every list is deadlock-free against the
// others (tests/parallel/pipe_schedule_test.cpp plays them against each other), a step
// cannot hang; a rank that fails makes its neighbours' receives time out (the group's
// timeout), and its own error names its stage, pass and micro-batch.
#pragma once

#include <memory>
#include <vector>

#include <minigrad/nn/module.h>
#include <minigrad/parallel/c10d/process_group.h>
#include <minigrad/parallel/pipeline/schedule.h>
#include <minigrad/parallel/pipeline/stage_runner.h>
#include <minigrad/parallel/pipeline/timeline.h>

namespace mg::parallel {

struct PipelineStageOptions {
  int64_t chunks = 1;  // micro-batches per step (torchgpipe's word); every rank the same
  Schedule schedule = Schedule::GPipe;
  Checkpoint checkpoint = Checkpoint::Never;
  // true: each micro-batch's loss is a mean over its rows, weighted by its share of the
  // batch's rows. false: it is already its share of the batch's loss (a sum over its
  // tokens divided by the whole batch's count, as under data or context parallelism) and
  // the micro-batches' losses are added as they are.
  bool weight_by_rows = true;
};

class PipelineStage {
 public:
  // `module`: this rank's layers (split_stage), moved to the group's device.
  PipelineStage(nn::ModulePtr module, std::shared_ptr<ProcessGroup> group,
                PipelineStageOptions options = {});
  // `model_chunks`: this rank's v chunks, chunk c being virtual stage c p + r (every rank
  // gives the same v). More than one needs the interleaved schedule.
  PipelineStage(std::vector<nn::ModulePtr> model_chunks, std::shared_ptr<ProcessGroup> group,
                PipelineStageOptions options = {});

  // One training step of the whole pipeline; every rank calls it. `input` (the batch) is
  // rank 0's, `target` the last rank's; the others pass undefined tensors. The
  // parameters' gradients accumulate on each rank. Returns the batch's loss on the last
  // rank (the micro-batches' losses weighted by their rows), undefined elsewhere.
  Tensor train_step(const Tensor& input, const Tensor& target, const PipeLoss& loss_fn);
  // train_step's loss on every rank: the last rank's scalar broadcast over the group (any
  // float dtype, as its bits); the others pass what train_step gave them (undefined). A
  // collective of the group: a trainer prints, logs and checks the loss alike on any rank.
  Tensor loss_on_every_rank(const Tensor& loss) const;

  int stage() const { return group_->rank(); }
  int num_stages() const { return group_->size(); }
  int num_model_chunks() const { return static_cast<int>(chunks_.size()); }
  const nn::ModulePtr& module() const { return chunks_.front(); }  // chunk 0
  const std::vector<nn::ModulePtr>& model_chunks() const { return chunks_; }
  // This rank's spans of the last step (the other stages' are theirs).
  PipeTimeline last_timeline() const;
  // The most micro-batch-chunks whose activations this rank held at once.
  int64_t last_max_stashed() const { return last_max_stashed_; }

 private:
  struct Header;
  struct PendingRecv;
  Header receive_header(int64_t micro_batch, int virtual_stage);
  PendingRecv post_header_recv(int64_t micro_batch, int virtual_stage);
  static Header read_header(const PendingRecv& posted, int virtual_stage);

  std::vector<nn::ModulePtr> chunks_;
  std::shared_ptr<ProcessGroup> group_;
  PipelineStageOptions options_;
  std::shared_ptr<TimelineRecorder> recorder_;
  int64_t last_max_stashed_ = 0;
};

}  // namespace mg::parallel
