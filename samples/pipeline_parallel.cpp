// pipeline_parallel: pipeline parallelism across processes, one stage per rank
// (parallel::PipelineStage, as torch.distributed.pipelining).
//
//   build/bin/minigrad-run --nproc-per-node 2 build/bin/pipeline_parallel --chunks 8
//   build/bin/minigrad-run --nproc-per-node 4 build/bin/pipeline_parallel --schedule 1f1b
//   build/bin/pipeline_parallel                 # one process: the whole model, one stage
//
// Every rank builds the same MLP from the same seed and keeps its own stage's layers
// (split_stage over an even balance); rank 0 feeds the batch, the last rank computes the
// loss, and the activations and gradients in between travel with send/recv between
// neighbouring ranks (Gloo on the CPU, or NCCL with --backend nccl, a GPU per rank).
// The losses are the one-process run's, to float rounding. At the end every rank says
// how busy its stage was.
#include <CLI/CLI.hpp>

#include <cstdio>
#include <cstdlib>
#include <memory>

#include <fmt/format.h>

#include <minigrad/autograd/functions.h>
#include <minigrad/core/generator.h>
#include <minigrad/nn/layers.h>
#include <minigrad/nn/optim/sgd.h>
#include <minigrad/parallel/c10d/rendezvous.h>
#include <minigrad/parallel/pipeline/balance.h>
#include <minigrad/parallel/pipeline/pipeline_stage.h>

#include "support/command_line.h"

namespace {

using namespace mg;

struct Options {
  int steps = 10;
  int64_t chunks = 8;
  std::string schedule = "gpipe";
  std::string backend = "gloo";
  int64_t width = 256;
  int layers = 8;  // Linear layers, ReLU between them
  int64_t batch = 1024;
  double timeout = 300.0;  // seconds a rank waits for the others before failing
};

parallel::ProcessGroupOptions group_options(const Options& options) {
  parallel::ProcessGroupOptions o;
  o.timeout = std::chrono::milliseconds(static_cast<int64_t>(options.timeout * 1000.0));
  return o;
}

// Without minigrad-run's environment: a group of one, this process.
std::shared_ptr<parallel::ProcessGroup> make_group(const Options& options) {
  if (parallel::in_launched_job())
    return parallel::init_process_group(options.backend, group_options(options));
  parallel::TCPStoreOptions store_options;
  store_options.is_server = true;
  auto store = std::make_shared<parallel::TCPStore>("127.0.0.1", 0, store_options);
  return parallel::new_process_group(options.backend, store, 0, 1, group_options(options));
}

int run(const Options& options) {
  const auto group = make_group(options);
  const int rank = group->rank(), world = group->size();
  const Device device = group->device();

  // 2 * layers - 1 modules (a ReLU between Linears) for `world` stages: checked before
  // any is built.
  MG_CHECK(2 * static_cast<int64_t>(options.layers) - 1 >= world,
           "--layers {} makes {} modules for {} ranks; every stage needs at least one", options.layers,
           2 * static_cast<int64_t>(options.layers) - 1, world);
  manual_seed(0);  // the same model and batch on every rank
  auto model = std::make_shared<nn::Sequential>();
  for (int i = 0; i < options.layers; ++i) {
    if (i > 0) model->push_back(std::make_shared<nn::ReLU>());
    model->push_back(std::make_shared<nn::Linear>(options.width, options.width));
  }
  const Tensor x = randn({options.batch, options.width});
  const Tensor y = randint(0, options.width, {options.batch});

  const auto balance = parallel::even_balance(static_cast<int64_t>(model->size()), world);
  parallel::PipelineStageOptions stage_options;
  stage_options.chunks = options.chunks;
  stage_options.schedule = parallel::parse_schedule(options.schedule);
  parallel::PipelineStage stage(parallel::split_stage(model, balance, rank), group, stage_options);
  const auto& names = stage.module()->named_children();
  fmt::print("rank {} of {} on {}: stage {}, layers {} to {}\n", rank, world, device, rank,
             names.front().first, names.back().first);
  std::fflush(stdout);

  optim::SGD sgd(stage.module()->parameters(), optim::SGDOptions(0.05));
  const bool first = rank == 0, last = rank + 1 == world;
  for (int step = 1; step <= options.steps; ++step) {
    sgd.zero_grad();
    const Tensor loss = stage.train_step(first ? x.to(device) : Tensor(),
                                         last ? y.to(device) : Tensor(), parallel::cross_entropy_loss);
    sgd.step();
    if (last) fmt::print("step {}, loss {:.6f}\n", step, loss.item<float>());
  }
  const parallel::PipeTimeline t = stage.last_timeline();
  fmt::print("stage {}: busy {:.0f}% of the last step ({:.2f} ms); at most {} of its {} "
             "micro-batches alive at once ({})\n",
             rank, 100.0 * t.busy_fraction(rank), 1e3 * t.running_seconds(),
             stage.last_max_stashed(), options.chunks, options.schedule);
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  Options options;
  CLI::App app{"An MLP trained as a pipeline with a stage per process (start with minigrad-run)."};
  using samples::integer_in;
  app.add_option("--steps", options.steps, "SGD steps on one fixed batch")
      ->check(integer_in(1, 1 << 30))->capture_default_str();
  app.add_option("--chunks", options.chunks,
                 "Micro-batches per batch (fewer when the batch has fewer rows, as torch.chunk)")
      ->check(samples::positive_integer())->capture_default_str();
  app.add_option("--schedule", options.schedule, "gpipe or 1f1b")
      ->check(CLI::IsMember({"gpipe", "1f1b"}))->capture_default_str();
  app.add_option("--backend", options.backend, "gloo (CPU) or nccl (a GPU per rank)")
      ->check(CLI::IsMember({"gloo", "nccl"}))->capture_default_str();
  app.add_option("--width", options.width, "Width of every layer")
      ->check(integer_in(1, 1 << 20))->capture_default_str();
  // Compared with the ranks before any layer is built.
  app.add_option("--layers", options.layers, "Linear layers (at least one per rank)")
      ->check(integer_in(1, 1 << 16))->capture_default_str();
  app.add_option("--batch", options.batch, "Rows of the batch")
      ->check(integer_in(1, 1 << 24))->capture_default_str();
  app.add_option("--timeout", options.timeout,
                 "Seconds a rank waits for the others before failing")
      ->check(samples::seconds())->capture_default_str();
  const char* program = "pipeline_parallel";
  if (const std::optional<int> exit_code = samples::parse_command_line(app, program, argc, argv))
    return *exit_code;
  try {
    return run(options);
  } catch (const std::exception& e) {
    return samples::report_error(program, e);
  }
}
