// Version counters (PyTorch's t._version) and the in-place check of backward: every
// in-place write bumps the counter that all views of the memory share, every tensor a
// backward needs is saved with its version (autograd/saved_tensor.h), and backward
// refuses one that was rewritten since — instead of the silently wrong gradient it
// computed before (w*w with w.mul_(5) under a NoGradGuard gave 10, not 2).
#include "catch_compat.h"

#include <filesystem>
#include <fstream>
#include <functional>
#include <limits>
#include <regex>
#include <sstream>
#include <string>
#include <vector>

#include <minigrad/autograd/functions.h>
#include <minigrad/autograd/grad_mode.h>
#include <minigrad/autograd/version_counter.h>
#include <minigrad/core/ops.h>
#include <minigrad/core/tensor.h>
#include <minigrad/nn/layers.h>
#include <minigrad/nn/optim/sgd.h>
#include <minigrad/parallel/c10d/process_group.h>

using namespace mg;

namespace {

constexpr const char* kModified =
    "one of the tensors needed for gradient computation has been modified by an in-place "
    "operation";

Tensor leaf(std::vector<float> values, const Shape& shape) {
  return from_vector(std::move(values), shape).set_requires_grad(true);
}

}  // namespace

TEST_CASE("version counter: w*w, then w.mul_(5) under no_grad, then backward throws instead of grad 10") {
  Tensor w = ones({3}).set_requires_grad(true);
  Tensor y = (w * w).sum();
  {
    NoGradGuard g;
    w.mul_(5);
  }
  REQUIRE_THROWS_AS(y.backward(), Error);
  Tensor w2 = ones({3}).set_requires_grad(true);
  Tensor y2 = (w2 * w2).sum();
  {
    NoGradGuard g;
    w2.mul_(5);
  }
  REQUIRE_THROWS_WITH(y2.backward(),
                      MG_CONTAINS(std::string(kModified) + ": mul_, version 1, expected 0") &&
                          MG_CONTAINS("MulBackward") && MG_CONTAINS("shape [3]") &&
                          MG_CONTAINS("float32 on cpu"));
  // No gradient was written from the stale values.
  CHECK_FALSE(w2.grad().defined());
}

TEST_CASE("version counter: every in-place op bumps it by one, views and detach() share it") {
  Tensor t = zeros({2, 3});
  CHECK(t.version() == 0);
  const Tensor view = t.narrow(1, 1, 2);
  const Tensor alias = t.detach();
  const Tensor reshaped = t.reshape({6});
  NoGradGuard no_grad;
  uint64_t expected = 0;
  const std::vector<std::pair<std::string, std::function<void()>>> writes = {
      {"copy_", [&] { t.copy_(ones({2, 3})); }},
      {"fill_", [&] { t.fill_(2.0); }},
      {"zero_", [&] { t.zero_(); }},
      {"add_", [&] { t.add_(ones({3})); }},
      {"mul_ scalar", [&] { t.mul_(3.0); }},
      {"mul_ tensor", [&] { t.mul_(ones({2, 3})); }},
      {"uniform_", [&] { t.uniform_(0.0, 1.0); }},
      {"normal_", [&] { t.normal_(); }},
      {"ops::copy_", [&] { ops::copy_(t, zeros({3})); }},
      {"fill_ of a strided view", [&] { Tensor v = t.t(); v.fill_(1.0); }},
      {"an empty narrow", [&] { Tensor v = t.narrow(0, 2, 0); v.fill_(1.0); }},
  };
  for (const auto& [name, write] : writes) {
    CAPTURE(name);
    write();
    ++expected;
    CHECK(t.version() == expected);
    CHECK(view.version() == expected);
    CHECK(alias.version() == expected);
    CHECK(reshaped.version() == expected);
  }
  // A write through a view is a write to the base.
  Tensor v = t.narrow(0, 0, 1);
  v.fill_(7.0);
  CHECK(t.version() == expected + 1);
  // Out-of-place ops leave the inputs' counters alone; a clone counts on its own.
  const Tensor sum = t + t;
  Tensor copy = ops::clone(t);
  const uint64_t copy_version = copy.version();
  CHECK(t.version() == expected + 1);
  copy.mul_(2.0);
  CHECK(copy.version() == copy_version + 1);
  CHECK(t.version() == expected + 1);
  (void)sum;
}

// Each op that saves tensors for backward, with a way to rewrite each saved tensor
// after forward. Every row must make backward throw, naming the node.
TEST_CASE("version counter: every op that saves a tensor checks it in backward") {
  struct Case {
    std::string name;  // the node that must complain
    std::function<Tensor(const Tensor& a, const Tensor& b)> forward;
    bool rewrite_output;  // the saved tensor is the op's output, not an input
  };
  const std::vector<Case> cases = {
      {"MulBackward", [](const Tensor& a, const Tensor& b) { return a * b; }, false},
      {"DivBackward", [](const Tensor& a, const Tensor& b) { return a / (b + 3.0); }, false},
      {"MatmulBackward", [](const Tensor& a, const Tensor& b) { return matmul(a, b.t()); }, false},
      {"LinearBackward", [](const Tensor& a, const Tensor& b) { return linear(a, b, b.sum({0})); },
       false},
      {"LogBackward", [](const Tensor& a, const Tensor&) { return log(a); }, false},
      {"ExpBackward", [](const Tensor& a, const Tensor&) { return exp(a); }, true},
      {"ReluBackward", [](const Tensor& a, const Tensor&) { return relu(a); }, true},
      {"ReluBackward",
       [](const Tensor& a, const Tensor& b) { return linear_relu(a, b, b.sum({0})); }, true},
      {"LogSoftmaxBackward", [](const Tensor& a, const Tensor&) { return log_softmax(a); }, true},
      {"CrossEntropyBackward",
       [](const Tensor& a, const Tensor&) {
         return cross_entropy(a, from_vector(std::vector<int64_t>{1, 0}, {2}));
       },
       false},
  };
  for (const Case& c : cases) {
    CAPTURE(c.name, c.rewrite_output);
    Tensor a = leaf({0.5f, 1.5f, 2.0f, 0.25f}, {2, 2});
    Tensor b = leaf({1.0f, 2.0f, 3.0f, 4.0f}, {2, 2});
    Tensor out = c.forward(a, b);
    {
      NoGradGuard no_grad;
      if (c.rewrite_output) {
        Tensor(out).add_(ones_like(out));
      } else {
        a.add_(ones_like(a));
      }
    }
    REQUIRE_THROWS_WITH(out.sum().backward(),
                        MG_CONTAINS(c.name + ": " + kModified) && MG_CONTAINS("version 1, expected 0"));
  }
  // The saved targets of cross_entropy are checked too.
  Tensor logits = leaf({0.1f, 0.2f, 0.3f, 0.4f}, {2, 2});
  Tensor targets = from_vector(std::vector<int64_t>{1, 0}, {2});
  Tensor loss = cross_entropy(logits, targets);
  targets.fill_(0.0);  // targets do not require grad: allowed in grad mode
  REQUIRE_THROWS_WITH(loss.backward(), MG_CONTAINS("CrossEntropyBackward") &&
                                           MG_CONTAINS("fill_") && MG_CONTAINS("int64"));
}

TEST_CASE("version counter: a rewrite of memory backward does not need is no error (as PyTorch)") {
  // y = w * x with only w requiring grad: MulBackward needs x for dw, never w itself.
  Tensor w = leaf({1.0f, 2.0f}, {2});
  const Tensor x = from_vector(std::vector<float>{3.0f, 4.0f}, {2});
  Tensor y = (w * x).sum();
  {
    NoGradGuard no_grad;
    w.mul_(10.0);
  }
  y.backward();
  CHECK(w.grad().to_vector<float>() == std::vector<float>{3.0f, 4.0f});
  // A write through a view of a tensor the graph needs is caught.
  Tensor w2 = leaf({1.0f, 2.0f, 3.0f}, {3});
  Tensor z = (w2 * w2).sum();
  {
    NoGradGuard no_grad;
    w2.narrow(0, 1, 1).fill_(0.0);
  }
  REQUIRE_THROWS_WITH(z.backward(), MG_CONTAINS("fill_, version 1, expected 0"));
}

TEST_CASE("version counter: an optimizer step between two backwards of a retained graph throws") {
  nn::Linear layer(3, 2);
  optim::SGD sgd(layer.parameters(), optim::SGDOptions(0.1));
  // x requires grad, as the activations of a deeper net do: dx needs the weight.
  Tensor x =
      from_vector(std::vector<float>{1.0f, 2.0f, 3.0f, -1.0f, 0.5f, 0.0f}, {2, 3}).set_requires_grad(true);
  Tensor loss = layer.forward(x).sum();
  loss.backward(Tensor(), /*retain_graph=*/true);
  const uint64_t before = layer.weight().version();
  sgd.step();  // the fused Backend::sgd_step writes the parameters
  CHECK(layer.weight().version() == before + 1);
  // (The weight was at version `before` when forward saved it: initialisation wrote it.)
  REQUIRE_THROWS_WITH(loss.backward(),
                      MG_CONTAINS("LinearBackward") &&
                          MG_CONTAINS(fmt::format("SGD::step, version {}, expected {}", before + 1,
                                                  before)));
  // The ordinary loop (forward, backward, step) never sees the error.
  for (int i = 0; i < 3; ++i) {
    sgd.zero_grad();
    layer.forward(x).sum().backward();
    sgd.step();
  }
}

TEST_CASE("version counter: gradient accumulation, zero_grad and collectives bump it") {
  Tensor w = leaf({1.0f, 2.0f}, {2});
  (w * 2.0).sum().backward();
  const Tensor g = w.grad();
  const uint64_t first = g.version();
  (w * 3.0).sum().backward();  // accumulated in place: grad += 3
  CHECK(g.version() == first + 1);
  CHECK(g.to_vector<float>() == std::vector<float>{5.0f, 5.0f});
  nn::Linear layer(2, 2);
  layer.forward(ones({1, 2})).sum().backward();
  const Tensor wg = layer.weight().grad();
  const uint64_t before = wg.version();
  layer.zero_grad(/*set_to_none=*/false);
  CHECK(wg.version() == before + 1);
  // A collective is about to rewrite its tensors in place: their versions move at once.
  Tensor bucket = ones({4});
  const Tensor view = bucket.narrow(0, 1, 2);
  const parallel::CoalescedBuffer buffer({view}, "allreduce");
  CHECK(bucket.version() == 1);
  // One that only reads them (a send of activations a graph still needs) leaves them be.
  const parallel::CoalescedBuffer sent({view, bucket}, /*writes_as=*/nullptr);
  CHECK(bucket.version() == 1);
}

TEST_CASE("UnsafePreserveVersionCounter: a rewrite that restores the saved values keeps the graph") {
  // What FSDP does: forward used the parameter, its memory is freed (here: zeroed) and
  // gathered back before backward. With the guard the graph accepts it, and the
  // gradient is the one of the untouched run.
  const std::vector<float> values{0.5f, -1.0f, 2.0f};
  Tensor w = leaf(values, {3});
  const Tensor x = from_vector(std::vector<float>{1.0f, 2.0f, 3.0f}, {3});
  Tensor y = (w * w * x).sum();
  const uint64_t before = w.version();
  {
    autograd::UnsafePreserveVersionCounter keep(w);
    NoGradGuard no_grad;
    w.zero_();                                    // "resharded": the memory is reused
    w.copy_(from_vector(values, {3}));            // "all-gathered" back
  }
  CHECK(w.version() == before);
  y.backward();
  // d/dw sum(w^2 x) = 2 w x
  CHECK(w.grad().to_vector<float>() == std::vector<float>{1.0f, -4.0f, 12.0f});

  // Without the guard the same rewrite is refused.
  Tensor w2 = leaf(values, {3});
  Tensor y2 = (w2 * w2 * x).sum();
  {
    NoGradGuard no_grad;
    w2.zero_();
    w2.copy_(from_vector(values, {3}));
  }
  REQUIRE_THROWS_WITH(y2.backward(), MG_CONTAINS("copy_, version 2, expected 0"));

  // Several tensors, one storage among them twice: each ends where it started.
  Tensor a = zeros({4});
  Tensor b = zeros({2});
  {
    NoGradGuard no_grad;
    b.fill_(1.0);
  }
  {
    autograd::UnsafePreserveVersionCounter keep({a, a.narrow(0, 0, 2), b, Tensor()});
    NoGradGuard no_grad;
    a.fill_(3.0);
    b.fill_(3.0);
    a.narrow(0, 1, 1).fill_(4.0);
  }
  CHECK(a.version() == 0);
  CHECK(b.version() == 1);
}

TEST_CASE("version counter: backward closures capture tensors only as SavedTensor") {
  // A closure that captured `x = x.detach()` (how every backward saved tensors before)
  // would skip the version check. Each capture list before a BackwardArgs parameter in
  // autograd/functions/ is read, and none may call detach().
  const std::filesystem::path dir =
      std::filesystem::path(MINIGRAD_SOURCE_DIR) / "minigrad" / "autograd" / "functions";
  const std::regex capture(R"(\[([^\[\]]*)\]\s*\(\s*const BackwardArgs)");
  int closures = 0;
  for (const auto& entry : std::filesystem::directory_iterator(dir)) {
    std::ifstream in(entry.path());
    std::stringstream text;
    text << in.rdbuf();
    const std::string source = text.str();
    for (auto it = std::sregex_iterator(source.begin(), source.end(), capture);
         it != std::sregex_iterator(); ++it) {
      ++closures;
      INFO(entry.path().filename().string() << ": [" << (*it)[1].str() << "]");
      CHECK((*it)[1].str().find("detach()") == std::string::npos);
    }
  }
  CHECK(closures >= 20);  // the scan found the closures it is meant to check
}
