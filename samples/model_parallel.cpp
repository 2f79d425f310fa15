// model_parallel: a model split over two devices (PyTorch's "Single-Machine Model
// Parallel" tutorial in minigrad).
//
//   build/bin/model_parallel                        # layer1 on cuda:0, layer2 on cuda:1
//   build/bin/model_parallel --devices cpu,cuda:0   # any two devices
//   build/bin/model_parallel --wrap-data-parallel   # what DataParallel says about it
//
// layer1 = Linear(10, 5) lives on the first device and layer2 = Linear(5, 2) on the
// second; forward moves the activations between them with Tensor::to, whose backward
// moves the gradient back, so loss.backward() reaches both layers and SGD trains the
// whole model. Nothing is replicated and nothing runs at the same time: model
// parallelism is for a model too big for one device, data parallelism (DataParallel)
// for a batch too big or too slow for one.
#include <cstdio>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <fmt/format.h>

#include <minigrad/autograd/functions.h>
#include <minigrad/core/generator.h>
#include <minigrad/nn/layers.h>
#include <minigrad/nn/optim/sgd.h>
#include <minigrad/parallel/communicator.h>
#include <minigrad/parallel/data_parallel.h>
#include <minigrad/parallel/device_list.h>
#include "support/command_line.h"

namespace {

using namespace mg;

class ToyModel : public nn::Cloneable<ToyModel> {
 public:
  ToyModel(Device first, Device second)
      : Cloneable<ToyModel>("ToyModel"), first_(first), second_(second) {
    register_module("layer1", std::make_shared<nn::Linear>(10, 5))->to(first);
    register_module("layer2", std::make_shared<nn::Linear>(5, 2))->to(second);
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

int run(const Options& options) {
  manual_seed(0);
  const auto [first, second] = choose_devices(options);
  auto model = std::make_shared<ToyModel>(first, second);
  fmt::print("layer1 = Linear(10, 5) on {}, layer2 = Linear(5, 2) on {}\n", first, second);
  if (options.wrap_data_parallel) return show_wrapping(model, first, second);

  optim::SGD sgd(model->parameters(), optim::SGDOptions(0.01));
  const Tensor inputs = randn({64, 10});
  // The labels live where the outputs come out: on the second device.
  const Tensor labels = randint(0, 2, {64}, second);
  for (int epoch = 1; epoch <= options.epochs; ++epoch) {
    sgd.zero_grad();
    const Tensor outputs = model->forward(inputs);
    const Tensor loss = cross_entropy(outputs, labels);
    loss.backward();
    sgd.step();
    fmt::print("Epoch {}, Loss: {:.4f}\n", epoch, loss.item<float>());
  }
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
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  app.add_flag("--wrap-data-parallel", options.wrap_data_parallel,
               "Wrap the model in DataParallel to see why that is the wrong tool for it");
  if (const std::optional<int> exit_code = samples::parse_command_line(app, "model_parallel", argc, argv))
    return *exit_code;
  try {
    return run(options);
  } catch (const std::exception& e) {
    return samples::report_error("model_parallel", e);
  }
}
