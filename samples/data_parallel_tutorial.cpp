// data_parallel_tutorial: PyTorch's "Optional: Data Parallelism" tutorial in minigrad.
//
//   build/bin/data_parallel_tutorial                     # every visible GPU, or 4 CPU replicas
//   build/bin/data_parallel_tutorial --replicas 2        # 2 replicas on the CPU
//   build/bin/data_parallel_tutorial --device-ids 1,2,3  # those GPUs (or cpu,cpu / 0,0)
//   CUDA_VISIBLE_DEVICES=2,3 build/bin/data_parallel_tutorial   # physical GPUs 2 and 3
//   build/bin/data_parallel_tutorial --replicas 2 --trace t.json   # 3 batches for Perfetto
//
// A RandomDataset of 100 examples with 5 features, batches of 30, and a model that is a
// single Linear(5, 2) whose forward prints the size of the piece of the batch it got.
// Wrapped in DataParallel over N devices, each batch of 30 is cut into pieces of
// ceil(30 / N) rows (8, 8, 8, 6 for N = 4), each replica prints its piece, and the
// outputs are gathered back into one [30, 2] tensor:
//
//   	In Model: input size [8, 5] output size [8, 2]
//   	In Model: input size [8, 5] output size [8, 2]
//   	In Model: input size [8, 5] output size [8, 2]
//   	In Model: input size [6, 5] output size [6, 2]
//   Outside: input size [30, 5] output_size [30, 2]
//
// The replicas run at the same time on worker threads, so their lines may come in any
// order. Without GPUs the replicas share the CPU: the numbers are the same, and the
// mechanism (scatter, replicate, parallel forward, gather) is the one that runs on GPUs.
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <fmt/format.h>

#include <minigrad/core/generator.h>
#include <minigrad/data/dataloader.h>
#include <minigrad/data/dataset.h>
#include <minigrad/nn/layers.h>
#include <minigrad/parallel/data_parallel.h>
#include <minigrad/parallel/devices/communicator.h>
#include <minigrad/parallel/devices/device_list.h>
#include "support/command_line.h"
#include "support/trace.h"

namespace {

using namespace mg;

// The tutorial's model: one Linear layer that says what it saw.
class Model : public nn::Cloneable<Model> {
 public:
  Model(int64_t input_size, int64_t output_size) : Cloneable<Model>("Model") {
    register_module("fc", std::make_shared<nn::Linear>(input_size, output_size));
  }

  Tensor forward(const Tensor& input) override {
    // child("fc") rather than a member pointer kept from the constructor: a replica is
    // a shallow copy of this object, whose registered children (with the replica's
    // parameters) are its own, while a copied member pointer would still point at the
    // original module's layer.
    const Tensor output = child("fc")->forward(input);
    fmt::print("\tIn Model: input size {} output size {}\n", input.shape(), output.shape());
    std::fflush(stdout);
    return output;
  }
};

struct Options {
  int64_t input_size = 5;
  int64_t output_size = 2;
  int64_t batch_size = 30;
  int64_t data_size = 100;
  int replicas = 0;  // 0: not given
  std::string device_ids;
  samples::TraceOptions trace;  // --trace FILE.json
};

// Where the replicas go, and a line saying why.
std::vector<Device> choose_devices(const Options& options) {
  const char* visible = std::getenv("CUDA_VISIBLE_DEVICES");
  const std::string visible_note =
      visible != nullptr ? fmt::format(" (CUDA_VISIBLE_DEVICES={})", visible) : "";
  if (!options.device_ids.empty()) {
    std::vector<Device> devices;
    try {
      devices = parallel::parse_device_list(options.device_ids);
      parallel::check_device_list(devices, "--device-ids");
    } catch (const Error& e) {
      throw samples::OptionError(e.what());  // a bad flag: reported as one
    }
    fmt::print("--device-ids {}: using {}{}\n", options.device_ids,
               parallel::device_list_str(devices), devices[0].is_cuda() ? visible_note : "");
    return devices;
  }
  const std::vector<Device> gpus = parallel::visible_gpus();
  if (options.replicas > 0 || gpus.empty()) {
    const int n = options.replicas > 0 ? options.replicas : 4;
    fmt::print("{}: running {} replica{} on the CPU\n",
               options.replicas > 0 ? fmt::format("--replicas {}", n)
                                    : std::string("No GPU visible") + visible_note,
               n, n == 1 ? "" : "s");
    return std::vector<Device>(static_cast<size_t>(n), Device::cpu());
  }
  fmt::print("Let's use {} GPU{}!{}\n", gpus.size(), gpus.size() == 1 ? "" : "s", visible_note);
  return gpus;
}

int run(const Options& options) {
  manual_seed(0);
  const std::vector<Device> devices = choose_devices(options);

  auto dataset = std::make_shared<data::RandomDataset>(options.input_size, options.data_size);
  data::DataLoaderOptions loader_options;
  loader_options.batch_size = options.batch_size;
  loader_options.shuffle = true;
  data::DataLoader loader(dataset, loader_options);

  nn::ModulePtr model = std::make_shared<Model>(options.input_size, options.output_size);
  model->to(devices[0]);
  if (devices.size() > 1) model = std::make_shared<parallel::DataParallel>(model, devices);

  samples::StepTracer tracer(options.trace);
  int64_t step = 0;
  for (const data::Batch& batch : loader) {
    tracer.begin_step(++step);
    const Tensor input = batch.data.to(devices[0]);
    const Tensor output = model->forward(input);
    tracer.end_step();
    fmt::print("Outside: input size {} output_size {}\n", input.shape(), output.shape());
  }
  tracer.finish();
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  Options options;
  CLI::App app{"PyTorch's DataParallel tutorial in minigrad: each batch is split over the "
               "devices, and each replica prints the piece it got."};
  CLI::Option* replicas = app.add_option("--replicas", options.replicas,
                                         "Run this many replicas on the CPU (default without GPUs: 4)")
                             ->check(CLI::Range(1, 64));
  app.add_option("--device-ids", options.device_ids,
                 "Devices to use, comma-separated: GPU ids (1,2,3), a repeated id (0,0), or cpu,cpu")
      ->excludes(replicas);
  app.add_option("--batch-size", options.batch_size, "Batch size")
      ->check(samples::positive_integer())
      ->capture_default_str();
  app.add_option("--data-size", options.data_size, "Examples in the random dataset")
      ->check(samples::positive_integer())
      ->capture_default_str();
  samples::add_trace_options(app, options.trace, "batch");
  if (const std::optional<int> exit_code = samples::parse_command_line(app, "data_parallel_tutorial", argc, argv))
    return *exit_code;
  try {
    return run(options);
  } catch (const std::exception& e) {
    return samples::report_error("data_parallel_tutorial", e);
  }
}
