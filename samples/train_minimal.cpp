// train_minimal: the smallest complete training program, read top to bottom. An MLP
// learns Fashion-MNIST with SGD, each batch split over every GPU by DataParallel (over
// two CPU replicas when there is no GPU), and the test accuracy is printed at the end.
//
//   build/bin/train_minimal [data-dir] [epochs]     # defaults: the Debian dataset, 5 epochs
//
// train_fashion_mnist is the same loop with flags, checkpoints, signals, metrics and DDP.
#include <cstdio>
#include <memory>
#include <string>
#include <vector>

#include <fmt/format.h>

#include <minigrad/minigrad.h>

#include "support/command_line.h"

using namespace mg;

int main(int argc, char** argv) try {
  const std::string root = argc > 1 ? argv[1] : data::FashionMNIST::kDefaultRoot;
  // The one checked way the programs read numbers: "3x" is not 3 (atoi's answer).
  const auto read_epochs = [&]() -> int64_t {
    try {
      return argc > 2 ? samples::parse_integer("epochs", argv[2], 1, 1 << 20) : 5;
    } catch (const samples::OptionError&) {
      return 0;
    }
  };
  const int epochs = static_cast<int>(read_epochs());
  if (argc > 3 || epochs <= 0) {
    fmt::print(stderr, "train_minimal: error: usage: train_minimal [data-dir] [epochs > 0]\n");
    return 2;
  }

  // The data: 60,000 training and 10,000 test images of 28 x 28 pixels, 10 classes, as
  // rows of 784 floats normalised with the training set's mean and standard deviation.
  data::FashionMNISTOptions normalized;
  normalized.normalize = true;
  auto train_set = std::make_shared<data::FashionMNIST>(root, data::Split::Train, normalized);
  auto test_set = std::make_shared<data::FashionMNIST>(root, data::Split::Test, normalized);
  data::DataLoaderOptions train_options;
  train_options.batch_size = 64;
  train_options.shuffle = true;
  data::DataLoader train_loader(train_set, train_options);
  data::DataLoader test_loader(test_set, data::DataLoaderOptions{/*batch_size=*/1000});

  // The devices: every GPU, or two replicas on the CPU (the same code path, run on
  // threads that share the CPU).
  std::vector<Device> devices;
  for (int i = 0; i < cuda::device_count(); ++i) devices.push_back(Device::cuda(i));
  if (devices.empty()) devices = {Device::cpu(), Device::cpu()};

  // The model lives on the first device; DataParallel scatters each batch over the
  // devices, runs a replica on each, gathers the outputs there, and in backward sums the
  // replicas' gradients into the model's own parameters, which SGD then updates.
  manual_seed(0);
  auto model = std::make_shared<nn::Sequential>(std::initializer_list<nn::ModulePtr>{
      std::make_shared<nn::Linear>(784, 256), std::make_shared<nn::ReLU>(),
      std::make_shared<nn::Linear>(256, 10)});
  model->to(devices[0]);
  auto net = std::make_shared<parallel::DataParallel>(model, devices);
  optim::SGD sgd(model->parameters(), optim::SGDOptions(0.02).momentum(0.9));
  fmt::print("train_minimal: {} training images, DataParallel over {} device{}\n",
             train_set->size(), devices.size(), devices.size() == 1 ? "" : "s");

  for (int epoch = 1; epoch <= epochs; ++epoch) {
    double loss_sum = 0.0;
    for (const data::Batch& host_batch : train_loader) {
      const data::Batch batch = host_batch.to(devices[0]);
      const Tensor loss = cross_entropy(net->forward(batch.data), batch.target);
      sgd.zero_grad();
      loss.backward();
      sgd.step();
      loss_sum += loss.item<float>();
    }
    fmt::print("epoch {}/{}: train loss {:.4f}\n", epoch, epochs,
               loss_sum / static_cast<double>(train_loader.size()));
  }

  // The test set, with autograd off: the share of images whose largest logit is the label.
  NoGradGuard no_grad;
  int64_t correct = 0;
  for (const data::Batch& host_batch : test_loader) {
    const Tensor predicted = net->forward(host_batch.data.to(devices[0])).argmax(1);
    const std::vector<int64_t> p = predicted.to_vector<int64_t>();
    const std::vector<int64_t> labels = host_batch.target.to_vector<int64_t>();
    for (size_t i = 0; i < labels.size(); ++i) correct += p[i] == labels[i];
  }
  fmt::print("test accuracy {:.2f}%\n", 100.0 * static_cast<double>(correct) /
                                            static_cast<double>(test_set->size()));
  return 0;
} catch (const std::exception& e) {
  std::fflush(stdout);
  fmt::print(stderr, "train_minimal: error: {}\n", e.what());
  return 1;
}
