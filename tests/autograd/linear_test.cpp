// linear() is one node (LinearBackward) rather than matmul + transpose + add: its
// gradients must equal those of that composition, come out in the layout of the
// parameters (contiguous [out, in], so AccumulateGrad keeps them without a copy), and
// skip what nobody needs.
#include "catch_compat.h"

#include <minigrad/autograd/functions.h>
#include <minigrad/autograd/node.h>
#include <minigrad/core/generator.h>

#include <algorithm>
#include <tuple>

using namespace mg;

namespace {
void check_close(const Tensor& got, const Tensor& want) {
  REQUIRE(got.defined());
  REQUIRE(got.shape() == want.shape());
  const auto g = got.to_vector<float>(), w = want.to_vector<float>();
  for (size_t i = 0; i < g.size(); ++i) CHECK(g[i] == Approx(w[i]).margin(1e-5));
}
// A fresh leaf with the values of t.
Tensor leaf_like(const Tensor& t) { return t.detach().set_requires_grad(true); }
}  // namespace

TEST_CASE("linear: gradients equal those of matmul(x, w^T) + b") {
  manual_seed(11);
  const Tensor x0 = randn({7, 5}), w0 = randn({3, 5}), b0 = randn({3}), dy = randn({7, 3});

  Tensor x = leaf_like(x0), w = leaf_like(w0), b = leaf_like(b0);
  Tensor y = linear(x, w, b);
  REQUIRE(y.grad_fn() != nullptr);
  CHECK(y.grad_fn()->name() == "LinearBackward");
  y.backward(dy);

  Tensor xc = leaf_like(x0), wc = leaf_like(w0), bc = leaf_like(b0);
  Tensor yc = add(matmul(xc, transpose(wc, 0, 1)), bc);
  check_close(y, yc);
  yc.backward(dy);

  check_close(x.grad(), xc.grad());
  check_close(w.grad(), wc.grad());
  check_close(b.grad(), bc.grad());
  // The weight gradient is made in the weight's own layout.
  CHECK(w.grad().is_contiguous());
}

TEST_CASE("linear: without bias, and with an input that needs no gradient") {
  manual_seed(12);
  const Tensor x = randn({4, 6}), w0 = randn({2, 6}), dy = randn({4, 2});
  Tensor w = leaf_like(w0);
  Tensor y = linear(x, w);
  REQUIRE(y.grad_fn() != nullptr);
  CHECK(y.grad_fn()->next_edges().size() == 2);
  CHECK_FALSE(y.grad_fn()->next_edges()[0].valid());  // x: a constant
  y.backward(dy);
  CHECK_FALSE(x.grad().defined());

  Tensor wc = leaf_like(w0);
  matmul(x, transpose(wc, 0, 1)).backward(dy);
  check_close(w.grad(), wc.grad());
}

TEST_CASE("linear: accumulates over steps like any leaf") {
  manual_seed(13);
  const Tensor x = randn({3, 4});
  Tensor w = leaf_like(randn({5, 4})), b = leaf_like(randn({5}));
  linear(x, w, b).sum().backward();
  const auto once = b.grad().to_vector<float>();
  linear(x, w, b).sum().backward();
  const auto twice = b.grad().to_vector<float>();
  for (size_t i = 0; i < once.size(); ++i) {
    CHECK(once[i] == Approx(3.0f));  // each output row contributes 1
    CHECK(twice[i] == Approx(6.0f));
  }
}

TEST_CASE("linear: bad shapes are refused naming the shapes") {
  const Tensor x = zeros({2, 3}), w = zeros({4, 3});
  REQUIRE_THROWS_WITH(linear(x, zeros({4, 2})),
                      MG_CONTAINS("linear: input of shape [2, 3] has 3 features"));
  REQUIRE_THROWS_WITH(linear(x, w, zeros({3})),
                      MG_CONTAINS("linear: bias of shape [3] does not match weight of shape [4, 3]"));
}

// linear_relu is relu(linear(...)) computed as one op: the same arithmetic in the same
// order, so values and gradients must be equal bit for bit on the CPU.
TEST_CASE("linear_relu: values and gradients equal relu(linear(x, w, b)) exactly") {
  manual_seed(13);
  for (const auto& [batch, in, out] : {std::tuple<int64_t, int64_t, int64_t>{7, 5, 3},
                                       {1, 1, 1}, {33, 17, 65}}) {
    const Tensor x0 = randn({batch, in}), w0 = randn({out, in}), b0 = randn({out});
    const Tensor dy = randn({batch, out});
    Tensor x = leaf_like(x0), w = leaf_like(w0), b = leaf_like(b0);
    Tensor y = linear_relu(x, w, b);
    // The unfused graph: ReluBackward (masking with y), then LinearBackward.
    REQUIRE(y.grad_fn() != nullptr);
    CHECK(y.grad_fn()->name() == "ReluBackward");
    CHECK(y.grad_fn()->next_edges()[0].function->name() == "LinearBackward");
    y.backward(dy);

    Tensor xc = leaf_like(x0), wc = leaf_like(w0), bc = leaf_like(b0);
    Tensor yc = relu(linear(xc, wc, bc));
    yc.backward(dy);
    CHECK(y.to_vector<float>() == yc.to_vector<float>());
    CHECK(x.grad().to_vector<float>() == xc.grad().to_vector<float>());
    CHECK(w.grad().to_vector<float>() == wc.grad().to_vector<float>());
    CHECK(b.grad().to_vector<float>() == bc.grad().to_vector<float>());
    // Some outputs were clipped, so the mask mattered.
    const auto values = y.to_vector<float>();
    if (values.size() > 10) CHECK(std::count(values.begin(), values.end(), 0.0f) > 0);
  }
}

TEST_CASE("linear_relu: needs a bias, and checks shapes like linear") {
  const Tensor x = randn({4, 6}), w = randn({2, 6});
  REQUIRE_THROWS_WITH(linear_relu(x, w, Tensor()), MG_CONTAINS("linear_relu: the bias is an undefined tensor"));
  REQUIRE_THROWS_WITH(linear_relu(x, randn({2, 5}), randn({2})),
                         MG_CONTAINS("linear_relu: input of shape [4, 6] has 6 features but the weight of shape [2, 5] expects 5"));
  REQUIRE_THROWS_WITH(linear_relu(x, w, randn({3})),
                         MG_CONTAINS("linear_relu: bias of shape [3] does not match weight of shape [2, 6] (expected [2])"));
}
