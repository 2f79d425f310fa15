// Sequential runs a Linear followed by a ReLU as one op (Linear::forward_relu ->
// mg::linear_relu) where nn/fusion.h says so, unless fusion is switched off. That must
// change nothing a user can see: the output, every gradient and the backward graph are
// the ones of running the modules one by one; only exact Linear/ReLU pairs are fused (a
// subclass may override forward and must run as written); and the peak memory of a
// training step is no higher than unfused.
#include "catch_compat.h"

#include <memory>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "core/host_backed_cuda.h"

#include <minigrad/autograd/node.h>
#include <minigrad/minigrad.h>

namespace nn = mg::nn;
using mg::Device;
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

std::shared_ptr<nn::Sequential> mlp(int64_t in, int64_t hidden, int64_t out) {
  return std::make_shared<nn::Sequential>(std::initializer_list<nn::ModulePtr>{
      std::make_shared<nn::Linear>(in, hidden), std::make_shared<nn::ReLU>(),
      std::make_shared<nn::Linear>(hidden, hidden), std::make_shared<nn::ReLU>(),
      std::make_shared<nn::Linear>(hidden, out)});
}

// A ReLU that is not a plain ReLU: doubles its output.
class DoubledReLU : public nn::ReLU {
 public:
  Tensor forward(const Tensor& input) override { return mg::mul(mg::relu(input), 2.0); }
};

}  // namespace

TEST_CASE("Sequential: Linear+ReLU pairs run fused, with the unfused values, gradients and graph") {
  mg::manual_seed(21);
  auto seq = mlp(13, 32, 5);
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

  // The backward graph is the unfused one: Linear <- ReLU <- Linear <- ReLU <- Linear.
  std::vector<std::string> names;
  for (const mg::Node* node = fused.grad_fn().get(); node != nullptr;) {
    names.push_back(node->name());
    const mg::Node* next = nullptr;
    for (const auto& edge : node->next_edges())
      if (edge.valid() && edge.function->name() != "AccumulateGrad") next = edge.function.get();
    node = next;
  }
  CHECK(names == std::vector<std::string>{"LinearBackward", "ReluBackward", "LinearBackward",
                                          "ReluBackward", "LinearBackward"});
}

TEST_CASE("Sequential: only exact Linear (with bias) + ReLU pairs are fused") {
  mg::testing::ScopedHostBackedCuda scope;
  auto& fake = scope.stand_in();  // host memory and CPU ops; counts the fused calls
  const Device gpu = Device::cuda(0);
  mg::manual_seed(22);
  const Tensor x = mg::randn(Shape{6, 4}).to(gpu);

  auto two_pairs = mlp(4, 8, 3);
  two_pairs->to(gpu);
  int before = fake.addmm_relu_calls();
  two_pairs->forward(x);
  CHECK(fake.addmm_relu_calls() - before == 2);

  auto custom = std::make_shared<nn::Sequential>(std::initializer_list<nn::ModulePtr>{
      std::make_shared<nn::Linear>(4, 3), std::make_shared<DoubledReLU>()});
  custom->to(gpu);
  before = fake.addmm_relu_calls();
  const Tensor y = custom->forward(x);
  CHECK(fake.addmm_relu_calls() == before);
  CHECK(y.to_vector<float>() == unfused_forward(*custom, x).to_vector<float>());

  auto no_bias = std::make_shared<nn::Sequential>(std::initializer_list<nn::ModulePtr>{
      std::make_shared<nn::Linear>(4, 3, /*bias=*/false), std::make_shared<nn::ReLU>()});
  no_bias->to(gpu);
  before = fake.addmm_relu_calls();
  const Tensor z = no_bias->forward(x);
  CHECK(fake.addmm_relu_calls() == before);
  CHECK(z.to_vector<float>() == unfused_forward(*no_bias, x).to_vector<float>());

  auto relu_first = std::make_shared<nn::Sequential>(std::initializer_list<nn::ModulePtr>{
      std::make_shared<nn::ReLU>(), std::make_shared<nn::Linear>(4, 3)});
  relu_first->to(gpu);
  before = fake.addmm_relu_calls();
  relu_first->forward(x);
  CHECK(fake.addmm_relu_calls() == before);
}

// A single fused backward node would hold the incoming gradient, the output and the
// masked gradient while its matmuls allocate: more memory at the peak of backward.
TEST_CASE("Sequential: a fused step's peak memory is no higher than the unfused step's") {
  mg::testing::ScopedHostBackedCuda scope;
  const Device gpu = Device::cuda(0);
  mg::manual_seed(23);
  auto seq = mlp(64, 256, 10);
  seq->to(gpu);
  const Tensor x = mg::randn(Shape{512, 64}).to(gpu);
  const Tensor targets = mg::randint(0, 10, Shape{512}).to(gpu);
  auto& memory = mg::testing::host_backed_memory();

  auto peak_of_step = [&](bool fused) {
    seq->zero_grad(/*set_to_none=*/true);
    memory.reset_peak();
    const std::size_t start = memory.current_bytes();
    {
      Tensor logits = fused ? seq->forward(x) : unfused_forward(*seq, x);
      mg::cross_entropy(logits, targets).backward();
    }
    return memory.peak_bytes() - start;
  };
  const std::size_t unfused_peak = peak_of_step(false);
  const std::size_t fused_peak = peak_of_step(true);
  INFO("peak bytes above the model: fused " << fused_peak << ", unfused " << unfused_peak);
  // Activations are 512 x 256 floats (512 KiB): the unfused step holds several at its peak.
  CHECK(unfused_peak > 4 * 512 * 256 * sizeof(float));
  CHECK(fused_peak <= unfused_peak);
}

// The switch of nn/fusion.h: off, Sequential runs each module's own forward (no fused
// call reaches the backend), a scope restores what was set before, and the setting is
// one for the process, so a forward on another thread (a DataParallel replica's) follows it.
TEST_CASE("Sequential with fusion off runs the modules one by one, FusionGuard restores it") {
  mg::testing::ScopedHostBackedCuda scope;
  auto& fake = scope.stand_in();
  const Device gpu = Device::cuda(0);
  mg::manual_seed(24);
  auto seq = mlp(4, 8, 3);
  seq->to(gpu);
  const Tensor x = mg::randn(Shape{6, 4}).to(gpu);

  REQUIRE(nn::fusion_enabled());  // the default
  int before = fake.addmm_relu_calls();
  {
    nn::FusionGuard unfused(false);
    CHECK_FALSE(nn::fusion_enabled());
    const Tensor y = seq->forward(x);
    CHECK(fake.addmm_relu_calls() == before);
    CHECK(y.to_vector<float>() == unfused_forward(*seq, x).to_vector<float>());
    {
      nn::FusionGuard fused(true);
      seq->forward(x);
      CHECK(fake.addmm_relu_calls() - before == 2);
    }
    CHECK_FALSE(nn::fusion_enabled());
    before = fake.addmm_relu_calls();
    std::thread other([&] { seq->forward(x); });
    other.join();
    CHECK(fake.addmm_relu_calls() == before);
  }
  CHECK(nn::fusion_enabled());
  before = fake.addmm_relu_calls();
  seq->forward(x);
  CHECK(fake.addmm_relu_calls() - before == 2);

  nn::set_fusion_enabled(false);
  before = fake.addmm_relu_calls();
  seq->forward(x);
  CHECK(fake.addmm_relu_calls() == before);
  nn::set_fusion_enabled(true);
}

TEST_CASE("Sequential: fusion on and off give the same values, gradients and backward graph") {
  mg::manual_seed(25);
  auto seq = mlp(11, 24, 7);
  const Tensor x = mg::randn(Shape{10, 11});
  const Tensor targets = mg::randint(0, 7, Shape{10});
  auto step = [&](bool fused, std::vector<std::string>& graph) {
    nn::FusionGuard guard(fused);
    seq->zero_grad(/*set_to_none=*/true);
    Tensor out = seq->forward(x);
    graph.clear();
    for (const mg::Node* node = out.grad_fn().get(); node != nullptr;) {
      graph.push_back(node->name());
      const mg::Node* next = nullptr;
      for (const auto& edge : node->next_edges())
        if (edge.valid() && edge.function->name() != "AccumulateGrad") next = edge.function.get();
      node = next;
    }
    mg::cross_entropy(out, targets).backward();
    return std::make_pair(out.to_vector<float>(), grads_of(*seq));
  };
  std::vector<std::string> fused_graph, unfused_graph;
  const auto fused = step(true, fused_graph);
  const auto unfused = step(false, unfused_graph);
  CHECK(fused.first == unfused.first);
  CHECK(fused.second == unfused.second);
  CHECK(fused_graph == unfused_graph);
  CHECK(unfused_graph == std::vector<std::string>{"LinearBackward", "ReluBackward",
                                                  "LinearBackward", "ReluBackward",
                                                  "LinearBackward"});
}
