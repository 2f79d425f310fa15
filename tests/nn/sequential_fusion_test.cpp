// Sequential runs a Linear followed by a ReLU as one op (Linear::forward_relu ->
// mg::linear_relu). That must change nothing a user can see: the output and every
// gradient are the ones of running the modules one by one, and only exact Linear/ReLU
// pairs are fused (a subclass may override forward and must run as written).
#include "catch_compat.h"

#include <memory>
#include <vector>

#include <minigrad/autograd/node.h>
#include <minigrad/minigrad.h>

namespace nn = mg::nn;
using mg::Shape;
using mg::Tensor;

namespace {

// Runs the children one at a time, with no fusion: the reference.
Tensor unfused_forward(const nn::Sequential& seq, const Tensor& input) {
  Tensor x = input;
  for (size_t i = 0; i < seq.size(); ++i) x = seq[i]->forward(x);
  return x;
}

std::vector<std::vector<float>> grads_of(nn::Module& m) {
  std::vector<std::vector<float>> grads;
  for (const Tensor& p : m.parameters()) grads.push_back(p.grad().to_vector<float>());
  return grads;
}

// A ReLU that is not a plain ReLU: doubles its output.
class DoubledReLU : public nn::ReLU {
 public:
  Tensor forward(const Tensor& input) override { return mg::mul(mg::relu(input), 2.0); }
};

}  // namespace

TEST_CASE("Sequential: Linear+ReLU pairs run fused, with the unfused values and gradients") {
  mg::manual_seed(21);
  auto seq = std::make_shared<nn::Sequential>(std::initializer_list<nn::ModulePtr>{
      std::make_shared<nn::Linear>(13, 32), std::make_shared<nn::ReLU>(),
      std::make_shared<nn::Linear>(32, 32), std::make_shared<nn::ReLU>(),
      std::make_shared<nn::Linear>(32, 5)});
  const Tensor x = mg::randn(Shape{9, 13});
  const Tensor targets = mg::randint(0, 5, Shape{9});

  Tensor fused = seq->forward(x);
  mg::cross_entropy(fused, targets).backward();
  const auto fused_grads = grads_of(*seq);
  seq->zero_grad();

  Tensor plain = unfused_forward(*seq, x);
  mg::cross_entropy(plain, targets).backward();
  CHECK(fused.to_vector<float>() == plain.to_vector<float>());
  CHECK(grads_of(*seq) == fused_grads);

  // The fused graph: the ReLU's node is gone, folded into the Linear's.
  const auto* last = fused.grad_fn().get();
  REQUIRE(last != nullptr);
  CHECK(last->name() == "LinearBackward");
  CHECK(last->next_edges()[0].function->name() == "LinearReluBackward");
}

TEST_CASE("Sequential: a ReLU subclass, a Linear without bias or a trailing Linear are not fused") {
  mg::manual_seed(22);
  auto custom = std::make_shared<nn::Sequential>(std::initializer_list<nn::ModulePtr>{
      std::make_shared<nn::Linear>(4, 3), std::make_shared<DoubledReLU>()});
  const Tensor x = mg::randn(Shape{6, 4});
  const Tensor y = custom->forward(x);
  CHECK(y.to_vector<float>() == unfused_forward(*custom, x).to_vector<float>());
  CHECK(y.grad_fn()->name() != "LinearReluBackward");

  auto no_bias = std::make_shared<nn::Sequential>(std::initializer_list<nn::ModulePtr>{
      std::make_shared<nn::Linear>(4, 3, /*bias=*/false), std::make_shared<nn::ReLU>()});
  const Tensor z = no_bias->forward(x);
  CHECK(z.to_vector<float>() == unfused_forward(*no_bias, x).to_vector<float>());
  CHECK(z.grad_fn()->name() == "ReluBackward");

  auto relu_first = std::make_shared<nn::Sequential>(std::initializer_list<nn::ModulePtr>{
      std::make_shared<nn::ReLU>(), std::make_shared<nn::Linear>(4, 3)});
  CHECK(relu_first->forward(x).grad_fn()->name() == "LinearBackward");
}
