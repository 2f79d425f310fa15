// Pipe: pipeline parallelism in one process (torchgpipe's Pipe, PyTorch's former
// torch.distributed.pipeline.sync.Pipe).
//
// The layers of an nn::Sequential are cut into stages, stage s on devices[s] (distinct
// GPUs, a GPU repeated, or CPU devices); each batch is cut into micro-batches, and the
// stages work on different micro-batches at the same time, each on a thread of its own:
//
//   parallel::PipeOptions options;
//   options.chunks = 8;                                  // micro-batches per batch
//   options.schedule = parallel::Schedule::OneFOneB;
//   auto pipe = std::make_shared<parallel::Pipe>(model, devices, options);
//   optim::SGD sgd(pipe->parameters(), optim::SGDOptions(0.1));
//   sgd.zero_grad();
//   parallel::PipeStep step = pipe->train_step(x, y, parallel::cross_entropy_loss);  // forward + backward
//   sgd.step();
//
// or, as with any module (GPipe only: the loss comes after the whole forward):
//
//   Tensor loss = cross_entropy(pipe->forward(x), y);
//   loss.backward();   // the stages' backwards, each on its own thread
//
// Both give the gradients of the plain module on the whole batch: each stage's forward
// and backward are ordinary autograd on its own graph (stage_runner.h), and the
// pipeline only decides the order (schedule.h) and hands tensors between the stages'
// threads, on copy streams ordered by events (transfer.h). See
// docs/pipeline-parallel.md for the walkthrough.
#pragma once

#include <memory>
#include <optional>
#include <vector>

#include <minigrad/nn/layers.h>
#include <minigrad/parallel/pipeline/plan.h>
#include <minigrad/parallel/pipeline/schedule.h>
#include <minigrad/parallel/pipeline/stage_runner.h>
#include <minigrad/parallel/pipeline/timeline.h>

namespace mg::parallel {

struct PipeOptions {
  int64_t chunks = 1;            // micro-batches per batch (chunk's rule: fewer if short)
  std::vector<int64_t> balance;  // layers per stage; empty: as even as possible
  Schedule schedule = Schedule::GPipe;
  // torchgpipe's default: every micro-batch but the last recomputes its forward in
  // backward instead of keeping its activations.
  Checkpoint checkpoint = Checkpoint::ExceptLast;
  // Plan each stage's memory (a dry run of one micro-batch) whenever the micro-batch
  // shape changes, and refuse a step that does not fit (plan.h).
  bool check_memory = true;
};

// What train_step returns: the loss of the whole batch (the weighted sum of the
// micro-batches' losses) and the output, both on the last device, outside the graph.
struct PipeStep {
  Tensor loss;
  Tensor output;
};

class Pipe : public nn::Module {
 public:
  // `module` must be an nn::Sequential with at least as many layers as devices. Its
  // layers move to their stage's device (build the optimizer afterwards).
  Pipe(nn::ModulePtr module, std::vector<Device> devices, PipeOptions options = {});
  ~Pipe() override;

  // The output of the whole batch, gathered on the last device. With grad mode on it
  // stays connected: its backward runs every stage's backward (GPipe order), each on
  // its stage's thread. Under NoGradGuard it is a forward-only pipeline (any schedule).
  Tensor forward(const Tensor& input) override;
  // One training step under the chosen schedule: forward and backward interleaved as
  // the schedule says, the parameters' gradients accumulated (call SGD::step after).
  // loss_fn(output, target) is a mean over its micro-batch's rows (parallel::cross_entropy_loss).
  PipeStep train_step(const Tensor& input, const Tensor& target, const PipeLoss& loss_fn);

  // The memory plan for `batch`, from a dry run of one micro-batch per stage.
  std::vector<StagePlan> plan(const Tensor& batch);
  const std::vector<StagePlan>& last_plan() const { return last_plan_; }
  // The spans of the last step (or forward and its backward), for busy fractions, the
  // bubble and pictures. Read it after the step.
  PipeTimeline last_timeline() const;
  // Per stage, the most micro-batches whose activations were alive at once in the last
  // step (what 1F1B bounds by p - s).
  const std::vector<int64_t>& last_max_stashed() const { return last_max_stashed_; }

  int num_stages() const { return static_cast<int>(devices_.size()); }
  const std::vector<Device>& devices() const { return devices_; }
  const std::vector<int64_t>& balance() const { return balance_; }
  const PipeOptions& options() const { return options_; }
  // The layers of stage s, as an nn::Sequential whose children keep their names.
  const std::shared_ptr<nn::Sequential>& stage(int s) const;
  // The whole model, registered as the child "module" (parameters "module.0.weight").
  nn::ModulePtr module() const { return child("module"); }
  std::string extra_repr() const override;

 protected:
  nn::ModulePtr copy_node() const override;

 private:
  struct Run;
  class Backward;
  std::shared_ptr<Run> start_run(const Tensor& input, bool training);
  void plan_if_needed(const Tensor& input);

  std::vector<Device> devices_;
  PipeOptions options_;
  std::vector<int64_t> balance_;
  std::vector<std::shared_ptr<nn::Sequential>> stages_;
  std::shared_ptr<TimelineRecorder> last_recorder_;
  std::vector<int64_t> last_max_stashed_;
  std::vector<StagePlan> last_plan_;
  std::optional<Shape> planned_shape_;
};

}  // namespace mg::parallel
