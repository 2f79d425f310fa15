// Forward hooks on nn::Module (PyTorch's register_forward_pre_hook and
// register_forward_hook): what runs when, what a hook may replace, how Sequential calls
// its children's hooks (also around a fused Linear+ReLU), and removal.
#include "catch_compat.h"

#include <memory>
#include <string>
#include <vector>

#include <minigrad/minigrad.h>
#include <minigrad/nn/checkpoint.h>

namespace nn = mg::nn;
using mg::Shape;
using mg::Tensor;

namespace {

std::shared_ptr<nn::Sequential> mlp() {
  mg::manual_seed(7);
  return std::make_shared<nn::Sequential>(std::initializer_list<nn::ModulePtr>{
      std::make_shared<nn::Linear>(3, 4), std::make_shared<nn::ReLU>(),
      std::make_shared<nn::Linear>(4, 2)});
}

}  // namespace

TEST_CASE("Module hooks: a pre-hook may replace the input, a hook the output, in order") {
  auto linear = std::make_shared<nn::Linear>(2, 2);
  std::vector<std::string> calls;
  linear->register_forward_pre_hook([&](nn::Module& m, const Tensor& x) {
    calls.push_back("pre1 " + m.type_name());
    return x * 2.0;  // replaces the input
  });
  linear->register_forward_pre_hook([&](nn::Module&, const Tensor&) {
    calls.push_back("pre2");
    return Tensor();  // keeps it
  });
  linear->register_forward_hook([&](nn::Module&, const Tensor& in, const Tensor& out) {
    calls.push_back("post");
    REQUIRE(in.to_vector<float>() == std::vector<float>{2.f, 4.f});  // the replaced input
    return out + 1.0;
  });
  const Tensor x = mg::from_vector(std::vector<float>{1.f, 2.f}, Shape{1, 2});
  const Tensor expected = linear->forward(x * 2.0) + 1.0;  // forward itself runs no hooks
  REQUIRE(calls.empty());
  const Tensor y = (*linear)(x);
  REQUIRE(calls == std::vector<std::string>{"pre1 Linear", "pre2", "post"});
  REQUIRE(y.to_vector<float>() == expected.to_vector<float>());
}

TEST_CASE("Module hooks: remove_hook removes one hook, a removed handle is ignored") {
  auto relu = std::make_shared<nn::ReLU>();
  int pre = 0, post = 0;
  const auto a = relu->register_forward_pre_hook([&](nn::Module&, const Tensor&) { ++pre; return Tensor(); });
  const auto b = relu->register_forward_hook([&](nn::Module&, const Tensor&, const Tensor&) {
    ++post;
    return Tensor();
  });
  REQUIRE(relu->has_forward_hooks());
  (*relu)(mg::ones(Shape{2}));
  relu->remove_hook(a);
  relu->remove_hook(a);  // again: nothing
  (*relu)(mg::ones(Shape{2}));
  REQUIRE(pre == 1);
  REQUIRE(post == 2);
  relu->remove_hook(b);
  REQUIRE_FALSE(relu->has_forward_hooks());
  REQUIRE_THROWS_WITH(relu->register_forward_hook(nullptr),
                      MG_CONTAINS("register_forward_hook: the hook of ReLU is empty"));
}

TEST_CASE("Module hooks: Sequential runs its children's hooks, fused Linear+ReLU included") {
  auto model = mlp();
  const Tensor x = mg::randn(Shape{5, 3});
  const Tensor plain = model->forward(x);
  std::vector<std::string> seen;
  for (const auto& [name, child] : model->named_children())
    child->register_forward_hook([&seen, name = name](nn::Module& m, const Tensor&, const Tensor& out) {
      seen.push_back(name + ":" + m.type_name() + ":" + std::to_string(out.size(1)));
      return Tensor();
    });
  // The ReLU has a hook now, so the Linear before it runs alone and the ReLU as a module:
  // each hook sees its own module's output.
  const Tensor hooked = model->forward(x);
  REQUIRE(seen == std::vector<std::string>{"0:Linear:4", "1:ReLU:4", "2:Linear:2"});
  REQUIRE(hooked.to_vector<float>() == plain.to_vector<float>());
  REQUIRE(nn::fusable_linear_relu(*model->named_children()[0].second,
                                  model->named_children()[1].second.get()) == nullptr);

  // Hooks on the Linear only: the pair still runs fused, inside the Linear's hooks, so the
  // Linear's hook sees the ReLU's output (what ran in its place).
  auto fused = mlp();
  int pre = 0;
  Tensor linear_out;
  auto first = fused->named_children()[0].second;
  first->register_forward_pre_hook([&](nn::Module&, const Tensor&) { ++pre; return Tensor(); });
  first->register_forward_hook([&](nn::Module&, const Tensor&, const Tensor& out) {
    linear_out = out;
    return Tensor();
  });
  REQUIRE(nn::fusable_linear_relu(*first, fused->named_children()[1].second.get()) != nullptr);
  const Tensor y = fused->forward(x);
  REQUIRE(pre == 1);
  for (float v : linear_out.to_vector<float>()) REQUIRE(v >= 0.f);  // after the ReLU
  REQUIRE(y.to_vector<float>() == plain.to_vector<float>());
}

TEST_CASE("Module hooks: clone and shallow_clone keep the hooks, as PyTorch's copies do") {
  auto relu = std::make_shared<nn::ReLU>();
  int calls = 0;
  relu->register_forward_hook([&](nn::Module&, const Tensor&, const Tensor&) {
    ++calls;
    return Tensor();
  });
  (*relu->clone())(mg::ones(Shape{1}));
  (*relu->shallow_clone())(mg::ones(Shape{1}));
  REQUIRE(calls == 2);
}

namespace {

// y = x * scale: a module of two inputs (PyTorch's forward(self, x, scale)).
class Scaled : public nn::Cloneable<Scaled> {
 public:
  Scaled() : nn::Cloneable<Scaled>("Scaled") { register_parameter("w", mg::full(Shape{2}, 3.0)); }
  Tensor forward(const Tensor& x) override { return x * parameter("w"); }
  Tensor forward_args(const nn::TensorList& inputs) override {
    MG_CHECK(inputs.size() == 2, "Scaled: x and scale, got {} inputs", inputs.size());
    return inputs[0] * parameter("w") * inputs[1];
  }
};

}  // namespace

TEST_CASE("Module of several inputs: module({x, scale}) runs forward_args between the hooks, which see x") {
  auto m = std::make_shared<Scaled>();
  const Tensor x = mg::from_vector(std::vector<float>{1.f, 2.f}, Shape{2});
  const Tensor scale = mg::from_vector(std::vector<float>{10.f, 100.f}, Shape{2});
  CHECK((*m)({x, scale}).to_vector<float>() == std::vector<float>{30.f, 600.f});
  CHECK((*m)({x}).to_vector<float>() == std::vector<float>{3.f, 6.f});  // one input: forward(x)
  std::vector<float> seen_in;
  m->register_forward_pre_hook([](nn::Module&, const Tensor& in) { return in + 1.0; });  // the first input
  m->register_forward_hook([&](nn::Module&, const Tensor& in, const Tensor& out) {
    seen_in = in.to_vector<float>();
    return out * 2.0;
  });
  CHECK((*m)({x, scale}).to_vector<float>() == std::vector<float>{120.f, 1800.f});  // (x + 1) 3 scale, doubled
  CHECK(seen_in == std::vector<float>{2.f, 3.f});
  // A module of one input called with two, and a call with none, are refused by name.
  auto linear = std::make_shared<nn::Linear>(2, 2);
  REQUIRE_THROWS_WITH((*linear)({x, scale}), MG_CONTAINS("Linear: forward takes one input, got 2"));
  REQUIRE_THROWS_WITH((*linear)(nn::TensorList{}), MG_CONTAINS("Linear: called with no inputs"));
}

TEST_CASE("Module of several inputs: checkpointed, the first input's and the parameters' gradients are the "
          "plain call's, and an extra input that requires grad is refused") {
  const Tensor scale = mg::from_vector(std::vector<float>{10.f, 100.f}, Shape{2});
  std::vector<float> grads[2], input_grads[2];
  for (int checkpointed = 0; checkpointed < 2; ++checkpointed) {
    auto m = std::make_shared<Scaled>();
    nn::set_checkpointing(m, checkpointed == 1);
    Tensor x = mg::from_vector(std::vector<float>{1.f, 2.f}, Shape{2}).set_requires_grad(true);
    mg::sum((*m)({x * 1.0, scale})).backward();
    grads[checkpointed] = m->parameter("w").grad().to_vector<float>();
    input_grads[checkpointed] = x.grad().to_vector<float>();
    if (checkpointed == 1) {
      const Tensor needs_grad = scale.detach().set_requires_grad(true);
      REQUIRE_THROWS_WITH((*m)({x * 1.0, needs_grad}), MG_CONTAINS("Scaled: checkpointed with input 1 requiring grad"));
    }
  }
  CHECK(grads[0] == std::vector<float>{10.f, 200.f});
  CHECK(grads[1] == grads[0]);
  CHECK(input_grads[0] == std::vector<float>{30.f, 300.f});
  CHECK(input_grads[1] == input_grads[0]);
}
