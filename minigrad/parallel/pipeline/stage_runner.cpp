#include <minigrad/parallel/pipeline/stage_runner.h>

#include <minigrad/autograd/engine.h>
#include <minigrad/autograd/functions.h>
#include <minigrad/autograd/grad_mode.h>
#include <minigrad/core/fault_injection.h>
#include <minigrad/parallel/comm.h>

namespace mg::parallel {

Tensor cross_entropy_loss(const Tensor& output, const Tensor& target) {
  return cross_entropy(output, target);
}

const char* checkpoint_name(Checkpoint checkpoint) {
  switch (checkpoint) {
    case Checkpoint::Never: return "never";
    case Checkpoint::ExceptLast: return "except_last";
    case Checkpoint::Always: return "always";
  }
  return "?";
}

Checkpoint parse_checkpoint(std::string_view name) {
  if (name == "never") return Checkpoint::Never;
  if (name == "except_last") return Checkpoint::ExceptLast;
  if (name == "always") return Checkpoint::Always;
  MG_FAIL("unknown checkpoint mode '{}' (expected never, except_last or always)", name);
}

MicroBatches::MicroBatches(int64_t rows_, int64_t chunks, const char* what) : rows(rows_) {
  MG_CHECK(chunks >= 1, "{}: chunks must be at least 1, got {}", what, chunks);
  // Fewer rows than chunks (the last batch of an epoch) makes fewer micro-batches, as
  // torch.chunk and torchgpipe do; an empty batch has nothing to pipeline.
  MG_CHECK(rows >= 1, "{}: the batch has no rows; a pipeline needs at least one", what);
  sizes = comm::chunk_sizes(rows, chunks);
  int64_t offset = 0;
  for (int64_t size : sizes) {
    offsets.push_back(offset);
    offset += size;
  }
}

double MicroBatches::weight(int64_t j) const {
  // parity fault: every micro-batch's loss weighted 1, i.e. summed instead of averaged.
  if (testing::fault_is_on(testing::Fault::PipelineLossesSummed)) return 1.0;
  const double share = static_cast<double>(sizes[static_cast<size_t>(j)]) / static_cast<double>(rows);
  // parity fault: the last micro-batch's loss counted twice.
  if (testing::fault_is_on(testing::Fault::PipelineMicroBatchCountedTwice) && j + 1 == count())
    return 2.0 * share;
  return share;
}

StageRunner::StageRunner(nn::ModulePtr module, Options options)
    : module_(std::move(module)),
      options_(options),
      stash_(static_cast<size_t>(options.micro_batches)),
      losses_(static_cast<size_t>(options.micro_batches)) {}

void StageRunner::set_loss(PipeLoss loss_fn, std::vector<Tensor> targets,
                           std::vector<double> weights) {
  loss_fn_ = std::move(loss_fn);
  targets_ = std::move(targets);
  weights_ = std::move(weights);
}

bool StageRunner::checkpointed(int64_t j) const {
  return options_.checkpoint == Checkpoint::Always ||
         (options_.checkpoint == Checkpoint::ExceptLast && j + 1 < options_.micro_batches);
}

Tensor StageRunner::run_forward(int64_t j, const Tensor& input, Tensor& output) {
  output = (*module_)(input);
  if (!options_.last || !loss_fn_) return output;
  const Tensor loss = loss_fn_(output, targets_[static_cast<size_t>(j)]);
  MG_CHECK(loss.defined() && loss.numel() == 1,
           "the loss function returned {}; it must return a scalar (the mean over the "
           "micro-batch's rows)",
           loss.defined() ? fmt::format("shape {}", loss.shape()) : std::string("nothing"));
  // Micro-batch j's share of the batch's mean (rows_j / rows, not 1 / micro-batches:
  // the last micro-batch may be smaller).
  Tensor weighted = mul(loss, weights_[static_cast<size_t>(j)]);
  losses_[static_cast<size_t>(j)] = weighted.detach();
  return weighted;
}

Tensor StageRunner::forward(int64_t j, const Tensor& input) {
  Tensor output;
  if (!options_.training) {
    NoGradGuard no_grad;
    run_forward(j, input, output);
    return output;
  }
  Stashed& entry = stash_[static_cast<size_t>(j)];
  MG_CHECK(!entry.live, "micro-batch {} ran its forward twice in one step", j);
  // The stage's own graph starts here: a leaf that collects the input's gradient.
  entry.input = input.detach();
  const bool wants_grad = options_.first ? options_.input_requires_grad : is_floating_point(input.dtype());
  if (wants_grad) entry.input.set_requires_grad(true);
  if (checkpointed(j)) {
    NoGradGuard no_grad;  // kept: the input only; backward computes the rest again
    run_forward(j, entry.input, output);
  } else {
    AutoGradMode grad_mode(true);
    entry.root = run_forward(j, entry.input, output);
  }
  entry.live = true;
  max_stashed_ = std::max(max_stashed_, ++stashed_);
  return output.detach();
}

Tensor StageRunner::backward(int64_t j, const Tensor& grad_output) {
  Stashed& entry = stash_[static_cast<size_t>(j)];
  MG_CHECK(entry.live, "micro-batch {} ran its backward before its forward", j);
  Tensor root = entry.root;
  if (!root.defined()) {  // checkpointed: the forward once more, this time with the graph
    AutoGradMode grad_mode(true);
    Tensor output;
    root = run_forward(j, entry.input, output);
  }
  if (root.requires_grad()) {
    Tensor seed = grad_output;
    if (options_.last && loss_fn_) seed = ones(root.shape(), root.dtype(), root.device());
    MG_CHECK(seed.defined() && seed.shape() == root.shape(),
             "the gradient handed back for the output of shape {} is {}", root.shape(),
             seed.defined() ? fmt::format("of shape {}", seed.shape()) : std::string("missing"));
    run_backward({root}, {seed}, /*retain_graph=*/false);
  }
  Tensor grad_input;
  if (entry.input.requires_grad()) {
    grad_input = entry.input.grad();
    // The output did not depend on the input: its gradient is zero.
    if (!grad_input.defined()) grad_input = zeros_like(entry.input);
  }
  entry = Stashed{};  // frees the micro-batch's graph and input
  --stashed_;
  return grad_input;
}

}  // namespace mg::parallel
