// nn::Module (registry, traversal, train/eval, to, clone, shallow_clone, zero_grad,
// printing) and the layers: Linear, ReLU, Sequential, CrossEntropyLoss.
#include "catch_compat.h"

#include <cmath>
#include <memory>
#include <string>
#include <vector>

#include <minigrad/minigrad.h>

namespace nn = mg::nn;
using mg::Shape;
using mg::Tensor;

namespace {

// A module with its own parameter, a frozen parameter, a buffer, and a child
// Sequential: the names of every kind of entry, nested.
class Net : public nn::Cloneable<Net> {
 public:
  Net() : nn::Cloneable<Net>("Net") {
    register_parameter("scale", mg::ones(Shape{2}));
    register_parameter("frozen", mg::full(Shape{2}, 3.0), /*requires_grad=*/false);
    register_buffer("steps", mg::zeros(Shape{1}, mg::DType::Int64));
    layers = register_module("layers", std::make_shared<nn::Sequential>(std::initializer_list<
                                           nn::ModulePtr>{std::make_shared<nn::Linear>(3, 4),
                                                          std::make_shared<nn::ReLU>(),
                                                          std::make_shared<nn::Linear>(4, 2)}));
  }
  Tensor forward(const Tensor& x) override { return layers->forward(x) * parameter("scale"); }

  std::shared_ptr<nn::Sequential> layers;
};

std::vector<std::string> names_of(const std::vector<nn::NamedTensor>& named) {
  std::vector<std::string> out;
  for (const auto& e : named) out.push_back(e.first);
  return out;
}

std::shared_ptr<nn::Sequential> mlp() {
  return std::make_shared<nn::Sequential>(std::initializer_list<nn::ModulePtr>{
      std::make_shared<nn::Linear>(3, 4), std::make_shared<nn::ReLU>(),
      std::make_shared<nn::Linear>(4, 2)});
}

}  // namespace

TEST_CASE("Module: named_parameters gives dotted names in registration order") {
  mg::manual_seed(1);
  Net net;
  CHECK(names_of(net.named_parameters()) ==
        std::vector<std::string>{"scale", "frozen", "layers.0.weight", "layers.0.bias",
                                 "layers.2.weight", "layers.2.bias"});
  CHECK(names_of(net.named_parameters(/*recurse=*/false)) ==
        std::vector<std::string>{"scale", "frozen"});
  CHECK(names_of(net.named_buffers()) == std::vector<std::string>{"steps"});
  CHECK(names_of(net.layers->named_parameters()) ==
        std::vector<std::string>{"0.weight", "0.bias", "2.weight", "2.bias"});

  // parameters() are the very tensors the registry holds, in the same order.
  const auto named = net.named_parameters();
  const auto params = net.parameters();
  REQUIRE(params.size() == named.size());
  for (size_t i = 0; i < params.size(); ++i) CHECK(params[i].is_same(named[i].second));
  CHECK(net.parameter("layers.2.bias").is_same(named[5].second));
  CHECK(net.parameter("layers.0.weight").shape() == Shape{4, 3});
  CHECK_FALSE(net.parameter("frozen").requires_grad());
  CHECK(net.parameter("scale").requires_grad());
}

TEST_CASE("Module: children() and named_modules() walk the tree") {
  Net net;
  const auto children = net.children();
  REQUIRE(children.size() == 1);
  CHECK(children[0].get() == net.layers.get());
  CHECK(net.child("layers").get() == net.layers.get());
  REQUIRE(net.layers->children().size() == 3);
  CHECK(net.layers->children()[1]->type_name() == "ReLU");
  CHECK((*net.layers)[2].get() == net.layers->children()[2].get());

  std::vector<std::string> names;
  for (const auto& [name, m] : net.named_modules()) names.push_back(name + ":" + m->type_name());
  CHECK(names == std::vector<std::string>{":Net", "layers:Sequential", "layers.0:Linear",
                                          "layers.1:ReLU", "layers.2:Linear"});
}

TEST_CASE("Module: registration and lookup errors name the module and the entry") {
  Net net;
  REQUIRE_THROWS_WITH(net.register_parameter("scale", mg::ones(Shape{1})),
                      MG_CONTAINS("Net already has an entry named 'scale'"));
  REQUIRE_THROWS_WITH(net.register_buffer("frozen", mg::ones(Shape{1})),
                      MG_CONTAINS("Net already has an entry named 'frozen'"));
  REQUIRE_THROWS_WITH(net.register_parameter("a.b", mg::ones(Shape{1})),
                      MG_CONTAINS("invalid name 'a.b'"));
  REQUIRE_THROWS_WITH(net.register_module("layers", mlp()),
                      MG_CONTAINS("Net already has a child named 'layers'"));
  REQUIRE_THROWS_WITH(net.parameter("layers.0.gamma"),
                      MG_CONTAINS("Net has no parameter named 'layers.0.gamma'"));
  REQUIRE_THROWS_WITH(net.parameter("encoder.weight"),
                      MG_CONTAINS("Net has no child module named 'encoder'"));
  REQUIRE_THROWS_WITH((*net.layers)[3], MG_CONTAINS("index 3 out of range for 3 modules"));
}

TEST_CASE("Module: train() and eval() reach every descendant") {
  Net net;
  auto all_training = [&](bool expected) {
    bool ok = net.is_training() == expected;
    for (const auto& m : net.layers->children()) ok = ok && m->is_training() == expected;
    return ok && net.layers->is_training() == expected;
  };
  CHECK(all_training(true));
  net.eval();
  CHECK(all_training(false));
  net.train();
  CHECK(all_training(true));
  net.layers->eval();  // a subtree alone
  CHECK(net.is_training());
  CHECK_FALSE(net.layers->children()[0]->is_training());
}

TEST_CASE("Module: to(cpu) on a CPU module keeps the same tensors and gradients") {
  Net net;
  const auto before = net.parameters();
  (net.forward(mg::ones(Shape{2, 3}))).sum().backward();
  const Tensor grad = net.parameter("scale").grad();
  REQUIRE(grad.defined());
  net.to(mg::Device::cpu());
  const auto after = net.parameters();
  for (size_t i = 0; i < after.size(); ++i) {
    CHECK(after[i].is_same(before[i]));
    CHECK(after[i].device() == mg::Device::cpu());
  }
  CHECK(net.parameter("scale").grad().is_same(grad));
}

TEST_CASE("Module: to(dtype) converts every float parameter and buffer in place, as torch's") {
  Net net;
  net.register_buffer("running", mg::full(Shape{3}, 0.1));  // a float buffer converts too
  // A weight tied across two modules (one tensor under two names, as a tied embedding and
  // head): it must stay one tensor.
  auto twin = std::make_shared<nn::Linear>(4, 2);
  twin->set_parameter("weight", net.parameter("layers.2.weight"));
  net.register_module("twin", twin);
  (net.forward(mg::ones(Shape{2, 3}))).sum().backward();
  const std::vector<nn::NamedTensor> before = net.named_parameters();
  std::vector<std::vector<float>> values, grads;
  for (const auto& [name, p] : before) {
    values.push_back(p.to_vector<float>());
    grads.push_back(p.grad().defined() ? p.grad().to_vector<float>() : std::vector<float>{});
  }
  const Tensor steps = net.buffer("steps");

  net.to(mg::DType::Float64);
  const std::vector<nn::NamedTensor> after = net.named_parameters();
  REQUIRE(after.size() == before.size());
  for (size_t i = 0; i < after.size(); ++i) {
    INFO(after[i].first);
    const Tensor& p = after[i].second;
    CHECK(after[i].first == before[i].first);
    CHECK(p.dtype() == mg::DType::Float64);
    CHECK(p.is_leaf());
    CHECK(p.requires_grad() == before[i].second.requires_grad());  // "frozen" stays frozen
    const std::vector<double> v = p.to_vector<double>();
    CHECK(std::vector<double>(values[i].begin(), values[i].end()) == v);  // float32 -> float64 is exact
    if (grads[i].empty()) {
      CHECK(!p.grad().defined());
    } else {
      REQUIRE(p.grad().defined());
      CHECK(p.grad().dtype() == mg::DType::Float64);
      CHECK(std::vector<double>(grads[i].begin(), grads[i].end()) == p.grad().to_vector<double>());
    }
  }
  CHECK(net.buffer("running").dtype() == mg::DType::Float64);
  CHECK(net.buffer("running").to_vector<double>() == std::vector<double>(3, static_cast<double>(0.1f)));
  CHECK(net.buffer("steps").is_same(steps));  // int64 buffers are not floats: untouched
  CHECK(net.parameter("layers.2.weight").is_same(net.parameter("twin.weight")));  // still tied

  // The module computes in float64 now, gradients included.
  net.zero_grad();
  const Tensor out = net.forward(mg::ones(Shape{2, 3}, mg::DType::Float64));
  CHECK(out.dtype() == mg::DType::Float64);
  out.sum().backward();
  CHECK(net.parameter("scale").grad().dtype() == mg::DType::Float64);

  // A second call to the same dtype changes nothing; back to float32 gives the values back.
  const std::vector<Tensor> wide = net.parameters();
  net.to(mg::DType::Float64);
  for (size_t i = 0; i < wide.size(); ++i) CHECK(net.parameters()[i].is_same(wide[i]));
  net.to(mg::DType::Float32);
  CHECK(net.parameter("frozen").to_vector<float>() == values[1]);
  CHECK(net.parameter("scale").dtype() == mg::DType::Float32);

  // torch: "nn.Module.to only accepts floating point or complex dtypes, but got desired
  // dtype=torch.int64"; nothing is converted.
  const std::vector<Tensor> kept = net.parameters();
  REQUIRE_THROWS_WITH(net.to(mg::DType::Int64),
                      MG_CONTAINS("Module::to: only floating-point dtypes (float32, float64, "
                                  "bfloat16, float16) are accepted, got int64"));
  for (size_t i = 0; i < kept.size(); ++i) CHECK(net.parameters()[i].is_same(kept[i]));
}

TEST_CASE("Module: clone() is a deep copy with the same values, requires_grad, and no grads") {
  mg::manual_seed(2);
  Net net;
  net.forward(mg::ones(Shape{2, 3})).sum().backward();
  REQUIRE(net.parameter("layers.0.weight").grad().defined());

  const nn::ModulePtr copy = net.clone();
  CHECK(copy->str() == net.str());
  CHECK(dynamic_cast<Net*>(copy.get()) != nullptr);
  const auto original = net.named_parameters();
  const auto copied = copy->named_parameters();
  REQUIRE(names_of(copied) == names_of(original));
  for (size_t i = 0; i < copied.size(); ++i) {
    INFO(copied[i].first);
    CHECK_FALSE(copied[i].second.is_same(original[i].second));
    CHECK(copied[i].second.to_vector<float>() == original[i].second.to_vector<float>());
    CHECK(copied[i].second.requires_grad() == original[i].second.requires_grad());
    CHECK(copied[i].second.is_leaf());
    CHECK_FALSE(copied[i].second.grad().defined());
  }
  CHECK_FALSE(copy->buffer("steps").is_same(net.buffer("steps")));

  // Writing into the copy leaves the original alone, parameters and buffers alike.
  const auto w_before = net.parameter("layers.0.weight").to_vector<float>();
  {
    mg::NoGradGuard no_grad;
    copy->parameter("layers.0.weight").fill_(7.0);
    copy->buffer("steps").fill_(5.0);
  }
  CHECK(net.parameter("layers.0.weight").to_vector<float>() == w_before);
  CHECK(net.buffer("steps").to_vector<int64_t>() == std::vector<int64_t>{0});

  // The copy's children are copies too: its Sequential is not the original one.
  CHECK(copy->child("layers").get() != net.layers.get());
}

TEST_CASE("Module: shallow_clone() shares the tensors but not the tree") {
  Net net;
  const nn::ModulePtr copy = net.shallow_clone();
  const auto original = net.parameters();
  const auto copied = copy->parameters();
  REQUIRE(copied.size() == original.size());
  for (size_t i = 0; i < copied.size(); ++i) CHECK(copied[i].is_same(original[i]));
  CHECK(copy->child("layers").get() != net.layers.get());

  // Swapping a tensor in the copy (what replicate() does) does not touch the original.
  copy->set_parameter("layers.0.bias", mg::zeros(Shape{4}));
  CHECK(net.parameter("layers.0.bias").is_same(original[3]));
  CHECK_FALSE(copy->parameter("layers.0.bias").is_same(original[3]));
}

// Two modules holding one tensor (the GPT's wte and lm_head): one parameter.
TEST_CASE("Module: a tied parameter is listed once, stays tied through clone, to and set_parameter") {
  auto a = std::make_shared<nn::Linear>(3, 4, /*bias=*/false);
  auto b = std::make_shared<nn::Linear>(3, 4, /*bias=*/false);
  b->set_parameter("weight", a->weight());
  nn::Sequential net{a, b};
  CHECK(names_of(net.named_parameters()) == std::vector<std::string>{"0.weight"});
  CHECK(net.parameters().size() == 1);
  // A copy is tied again: one fresh tensor in both places.
  auto copy = std::static_pointer_cast<nn::Sequential>(net.clone());
  CHECK(copy->parameter("0.weight").is_same(copy->parameter("1.weight")));
  CHECK_FALSE(copy->parameter("0.weight").is_same(a->weight()));
  net.to(mg::Device::cpu());
  CHECK(net.parameter("0.weight").is_same(net.parameter("1.weight")));
  // Replacing the parameter by either name replaces it in both modules.
  const Tensor fresh = mg::zeros(Shape{4, 3}).set_requires_grad(true);
  net.set_parameter("1.weight", fresh);
  CHECK(net.parameter("0.weight").is_same(fresh));
  CHECK(net.parameter("1.weight").is_same(fresh));
}

TEST_CASE("Module: replace_child and remove_child by dotted name, errors naming the path") {
  Net net;
  auto replacement = std::make_shared<nn::Linear>(3, 4);
  net.replace_child("layers.0", replacement);
  CHECK(net.child("layers")->child("0") == replacement);
  CHECK(net.named_parameters()[2].second.is_same(replacement->weight()));  // same place, same name
  CHECK(names_of(net.named_parameters())[2] == "layers.0.weight");
  net.remove_child("layers.1");
  CHECK_FALSE(net.child("layers")->has_child("1"));
  CHECK(net.child("layers")->has_child("2"));
  REQUIRE_THROWS_WITH(net.replace_child("layers.7", replacement),
                      MG_CONTAINS("replace_child: Net has no child module named 'layers.7'"));
  REQUIRE_THROWS_WITH(net.replace_child("layers.0", nullptr),
                      MG_CONTAINS("replace_child: the module for 'layers.0' in Net is null"));
  REQUIRE_THROWS_WITH(net.remove_child("nothing"), MG_CONTAINS("remove_child: Net has no child module named 'nothing'"));
}

TEST_CASE("Module: zero_grad clears gradients or fills them with zeros") {
  Net net;
  net.forward(mg::ones(Shape{2, 3})).sum().backward();
  const Tensor g = net.parameter("layers.0.weight").grad();
  REQUIRE(g.defined());

  net.zero_grad(/*set_to_none=*/false);
  CHECK(net.parameter("layers.0.weight").grad().is_same(g));
  CHECK(g.to_vector<float>() == std::vector<float>(12, 0.0f));

  net.zero_grad();
  for (const Tensor& p : net.parameters()) CHECK_FALSE(p.grad().defined());
}

TEST_CASE("Linear: weights and bias are uniform in +-1/sqrt(in_features), as in PyTorch") {
  mg::manual_seed(3);
  nn::Linear linear(50, 30);
  const double bound = 1.0 / std::sqrt(50.0);
  for (const char* name : {"weight", "bias"}) {
    INFO(name);
    const auto v = linear.parameter(name).to_vector<float>();
    float lo = v[0], hi = v[0];
    for (float x : v) {
      CHECK(std::abs(x) <= bound);
      lo = std::min(lo, x);
      hi = std::max(hi, x);
    }
    // Spread over the interval, not a constant (30 draws miss the top 20% with p = 1e-3).
    CHECK(lo < -0.8 * bound);
    CHECK(hi > 0.8 * bound);
  }
  CHECK(linear.weight().shape() == Shape{30, 50});
  CHECK(linear.bias().shape() == Shape{30});
  CHECK(linear.weight().requires_grad());

  nn::Linear no_bias(4, 2, /*bias=*/false);
  CHECK(no_bias.named_parameters().size() == 1);
  REQUIRE_THROWS_WITH(no_bias.bias(), MG_CONTAINS("no parameter named 'bias'"));
  REQUIRE_THROWS_WITH(nn::Linear(0, 3), MG_CONTAINS("must be positive, got 0 and 3"));
}

TEST_CASE("Linear: forward is x @ W^T + b") {
  mg::manual_seed(4);
  nn::Linear linear(3, 2);
  const Tensor x = mg::randn(Shape{4, 3});
  const auto y = linear.forward(x).to_vector<float>();
  const auto xv = x.to_vector<float>();
  const auto w = linear.weight().to_vector<float>();
  const auto b = linear.bias().to_vector<float>();
  REQUIRE(y.size() == 8);
  for (int i = 0; i < 4; ++i)
    for (int j = 0; j < 2; ++j) {
      double expected = b[static_cast<size_t>(j)];
      for (int k = 0; k < 3; ++k) expected += double(xv[size_t(i * 3 + k)]) * w[size_t(j * 3 + k)];
      CHECK(y[static_cast<size_t>(i * 2 + j)] == Approx(expected).margin(1e-6));
    }
  REQUIRE_THROWS_WITH(linear.forward(mg::ones(Shape{4, 5})), MG_CONTAINS("input of shape [4, 5] has 5 features"));
}

TEST_CASE("Linear: gradients of W, b and x agree with finite differences") {
  // loss = sum(relu(linear1(x)) @ linear2 weights * r): nonlinear in every input.
  mg::manual_seed(5);
  auto model = mlp();
  Tensor x = mg::randn(Shape{5, 3}).set_requires_grad(true);
  const Tensor r = mg::randn(Shape{5, 2});
  auto loss_value = [&]() {
    mg::NoGradGuard no_grad;
    return double((model->forward(x) * r).sum().item<float>());
  };
  (model->forward(x) * r).sum().backward();

  std::vector<std::pair<std::string, Tensor>> checked = model->named_parameters();
  checked.emplace_back("x", x);
  const float eps = 1e-2f;
  for (auto& [name, t] : checked) {
    const auto analytic = t.grad().to_vector<float>();
    float* values = t.data<float>();
    for (int64_t i = 0; i < t.numel(); ++i) {
      const float saved = values[i];
      values[i] = saved + eps;
      const double plus = loss_value();
      values[i] = saved - eps;
      const double minus = loss_value();
      values[i] = saved;
      INFO(name << "[" << i << "]");
      CHECK(analytic[static_cast<size_t>(i)] == Approx((plus - minus) / (2 * eps)).margin(2e-3));
    }
  }
}

TEST_CASE("Sequential: forward chains the children, push_back numbers them") {
  mg::manual_seed(6);
  auto seq = mlp();
  const Tensor x = mg::randn(Shape{3, 3});
  auto first = std::static_pointer_cast<nn::Linear>((*seq)[0]);
  auto last = std::static_pointer_cast<nn::Linear>((*seq)[2]);
  const Tensor expected = last->forward(mg::relu(first->forward(x)));
  CHECK(seq->forward(x).to_vector<float>() == expected.to_vector<float>());
  CHECK((*seq)(x).shape() == Shape{3, 2});

  nn::Sequential built;
  built.push_back(std::make_shared<nn::Linear>(2, 2));
  built.push_back(std::make_shared<nn::ReLU>());
  CHECK(names_of(built.named_parameters()) == std::vector<std::string>{"0.weight", "0.bias"});
  CHECK(built.size() == 2);
}

TEST_CASE("Module: str() prints the tree as PyTorch does") {
  auto seq = std::make_shared<nn::Sequential>(std::initializer_list<nn::ModulePtr>{
      std::make_shared<nn::Linear>(784, 128), std::make_shared<nn::ReLU>(),
      std::make_shared<nn::Linear>(128, 10, /*bias=*/false)});
  CHECK(seq->str() ==
        "Sequential(\n"
        "  (0): Linear(in_features=784, out_features=128, bias=True)\n"
        "  (1): ReLU()\n"
        "  (2): Linear(in_features=128, out_features=10, bias=False)\n"
        ")");
  Net net;
  CHECK(net.str() ==
        "Net(\n"
        "  (layers): Sequential(\n"
        "    (0): Linear(in_features=3, out_features=4, bias=True)\n"
        "    (1): ReLU()\n"
        "    (2): Linear(in_features=4, out_features=2, bias=True)\n"
        "  )\n"
        ")");
  CHECK(nn::ReLU().str() == "ReLU()");
}

TEST_CASE("CrossEntropyLoss: mean of logsumexp - logit[target], gradient (softmax - onehot)/N") {
  const std::vector<float> logits_v{1.0f, 2.0f, 0.5f, -1.0f, 0.0f, 3.0f};
  const std::vector<int64_t> targets_v{1, 0};
  Tensor logits = mg::from_vector(logits_v, Shape{2, 3}).set_requires_grad(true);
  const Tensor targets = mg::from_vector(targets_v, Shape{2});
  nn::CrossEntropyLoss criterion;
  const Tensor loss = criterion(logits, targets);
  CHECK(loss.dim() == 0);

  double expected = 0;
  std::vector<double> grad(6);
  for (size_t i = 0; i < 2; ++i) {
    double z = 0;
    for (size_t j = 0; j < 3; ++j) z += std::exp(double(logits_v[i * 3 + j]));
    expected += std::log(z) - logits_v[i * 3 + size_t(targets_v[i])];
    for (size_t j = 0; j < 3; ++j)
      grad[i * 3 + j] =
          (std::exp(double(logits_v[i * 3 + j])) / z - (int64_t(j) == targets_v[i] ? 1 : 0)) / 2;
  }
  CHECK(loss.item<float>() == Approx(expected / 2).epsilon(1e-6));
  loss.backward();
  const auto g = logits.grad().to_vector<float>();
  for (size_t k = 0; k < 6; ++k) CHECK(g[k] == Approx(grad[k]).margin(1e-6));

  REQUIRE_THROWS_WITH(criterion(logits, mg::from_vector(std::vector<int64_t>{0, 3}, Shape{2})),
                      MG_CONTAINS("target 3 at row 1 is out of range for 3 classes"));
  REQUIRE_THROWS_WITH(criterion(logits, mg::from_vector(std::vector<int64_t>{0}, Shape{1})),
                      MG_CONTAINS("targets of shape [1] do not match logits of shape [2, 3]"));
}
