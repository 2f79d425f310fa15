// One stage's share of a pipeline step: the forward and the backward of each of its
// micro-batches, and what is kept between the two (the stash). The in-process Pipe and
// the multi-process PipelineStage both run their stages with this; they differ only in
// how tensors reach a stage (a copy between threads, or send/recv between processes).
//
// Forward and backward are ordinary autograd. The stage's input is made a leaf of its
// own graph (a copy of the previous stage's output, requiring grad), so
//   forward(j, x):   out = stage(x_leaf)          keeps {x_leaf, out} for micro-batch j
//   backward(j, g):  run backward from out with gradient g on this stage's thread:
//                    the stage's parameters accumulate their gradient, and x_leaf.grad()
//                    is what goes back to the previous stage.
// The parameter gradients add up over the micro-batches; the last stage weights each
// micro-batch's loss by its share of the batch's rows, so the sum is the gradient of
// the loss of the whole batch (when the loss is a mean over rows, as cross_entropy).
//
// Activation checkpointing: a checkpointed micro-batch's forward runs without a graph
// and keeps only x_leaf; its backward runs the forward again, with the graph, first.
#pragma once

#include <functional>
#include <string_view>
#include <vector>

#include <minigrad/nn/module.h>

namespace mg::parallel {

enum class Checkpoint { Never, ExceptLast, Always };
const char* checkpoint_name(Checkpoint checkpoint);  // "never", "except_last", "always"
Checkpoint parse_checkpoint(std::string_view name);

// The loss of one micro-batch's output against its targets: a mean over its rows (as
// cross_entropy). The pipeline weights it by the micro-batch's share of the rows.
using PipeLoss = std::function<Tensor(const Tensor& output, const Tensor& target)>;

// The usual PipeLoss: cross_entropy with its default options (mean over the rows).
// cross_entropy itself takes a third, defaulted parameter, which a two-argument
// std::function cannot see, so it is not a PipeLoss by itself.
Tensor cross_entropy_loss(const Tensor& output, const Tensor& target);

// A batch of `rows` rows cut with chunk's rule into at most `chunks` micro-batches.
struct MicroBatches {
  MicroBatches(int64_t rows, int64_t chunks, const char* what);
  int64_t rows;
  std::vector<int64_t> sizes, offsets;
  int64_t count() const { return static_cast<int64_t>(sizes.size()); }
  // Micro-batch j's share of the batch: its loss (a mean over its rows) times this
  // sums to the batch's mean.
  double weight(int64_t j) const;
};

class StageRunner {
 public:
  struct Options {
    int stage = 0;
    bool first = false, last = false;
    Checkpoint checkpoint = Checkpoint::Never;
    int64_t micro_batches = 1;
    bool training = true;             // record graphs (false: forward only, nothing kept)
    bool input_requires_grad = false;  // first stage: the caller's input wants a gradient
  };
  StageRunner(nn::ModulePtr module, Options options);

  // The last stage of a training step computes the loss: target j is micro-batch j's.
  void set_loss(PipeLoss loss_fn, std::vector<Tensor> targets, std::vector<double> weights);

  // Micro-batch j's forward on `input` (this stage's own copy, on its device). Returns the
  // output cut from the graph: what the next stage (or the caller) receives.
  Tensor forward(int64_t j, const Tensor& input);
  // Micro-batch j's backward, given the gradient of its output (undefined on the last
  // stage with a loss: the loss itself is the root). Returns the gradient of its input
  // (undefined where the input needs none: the first stage, unless asked for).
  Tensor backward(int64_t j, const Tensor& grad_output);

  // The weighted loss of micro-batch j, cut from the graph (last stage with a loss).
  const Tensor& loss(int64_t j) const { return losses_[static_cast<size_t>(j)]; }
  // The most micro-batches whose stash was alive at once.
  int64_t max_stashed() const { return max_stashed_; }

 private:
  struct Stashed {
    Tensor input;  // the leaf
    Tensor root;   // the output (or the weighted loss); undefined when checkpointed
    bool live = false;
  };
  bool checkpointed(int64_t j) const;
  // The stage's forward from `input`, and the weighted loss on the last stage.
  Tensor run_forward(int64_t j, const Tensor& input, Tensor& output);

  nn::ModulePtr module_;
  Options options_;
  PipeLoss loss_fn_;
  std::vector<Tensor> targets_;
  std::vector<double> weights_;
  std::vector<Stashed> stash_;
  std::vector<Tensor> losses_;
  int64_t stashed_ = 0, max_stashed_ = 0;
};

}  // namespace mg::parallel
