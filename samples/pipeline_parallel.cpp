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
};

// Without minigrad-run's environment: a group of one, this process.
std::shared_ptr<parallel::ProcessGroup> make_group(const Options& options) {
  if (parallel::in_launched_job()) return parallel::init_process_group(options.backend);
  parallel::TCPStoreOptions store_options;
  store_options.is_server = true;
  auto store = std::make_shared<parallel::TCPStore>("127.0.0.1", 0, store_options);
  return parallel::new_process_group(options.backend, store, 0, 1);
}

int run(const Options& options) {
  const auto group = make_group(options);
  const int rank = group->rank(), world = group->size();
  const Device device = group->device();

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
  app.add_option("--steps", options.steps, "SGD steps on one fixed batch")
      ->check(CLI::PositiveNumber)->capture_default_str();
  app.add_option("--chunks", options.chunks, "Micro-batches per batch")
      ->check(CLI::PositiveNumber)->capture_default_str();
  app.add_option("--schedule", options.schedule, "gpipe or 1f1b")
      ->check(CLI::IsMember({"gpipe", "1f1b"}))->capture_default_str();
  app.add_option("--backend", options.backend, "gloo (CPU) or nccl (a GPU per rank)")
      ->check(CLI::IsMember({"gloo", "nccl"}))->capture_default_str();
  app.add_option("--width", options.width, "Width of every layer")
      ->check(CLI::PositiveNumber)->capture_default_str();
  app.add_option("--layers", options.layers, "Linear layers (at least one per rank)")
      ->check(CLI::PositiveNumber)->capture_default_str();
  app.add_option("--batch", options.batch, "Rows of the batch")
      ->check(CLI::PositiveNumber)->capture_default_str();
  CLI11_PARSE(app, argc, argv);
  try {
    return run(options);
  } catch (const std::exception& e) {
    std::fflush(stdout);
    fmt::print(stderr, "pipeline_parallel: error: {}\n", e.what());
    return 1;
  }
}
