// End to end: a small MLP's gradients on the GPU equal those on the CPU, and a few SGD
// steps trace the same loss curve on both.
#include "gpu_compare.h"

#include <minigrad/nn/layers.h>
#include <minigrad/nn/optim/sgd.h>

using namespace mg;
using mg::cuda_test::gpu;
using mg::cuda_test::random_cpu;
using mg::cuda_test::require_close;

namespace {

std::shared_ptr<nn::Sequential> make_mlp(uint64_t seed) {
  manual_seed(seed);
  return std::make_shared<nn::Sequential>(std::initializer_list<nn::ModulePtr>{
      std::make_shared<nn::Linear>(20, 64), std::make_shared<nn::ReLU>(),
      std::make_shared<nn::Linear>(64, 32), std::make_shared<nn::ReLU>(),
      std::make_shared<nn::Linear>(32, 10)});
}

Tensor batch_targets(int64_t rows, uint64_t seed) {
  manual_seed(seed);
  return randint(0, 10, {rows});
}

// The two backends round matmuls differently (~1e-7), so a ReLU input within that of
// zero could switch sides and change a gradient by a whole sample's share. Picks a
// batch whose ReLU inputs all stay `margin` away from zero (checked on the CPU).
Tensor batch_clear_of_relu_kinks(nn::Sequential& model, int64_t rows, uint64_t seed) {
  constexpr float margin = 1e-5f;
  NoGradGuard no_grad;
  for (uint64_t attempt = 0; attempt < 100; ++attempt) {
    const Tensor x = random_cpu({rows, 20}, seed + attempt);
    Tensor h = x;
    bool clear = true;
    for (size_t i = 0; i < model.size() && clear; ++i) {
      if (std::dynamic_pointer_cast<nn::ReLU>(model[i])) {
        for (float v : h.to_vector<float>()) clear = clear && std::fabs(v) > margin;
      }
      h = model[i]->forward(h);
    }
    if (clear) return x;
  }
  FAIL("no batch found whose ReLU inputs stay clear of zero");
  return Tensor();
}

}  // namespace

TEST_CASE("gradients of an MLP on the GPU equal those on the CPU") {
  for (int64_t batch : {int64_t{1}, int64_t{7}, int64_t{33}, int64_t{257}}) {
    CAPTURE(batch);
    auto cpu_model = make_mlp(70);
    auto gpu_model = cpu_model->clone(gpu());
    const Tensor x = batch_clear_of_relu_kinks(*cpu_model, batch, 71);
    const Tensor t = batch_targets(batch, 72);

    const Tensor cpu_loss = cross_entropy(cpu_model->forward(x), t);
    const Tensor gpu_loss = cross_entropy(gpu_model->forward(x.to(gpu())), t.to(gpu()));
    require_close(gpu_loss, cpu_loss, 1e-5, 1e-6);
    cpu_loss.backward();
    gpu_loss.backward();

    const auto cpu_params = cpu_model->named_parameters();
    const auto gpu_params = gpu_model->named_parameters();
    REQUIRE(cpu_params.size() == gpu_params.size());
    for (size_t i = 0; i < cpu_params.size(); ++i) {
      CAPTURE(cpu_params[i].first);
      const Tensor g = gpu_params[i].second.grad();
      REQUIRE(g.defined());
      REQUIRE(g.device() == gpu());
      require_close(g, cpu_params[i].second.grad(), 1e-3, 1e-6);
    }
  }
}

TEST_CASE("the gradient of to() carries back to the host leaf") {
  Tensor x = random_cpu({33, 4}, 73).set_requires_grad(true);
  const Tensor y = x.to(gpu());
  (y * y).sum().backward();
  REQUIRE(x.grad().device() == Device::cpu());
  require_close(x.grad(), x.detach() * 2.0, 0.0, 0.0);
}

TEST_CASE("SGD steps give the same loss curve on the GPU and the CPU") {
  auto cpu_model = make_mlp(80);
  auto gpu_model = cpu_model->clone(gpu());
  const Tensor x = batch_clear_of_relu_kinks(*cpu_model, 64, 81);
  optim::SGD cpu_sgd(cpu_model->parameters(), optim::SGDOptions(0.1).momentum(0.9));
  optim::SGD gpu_sgd(gpu_model->parameters(), optim::SGDOptions(0.1).momentum(0.9));
  const Tensor t = batch_targets(64, 82);
  const Tensor xg = x.to(gpu()), tg = t.to(gpu());
  std::vector<float> cpu_curve, gpu_curve;
  for (int step = 0; step < 8; ++step) {
    cpu_sgd.zero_grad();
    gpu_sgd.zero_grad();
    const Tensor cpu_loss = cross_entropy(cpu_model->forward(x), t);
    const Tensor gpu_loss = cross_entropy(gpu_model->forward(xg), tg);
    cpu_loss.backward();
    gpu_loss.backward();
    cpu_sgd.step();
    gpu_sgd.step();
    cpu_curve.push_back(cpu_loss.item<float>());
    gpu_curve.push_back(gpu_loss.item<float>());
  }
  for (size_t i = 0; i < cpu_curve.size(); ++i) {
    CAPTURE(i);
    REQUIRE(gpu_curve[i] == Approx(cpu_curve[i]).epsilon(1e-4));
  }
  REQUIRE(gpu_curve.back() < gpu_curve.front());  // and it learns
}
