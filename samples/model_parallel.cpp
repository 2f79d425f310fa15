// model_parallel: a model split over two devices (PyTorch's "Single-Machine Model
// Parallel" tutorial in minigrad).
//
//   build/bin/model_parallel                        # layer1 on cuda:0, layer2 on cuda:1
//   build/bin/model_parallel --devices cpu,cuda:0   # any two devices
//   build/bin/model_parallel --wrap-data-parallel   # what DataParallel says about it
//   build/bin/model_parallel --pipeline --chunks 8  # the same training, both stages busy
//   build/bin/model_parallel --devices cpu,cpu --pipeline --trace t.json  # for Perfetto
//
// layer1 = Linear(10, 5) lives on the first device and layer2 = Linear(5, 2) on the
// second; forward moves the activations between them with Tensor::to, whose backward
// moves the gradient back, so loss.backward() reaches both layers and SGD trains the
// whole model. Nothing is replicated and nothing runs at the same time: model
// parallelism is for a model too big for one device, data parallelism (DataParallel)
// for a batch too big or too slow for one.
//
// --pipeline keeps the split and fixes the waiting: parallel::Pipe cuts each batch into
// --chunks micro-batches, and while layer2 works on one, layer1 already works on the
// next, each on a thread of its own. Same initial weights, same batch, same losses (to
// float rounding); at the end it prints how busy each stage was, against the same step
// with one micro-batch (the naive split). --width and --batch make the layers big
// enough for the overlap to show; --timeline writes the last step as an SVG.
#include <cstdio>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <fmt/format.h>

#include <minigrad/autograd/functions.h>
#include <minigrad/core/files.h>
#include <minigrad/core/generator.h>
#include <minigrad/nn/layers.h>
#include <minigrad/nn/optim/sgd.h>
#include <minigrad/parallel/data_parallel.h>
#include <minigrad/parallel/devices/communicator.h>
#include <minigrad/parallel/devices/device_list.h>
#include <minigrad/parallel/pipeline/pipe.h>
#include "support/command_line.h"
#include "support/trace.h"

namespace {

using namespace mg;

class ToyModel : public nn::Cloneable<ToyModel> {
 public:
  ToyModel(Device first, Device second, int64_t width)
      : Cloneable<ToyModel>("ToyModel"), first_(first), second_(second) {
    register_module("layer1", std::make_shared<nn::Linear>(10, width))->to(first);
    register_module("layer2", std::make_shared<nn::Linear>(width, 2))->to(second);
  }

  Tensor forward(const Tensor& x) override {
    const Tensor hidden = relu(child("layer1")->forward(x.to(first_)));
    // The one line that makes this model parallel: the activations cross to the
    // second device here, and in backward their gradient crosses back.
    return child("layer2")->forward(hidden.to(second_));
  }

 private:
  Device first_, second_;
};

struct Options {
  std::string devices;
  bool wrap_data_parallel = false;
  int epochs = 10;
  int64_t width = 5;   // layer1's outputs (the tutorial's 5)
  int64_t batch = 64;
  bool pipeline = false;
  int64_t chunks = 8;
  std::string schedule = "gpipe";
  std::string timeline;  // SVG of the last step (--pipeline)
  samples::TraceOptions trace;  // --trace FILE.json: a few epochs' steps
};

// Two devices: the two given, or the first two GPUs, or what this machine has.
std::pair<Device, Device> choose_devices(const Options& options) {
  if (!options.devices.empty()) {
    try {
      const std::vector<Device> devices = parallel::parse_device_list(options.devices);
      MG_CHECK(devices.size() == 2, "--devices {}: expected two devices, one per layer",
               options.devices);
      for (const Device& d : devices) parallel::check_device_list({d}, "--devices");
      return {devices[0], devices[1]};
    } catch (const Error& e) {
      throw samples::OptionError(e.what());  // a bad flag: reported as one
    }
  }
  const std::vector<Device> gpus = parallel::visible_gpus();
  if (gpus.size() >= 2) return {gpus[0], gpus[1]};
  if (gpus.size() == 1) {
    if (options.wrap_data_parallel) {
      // A real split is what DataParallel objects to: use the host as the second device.
      fmt::print("One GPU: layer1 on cuda:0, layer2 on the CPU, so that the model is really split\n");
      return {gpus[0], Device::cpu()};
    }
    fmt::print("Only one GPU: both layers on cuda:0 (the hand-over between them still runs)\n");
    return {gpus[0], gpus[0]};
  }
  fmt::print("No GPU: both layers on the CPU (the hand-over between them still runs)\n");
  return {Device::cpu(), Device::cpu()};
}

// What happens when a model-parallel model is given to DataParallel, and what to do.
int show_wrapping(const nn::ModulePtr& model, Device first, Device second) {
  fmt::print("Wrapping the model in DataParallel over [{}, {}] ...\n", first, first);
  try {
    parallel::DataParallel wrapped(model, {first, first});
    wrapped.forward(randn({64, 10}, first));
  } catch (const Error& e) {
    fmt::print("DataParallel refused it:\n  {}\n\n", e.what());
    fmt::print(
        "The right way: DataParallel copies one whole model onto every device and splits the\n"
        "batch, so every parameter must start on device_ids[0]. A model whose layers sit on\n"
        "different devices already spreads over them: call it directly, as this program does\n"
        "without --wrap-data-parallel. To split the batch as well, keep the model whole on one\n"
        "device and wrap that (see data_parallel_tutorial).\n");
    return 0;
  }
  MG_CHECK(first == second,
           "DataParallel accepted a model split over {} and {}; it should have refused", first,
           second);
  fmt::print(
      "DataParallel accepted it: both layers are on {}, so the model is not really split and\n"
      "there is nothing to object to. With the layers on two devices (two GPUs, or\n"
      "--devices cuda:0,cpu) it refuses, naming the first parameter that is not on\n"
      "device_ids[0]; a split model is called directly, as this program does without\n"
      "--wrap-data-parallel.\n",
      first);
  return 0;
}

// Each stage's share of the step in which it computed, from the Pipe's timeline.
void print_busy(const parallel::PipeTimeline& t, const std::vector<Device>& devices,
                const char* what) {
  fmt::print("{}: step {:.2f} ms", what, 1e3 * t.running_seconds());
  for (int s = 0; s < t.stages; ++s)
    fmt::print(", stage {} ({}) busy {:.0f}%", s, devices[static_cast<size_t>(s)],
               100.0 * t.busy_fraction(s));
  fmt::print("\n");
}

// The same model as a Sequential, cut after layer1's ReLU, under a Pipe: the same
// initial weights (made in the same order from the same seed) and the same batch.
int run_pipeline(const Options& options, Device first, Device second) {
  auto model = std::make_shared<nn::Sequential>(std::initializer_list<nn::ModulePtr>{
      std::make_shared<nn::Linear>(10, options.width), std::make_shared<nn::ReLU>(),
      std::make_shared<nn::Linear>(options.width, 2)});
  // The naive split, for comparison at the end: the same stages with one micro-batch.
  const nn::ModulePtr naive_copy = model->clone();
  const std::vector<Device> devices{first, second};
  parallel::PipeOptions pipe_options;
  pipe_options.chunks = options.chunks;
  pipe_options.balance = {2, 1};
  pipe_options.schedule = parallel::parse_schedule(options.schedule);
  pipe_options.checkpoint = parallel::Checkpoint::Never;
  auto pipe = std::make_shared<parallel::Pipe>(model, devices, pipe_options);
  fmt::print("Pipe over [{}, {}]: {} micro-batches of a batch of {}, schedule {}\n", first,
             second, options.chunks, options.batch, options.schedule);

  optim::SGD sgd(pipe->parameters(), optim::SGDOptions(0.01));
  const Tensor inputs = randn({options.batch, 10});
  const Tensor labels = randint(0, 2, {options.batch}, second);
  samples::StepTracer tracer(options.trace);
  for (int epoch = 1; epoch <= options.epochs; ++epoch) {
    tracer.begin_step(epoch);
    sgd.zero_grad();
    const parallel::PipeStep step = pipe->train_step(inputs, labels, parallel::cross_entropy_loss);
    sgd.step();
    tracer.end_step();
    fmt::print("Epoch {}, Loss: {:.4f}\n", epoch, step.loss.item<float>());
  }
  tracer.finish();
  fmt::print("\nThe memory the Pipe planned before its first step (a dry run of one micro-batch):\n{}",
             parallel::plan_str(pipe->last_plan()));
  const parallel::PipeTimeline pipelined = pipe->last_timeline();
  if (!options.timeline.empty()) {
    const std::string svg = parallel::timeline_svg(
        pipelined, fmt::format("model_parallel --pipeline: {} micro-batches, {}", options.chunks,
                               options.schedule));
    files::write_atomically("--timeline", options.timeline, svg);
  }

  parallel::PipeOptions one_chunk = pipe_options;
  one_chunk.chunks = 1;
  parallel::Pipe naive(naive_copy, devices, one_chunk);
  for (int i = 0; i < 2; ++i) naive.train_step(inputs, labels, parallel::cross_entropy_loss);  // warm, then time
  const parallel::PipeTimeline alone = naive.last_timeline();
  fmt::print("\n");
  print_busy(alone, devices, "naive split (1 micro-batch)");
  print_busy(pipelined, devices, fmt::format("pipeline ({} micro-batches)", options.chunks).c_str());
  fmt::print("bubble: {:.0f}% of the step idle (ideal for equal stages: (p-1)/(m+p-1) = {:.0f}%)\n",
             100.0 * pipelined.bubble_fraction(),
             100.0 * parallel::ideal_bubble_fraction(2, options.chunks));
  if (pipelined.busy_fraction(0) < 0.25 && pipelined.busy_fraction(1) < 0.25)
    fmt::print("(the stages spent most of the step waiting: layers this small take less time\n"
               "than a hand-over between the stages' threads; try --width 2048 --batch 8192)\n");
  if (!options.timeline.empty()) fmt::print("timeline of the last step: {}\n", options.timeline);
  return 0;
}

int run(const Options& options) {
  manual_seed(0);
  const auto [first, second] = choose_devices(options);
  if (options.pipeline) return run_pipeline(options, first, second);
  auto model = std::make_shared<ToyModel>(first, second, options.width);
  fmt::print("layer1 = Linear(10, {}) on {}, layer2 = Linear({}, 2) on {}\n", options.width,
             first, options.width, second);
  if (options.wrap_data_parallel) return show_wrapping(model, first, second);

  optim::SGD sgd(model->parameters(), optim::SGDOptions(0.01));
  const Tensor inputs = randn({options.batch, 10});
  // The labels live where the outputs come out: on the second device.
  const Tensor labels = randint(0, 2, {options.batch}, second);
  samples::StepTracer tracer(options.trace);
  for (int epoch = 1; epoch <= options.epochs; ++epoch) {
    tracer.begin_step(epoch);
    sgd.zero_grad();
    const Tensor outputs = model->forward(inputs);
    const Tensor loss = cross_entropy(outputs, labels);
    loss.backward();
    sgd.step();
    tracer.end_step();
    fmt::print("Epoch {}, Loss: {:.4f}\n", epoch, loss.item<float>());
  }
  tracer.finish();
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  Options options;
  CLI::App app{"A model with its two layers on two devices, trained with SGD."};
  app.add_option("--devices", options.devices,
                 "The two devices, comma-separated (e.g. 0,1 or cpu,cuda:0); default: the first "
                 "two GPUs, or what this machine has");
  app.add_option("--epochs", options.epochs, "Training epochs")
      ->check(samples::integer_in(1, 1 << 30))
      ->capture_default_str();
  app.add_flag("--wrap-data-parallel", options.wrap_data_parallel,
               "Wrap the model in DataParallel to see why that is the wrong tool for it");
  app.add_option("--width", options.width, "layer1's output width (the tutorial's 5)")
      ->check(samples::positive_integer())
      ->capture_default_str();
  app.add_option("--batch", options.batch, "Rows of the training batch")
      ->check(samples::positive_integer())
      ->capture_default_str();
  CLI::Option* pipeline = app.add_flag(
      "--pipeline", options.pipeline,
      "Train the split model as a pipeline (parallel::Pipe): both stages at work");
  // Each of these would do nothing without --pipeline: refused ("requires --pipeline").
  app.add_option("--chunks", options.chunks, "--pipeline: micro-batches per batch")
      ->check(samples::positive_integer())
      ->capture_default_str()
      ->needs(pipeline);
  app.add_option("--schedule", options.schedule, "--pipeline: gpipe or 1f1b")
      ->check(CLI::IsMember({"gpipe", "1f1b"}))
      ->capture_default_str()
      ->needs(pipeline);
  app.add_option("--timeline", options.timeline,
                 "--pipeline: write the last step's timeline (an SVG) here")
      ->needs(pipeline);
  samples::add_trace_options(app, options.trace, "epoch");
  if (const std::optional<int> exit_code = samples::parse_command_line(app, "model_parallel", argc, argv))
    return *exit_code;
  try {
    samples::check_trace_fits(options.trace, options.epochs, "epoch", "model_parallel");
    return run(options);
  } catch (const std::exception& e) {
    return samples::report_error("model_parallel", e);
  }
}
