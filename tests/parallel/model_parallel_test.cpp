// Model parallelism: layer1 on one device, layer2 on another, joined by Tensor::to,
// whose backward carries the gradient back. On the CPU both "devices" are cpu, which
// still runs the ToDevice copies and their backward; tests/cuda repeats this on GPUs.
#include "catch_compat.h"

#include "parallel/dp_check.h"

#include <minigrad/minigrad.h>

using mg::Device;
using mg::Tensor;

namespace {

class TwoDeviceNet : public mg::nn::Cloneable<TwoDeviceNet> {
 public:
  TwoDeviceNet(Device first, Device second)
      : Cloneable<TwoDeviceNet>("TwoDeviceNet"), first_(first), second_(second) {
    layer1 = register_module("layer1", std::make_shared<mg::nn::Linear>(10, 5));
    layer2 = register_module("layer2", std::make_shared<mg::nn::Linear>(5, 2));
    layer1->to(first);
    layer2->to(second);
  }
  Tensor forward(const Tensor& x) override {
    const Tensor h = mg::relu(layer1->forward(x.to(first_)));
    return layer2->forward(h.to(second_));
  }
  std::shared_ptr<mg::nn::Linear> layer1, layer2;

 private:
  Device first_, second_;
};

}  // namespace

TEST_CASE("model parallel: gradients across a device boundary equal the single-device ones") {
  mg::manual_seed(11);
  auto split = std::make_shared<TwoDeviceNet>(Device::cpu(), Device::cpu());
  // The same values as one plain Sequential on one device.
  auto single = std::make_shared<mg::nn::Sequential>(std::initializer_list<mg::nn::ModulePtr>{
      split->layer1->clone(), std::make_shared<mg::nn::ReLU>(), split->layer2->clone()});
  const Tensor x = mg::randn({64, 10});
  const Tensor targets = mg::randint(0, 2, {64});

  for (int step = 0; step < 3; ++step) {
    const Tensor loss_split = mg::cross_entropy(split->forward(x), targets);
    const Tensor loss_single = mg::cross_entropy(single->forward(x), targets);
    mg::testing::require_close(loss_split, loss_single, "loss", 1e-6, 1e-7);
    split->zero_grad();
    single->zero_grad();
    loss_split.backward();
    loss_single.backward();
    const auto p = split->parameters();
    const auto q = single->parameters();
    REQUIRE(p.size() == q.size());
    mg::NoGradGuard no_grad;
    for (size_t k = 0; k < p.size(); ++k) {
      mg::testing::require_close(p[k].grad(), q[k].grad(), "grad", 1e-6, 1e-7);
      Tensor a = p[k], b = q[k];
      a.add_(a.grad(), -0.01);
      b.add_(b.grad(), -0.01);
    }
  }
}

TEST_CASE("model parallel: the graph crosses devices through ToDeviceBackward") {
  auto split = std::make_shared<TwoDeviceNet>(Device::cpu(), Device::cpu());
  const Tensor out = split->forward(mg::randn({3, 10}));
  // out = layer2(h.to(second)): walk back from the Linear to the copy between devices.
  bool found = false;
  std::vector<std::shared_ptr<mg::Node>> stack{out.grad_fn()};
  while (!stack.empty() && !found) {
    auto node = stack.back();
    stack.pop_back();
    found = node->name() == "ToDeviceBackward";
    for (const auto& e : node->next_edges())
      if (e.valid()) stack.push_back(e.function);
  }
  REQUIRE(found);
}
