// The backward engine and autograd state: accumulation, retain_graph, detach, grad mode,
// graph shapes (diamonds, broadcasts, several roots), hooks and the errors users meet.
#include "catch_compat.h"

#include <atomic>
#include <thread>

#include <minigrad/autograd/engine.h>
#include <minigrad/autograd/functions.h>
#include <minigrad/autograd/grad_mode.h>
#include <minigrad/autograd/node.h>

using namespace mg;

namespace {
Tensor leaf(const std::vector<float>& values, const Shape& shape) {
  return from_vector(values, shape).set_requires_grad(true);
}
std::vector<float> grad_of(const Tensor& t) {
  REQUIRE(t.grad().defined());
  return t.grad().to_vector<float>();
}
}  // namespace

TEST_CASE("gradients accumulate across backward calls until zeroed") {
  Tensor w = leaf({1, 2, 3}, {3});
  (w * w).sum().backward();
  CHECK(grad_of(w) == std::vector<float>{2, 4, 6});
  // A second, independent graph: its gradient is added, not assigned (zero each step).
  (w * 3.0).sum().backward();
  CHECK(grad_of(w) == std::vector<float>{5, 7, 9});
  {
    NoGradGuard no_grad;
    w.grad().zero_();
  }
  (w * 3.0).sum().backward();
  CHECK(grad_of(w) == std::vector<float>{3, 3, 3});
}

TEST_CASE("a gradient kept from the first backward is not changed behind its back") {
  // The engine may hand its buffer to grad(); a tensor the user still holds must not be
  // that buffer, or the next accumulation would change it.
  Tensor w = leaf({1, 2}, {2});
  const Tensor seed = from_vector(std::vector<float>{1, 1}, {2});
  (w * 1.0).backward(seed);
  (w * 1.0).backward(seed);
  CHECK(grad_of(w) == std::vector<float>{2, 2});
  CHECK(seed.to_vector<float>() == std::vector<float>{1, 1});
}

TEST_CASE("retain_graph allows a second backward and without it the second backward throws") {
  Tensor x = leaf({0.5f, -1.0f, 2.0f}, {3});
  Tensor loss = (x.exp() * x).sum();
  loss.backward(Tensor(), /*retain_graph=*/true);
  const std::vector<float> once = grad_of(x);
  loss.backward();  // allowed, frees the graph
  const std::vector<float> twice = grad_of(x);
  for (size_t i = 0; i < once.size(); ++i) CHECK(twice[i] == Approx(2 * once[i]));

  REQUIRE_THROWS_AS(loss.backward(), Error);
  REQUIRE_THROWS_WITH(loss.backward(),
                      MG_CONTAINS("second time") && MG_CONTAINS("retain_graph=true"));
  // The message names the node whose saved tensors are gone.
  REQUIRE_THROWS_WITH(loss.backward(), MG_CONTAINS("Backward"));
}

TEST_CASE("detach shares storage but cuts the graph") {
  Tensor x = leaf({1, 2, 3}, {3});
  Tensor y = x * 2.0;
  Tensor d = y.detach();
  CHECK(d.storage().is_alias_of(y.storage()));
  CHECK_FALSE(d.requires_grad());
  CHECK(d.is_leaf());
  CHECK(d.grad_fn() == nullptr);
  // Gradient flows only through the attached path.
  Tensor loss = (y * d).sum();  // d/dx = 2 * d = 4x
  loss.backward();
  CHECK(grad_of(x) == std::vector<float>{4, 8, 12});
  // A detached tensor alone cannot start a backward.
  REQUIRE_THROWS_WITH(d.sum().backward(), MG_CONTAINS("does not require grad"));
}

TEST_CASE("NoGradGuard records no graph and restores the previous mode") {
  Tensor x = leaf({1, 2}, {2});
  CHECK(GradMode::is_enabled());
  {
    NoGradGuard no_grad;
    CHECK_FALSE(GradMode::is_enabled());
    Tensor y = x * 2.0;
    CHECK_FALSE(y.requires_grad());
    CHECK(y.grad_fn() == nullptr);
    {
      AutoGradMode enable(true);
      CHECK((x * 2.0).requires_grad());
    }
    CHECK_FALSE(GradMode::is_enabled());
  }
  CHECK(GradMode::is_enabled());
  CHECK((x * 2.0).requires_grad());
}

TEST_CASE("grad mode is thread-local") {
  Tensor x = leaf({1, 2}, {2});
  NoGradGuard no_grad;  // off on this thread only
  std::atomic<bool> enabled_there{false}, recorded_there{false};
  std::thread worker([&] {
    enabled_there = GradMode::is_enabled();
    recorded_there = (x * 2.0).requires_grad();
  });
  worker.join();
  CHECK(enabled_there);
  CHECK(recorded_there);
  CHECK_FALSE(GradMode::is_enabled());
  CHECK_FALSE((x * 2.0).requires_grad());

  // And the other way round: a guard on a worker leaves this thread alone.
  AutoGradMode on(true);
  std::thread guarded([] { NoGradGuard inner; });
  guarded.join();
  CHECK(GradMode::is_enabled());
}

TEST_CASE("a tensor used on several paths gets the sum of their gradients") {
  // Diamond: x -> a = 2x, b = x*x -> a*b. d/dx (2x * x^2) = 6x^2.
  Tensor x = leaf({1, -2, 0.5f}, {3});
  Tensor a = x * 2.0, b = x * x;
  (a * b).sum().backward();
  const std::vector<float> g = grad_of(x);
  CHECK(g[0] == Approx(6.0f));
  CHECK(g[1] == Approx(24.0f));
  CHECK(g[2] == Approx(1.5f));

  // x + x: both inputs of one node are the same leaf.
  Tensor y = leaf({1, 2}, {2});
  (y + y).sum().backward();
  CHECK(grad_of(y) == std::vector<float>{2, 2});

  // Two different leaves fed the same gradient buffer (add's backward passes it through).
  Tensor p = leaf({1, 2}, {2}), q = leaf({3, 4}, {2});
  (p + q).sum().backward();
  CHECK(grad_of(p) == std::vector<float>{1, 1});
  CHECK(grad_of(q) == std::vector<float>{1, 1});
  (p * 2.0).sum().backward();  // accumulating into p must not touch q's gradient
  CHECK(grad_of(p) == std::vector<float>{3, 3});
  CHECK(grad_of(q) == std::vector<float>{1, 1});
}

TEST_CASE("gradients of broadcast inputs are summed back to their shapes") {
  Tensor col = leaf({1, 2, 3}, {3, 1});
  Tensor row = leaf({10, 20, 30, 40}, {1, 4});
  Tensor s = leaf({5}, Shape{});
  Tensor out = (col * row + s).sum();
  out.backward();
  REQUIRE(col.grad().shape() == Shape{3, 1});
  REQUIRE(row.grad().shape() == Shape{1, 4});
  REQUIRE(s.grad().shape() == Shape{});
  CHECK(grad_of(col) == std::vector<float>{100, 100, 100});  // sum of row
  CHECK(grad_of(row) == std::vector<float>{6, 6, 6, 6});     // sum of col
  CHECK(grad_of(s) == std::vector<float>{12});               // 3 x 4 elements

  Tensor v = leaf({1, 2, 3, 4, 5}, {5});
  Tensor m = from_vector(std::vector<float>{1, 1, 1, 1, 1, 2, 2, 2, 2, 2}, {2, 5});
  (v * m).sum().backward();
  REQUIRE(v.grad().shape() == Shape{5});
  CHECK(grad_of(v) == std::vector<float>{3, 3, 3, 3, 3});
}

TEST_CASE("post-accumulate-grad hooks fire after the gradient is in grad()") {
  Tensor w = leaf({1, 2, 3}, {3});
  int calls = 0;
  std::vector<float> seen;
  w.register_post_accumulate_grad_hook([&](Tensor& t) {
    ++calls;
    seen = t.grad().to_vector<float>();
  });
  (w * w).sum().backward();
  CHECK(calls == 1);
  CHECK(seen == std::vector<float>{2, 4, 6});
  // Used twice in one graph: the engine sums first, so the hook still fires once.
  (w + w).sum().backward();
  CHECK(calls == 2);
  CHECK(seen == std::vector<float>{4, 6, 8});

  // Only leaves that require grad accumulate.
  Tensor y = w * 2.0;
  REQUIRE_THROWS_WITH(y.register_post_accumulate_grad_hook([](Tensor&) {}), MG_CONTAINS("leaf"));
}

TEST_CASE("hooks fire in reverse order of use, parameters of the last layer first") {
  Tensor w1 = leaf({1, 2}, {2}), w2 = leaf({3, 4}, {2});
  std::vector<int> order;
  w1.register_post_accumulate_grad_hook([&](Tensor&) { order.push_back(1); });
  w2.register_post_accumulate_grad_hook([&](Tensor&) { order.push_back(2); });
  Tensor h = (w1 * 2.0).exp();
  ((h * w2).sum()).backward();
  CHECK(order == std::vector<int>{2, 1});
}

TEST_CASE("backward on a non-scalar needs an explicit gradient") {
  Tensor x = leaf({1, 2, 3, 4, 5, 6}, {2, 3});
  Tensor y = x * 2.0;
  REQUIRE_THROWS_AS(y.backward(), Error);
  REQUIRE_THROWS_WITH(y.backward(), MG_CONTAINS("scalar") && MG_CONTAINS("[2, 3]"));
  // With a gradient of the right shape it runs: a vector-Jacobian product.
  y.backward(from_vector(std::vector<float>{1, 0, 1, 0, 1, 0}, {2, 3}));
  CHECK(grad_of(x) == std::vector<float>{2, 0, 2, 0, 2, 0});
  // A gradient of the wrong shape names both shapes.
  Tensor z = x * 2.0;
  REQUIRE_THROWS_WITH(z.backward(ones({3, 2})), MG_CONTAINS("[3, 2]") && MG_CONTAINS("[2, 3]"));
  // So does a gradient of another dtype (it would be read as floats).
  REQUIRE_THROWS_WITH(z.backward(from_vector(std::vector<int64_t>{1, 1, 1, 1, 1, 1}, {2, 3})),
                      MG_CONTAINS("int64") && MG_CONTAINS("float32"));
  // A one-element tensor of any rank counts as a scalar, as in PyTorch.
  Tensor one = leaf({3}, {1, 1});
  (one * one).backward();
  CHECK(grad_of(one) == std::vector<float>{6});
}

TEST_CASE("requires_grad only on float32, and only turned off on leaves") {
  Tensor labels = from_vector(std::vector<int64_t>{1, 2}, {2});
  REQUIRE_THROWS_AS(labels.set_requires_grad(true), Error);
  REQUIRE_THROWS_WITH(labels.set_requires_grad(true),
                      MG_CONTAINS("float32") && MG_CONTAINS("int64"));
  labels.set_requires_grad(false);  // fine: it never required grad

  Tensor y = leaf({1}, {1}) * 2.0;
  REQUIRE_THROWS_WITH(y.set_requires_grad(false), MG_CONTAINS("non-leaf") && MG_CONTAINS("detach"));
}

TEST_CASE("in-place ops on a leaf that requires grad are refused in grad mode") {
  Tensor w = leaf({1, 2, 3}, {3});
  const Tensor other = ones({3});
  REQUIRE_THROWS_WITH(w.add_(other), MG_CONTAINS("add_") && MG_CONTAINS("NoGradGuard"));
  REQUIRE_THROWS_WITH(w.mul_(2.0), MG_CONTAINS("mul_") && MG_CONTAINS("[3]"));
  REQUIRE_THROWS_WITH(w.mul_(other), MG_CONTAINS("mul_"));
  REQUIRE_THROWS_WITH(w.copy_(other), MG_CONTAINS("copy_"));
  REQUIRE_THROWS_WITH(w.fill_(0.0), MG_CONTAINS("fill_"));
  REQUIRE_THROWS_WITH(w.zero_(), MG_CONTAINS("fill_"));
  REQUIRE_THROWS_WITH(w.uniform_(0, 1), MG_CONTAINS("uniform_"));
  REQUIRE_THROWS_WITH(w.normal_(), MG_CONTAINS("normal_"));
  CHECK(w.to_vector<float>() == std::vector<float>{1, 2, 3});  // untouched
  // Under NoGradGuard they are what an optimizer step uses.
  NoGradGuard no_grad;
  w.add_(other, -0.5);
  CHECK(w.to_vector<float>() == std::vector<float>{0.5f, 1.5f, 2.5f});
  w.mul_(2.0);
  CHECK(w.to_vector<float>() == std::vector<float>{1, 3, 5});
}

TEST_CASE("the graph: grad_fn, leaves, names and requires_grad propagation") {
  Tensor x = leaf({1, 2}, {2});
  Tensor c = ones({2});
  CHECK(x.is_leaf());
  CHECK(x.grad_fn() == nullptr);
  Tensor y = x * c;
  CHECK_FALSE(y.is_leaf());
  REQUIRE(y.grad_fn() != nullptr);
  CHECK(y.grad_fn()->name() == "MulBackward");
  CHECK(y.requires_grad());
  // An op on constants only makes a constant.
  Tensor k = c * c;
  CHECK_FALSE(k.requires_grad());
  CHECK(k.grad_fn() == nullptr);
  // The constant input's edge is empty; x's leads to its accumulator.
  const auto& edges = y.grad_fn()->next_edges();
  REQUIRE(edges.size() == 2);
  CHECK(edges[0].valid());
  CHECK(edges[0].function->name() == "AccumulateGrad");
  CHECK_FALSE(edges[1].valid());
  // The same accumulator is shared by every graph that uses x.
  Tensor z = x.exp();
  CHECK(z.grad_fn()->next_edges()[0].function == edges[0].function);
  // Constants get no gradient.
  y.sum().backward();
  CHECK_FALSE(c.grad().defined());
}

TEST_CASE("backward from several roots at once") {
  Tensor x = leaf({1, 2}, {2});
  Tensor a = (x * 2.0).sum(), b = (x * x).sum();
  run_backward({a, b}, {ones(Shape{}), full(Shape{}, 10.0)}, false);
  CHECK(grad_of(x) == std::vector<float>{2 + 10 * 2, 2 + 10 * 4});
}

TEST_CASE("backward on a leaf itself, and through a branch that is not used") {
  Tensor x = leaf({1, 2}, {2});
  x.backward(from_vector(std::vector<float>{3, 4}, {2}));
  CHECK(grad_of(x) == std::vector<float>{3, 4});

  // chunk makes two outputs of one node; only the first reaches the loss: the second's
  // gradient is zero-filled, not missing.
  Tensor y = leaf({1, 2, 3, 4}, {4});
  std::vector<Tensor> halves = chunk(y, 2);
  (halves[0] * 5.0).sum().backward();
  CHECK(grad_of(y) == std::vector<float>{5, 5, 0, 0});
}

TEST_CASE("gradients flow through views into the base leaf") {
  Tensor x = leaf({1, 2, 3, 4, 5, 6}, {2, 3});
  // Sum of a transposed narrow, times a reshaped copy.
  Tensor loss = (x.t().narrow(0, 1, 2).sum() + (x.reshape({3, 2}) * 2.0).sum());
  loss.backward();
  CHECK(grad_of(x) == std::vector<float>{2, 3, 3, 2, 3, 3});
}

// DataParallel's worker threads can use one leaf at the same moment (replica 0 is the
// module itself): the leaf must get one AccumulateGrad, made by one of them. Each round
// makes a fresh leaf and releases the threads at once, so that its accumulator is
// created concurrently; two different nodes for one leaf would split its gradient.
TEST_CASE("a leaf used by several threads at once gets one AccumulateGrad") {
  constexpr int kThreads = 4, kRounds = 300;
  for (int round = 0; round < kRounds; ++round) {
    Tensor w = ones({3}).set_requires_grad(true);
    std::atomic<int> ready{0};
    std::vector<const Node*> seen(kThreads, nullptr);
    std::vector<Tensor> outputs(kThreads);
    std::vector<std::thread> threads;
    for (int t = 0; t < kThreads; ++t) {
      threads.emplace_back([&, t] {
        ready.fetch_add(1);
        while (ready.load() < kThreads) std::this_thread::yield();
        outputs[t] = mul(w, 2.0);  // keeps the graph (and the accumulator) alive
        seen[t] = outputs[t].grad_fn()->next_edges()[0].function.get();
      });
    }
    for (auto& thread : threads) thread.join();
    for (int t = 1; t < kThreads; ++t) REQUIRE(seen[t] == seen[0]);
  }
}
