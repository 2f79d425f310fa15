// Every differentiable op of autograd/functions.h against finite differences, at odd
// sizes, with broadcasting and view cases. Views are taken inside the checked function,
// so the check goes through the view's backward as well as the op's.
#include "catch_compat.h"
#include "gradcheck.h"

#include <cmath>

#include <minigrad/autograd/functions.h>
#include <minigrad/autograd/node.h>
#include <minigrad/core/ops.h>

using namespace mg;
using mg::testing::GradcheckOptions;
using mg::testing::random_away_from_zero;
using mg::testing::random_input;
using Inputs = std::vector<Tensor>;

namespace {
// Positive inputs in [low, high), for log and for divisors.
Tensor positive(const Shape& shape, uint64_t seed, double low = 0.5, double high = 2.0) {
  return random_input(shape, seed, low, high);
}
}  // namespace

TEST_CASE("gradcheck catches a wrong backward and passes a right one") {
  // y = 3x with a backward that claims dy/dx = 2: the checker must refuse it.
  auto times_three = [](double claimed) {
    return [claimed](const Inputs& x) {
      Tensor out = ops::binary_scalar(BinaryOp::Mul, x[0], 3.0);
      record_function("TimesThree", {x[0]}, {out}, [claimed](const BackwardArgs& g) {
        return std::vector<Tensor>{ops::binary_scalar(BinaryOp::Mul, g.grad(), claimed)};
      });
      return out;
    };
  };
  const Tensor x = random_input({3, 5}, 1);
  const auto wrong = mg::testing::gradcheck(times_three(2.0), {x});
  CHECK_FALSE(wrong.ok);
  CHECK_THAT(wrong.report, MG_CONTAINS("analytic"));
  const auto right = mg::testing::gradcheck(times_three(3.0), {x});
  CHECK(right.ok);
  CHECK(right.checked == 15);

  // A gradient that is right except for one element is caught too.
  auto one_off = [](const Inputs& xs) {
    Tensor out = ops::clone(xs[0]);
    record_function("OneOff", {xs[0]}, {out}, [](const BackwardArgs& g) {
      Tensor grad = ops::clone(g.grad());
      grad.data<float>()[4] += 0.05f;
      return std::vector<Tensor>{grad};
    });
    return out;
  };
  CHECK_FALSE(mg::testing::gradcheck(one_off, {x}).ok);
}

TEST_CASE("gradcheck: add, sub, mul, div with equal shapes") {
  const Tensor a = random_input({3, 5}, 11), b = random_input({3, 5}, 12);
  const Tensor d = random_away_from_zero({3, 5}, 13, 0.5, 2.0);
  CHECK_GRADCHECK([](const Inputs& x) { return add(x[0], x[1]); }, {a, b});
  CHECK_GRADCHECK([](const Inputs& x) { return sub(x[0], x[1]); }, {a, b});
  CHECK_GRADCHECK([](const Inputs& x) { return mul(x[0], x[1]); }, {a, b});
  CHECK_GRADCHECK([](const Inputs& x) { return div(x[0], x[1]); }, {a, d});
  CHECK_GRADCHECK([](const Inputs& x) { return x[0] + x[1]; }, {a, b});
  CHECK_GRADCHECK([](const Inputs& x) { return x[0] - x[1]; }, {a, b});
  CHECK_GRADCHECK([](const Inputs& x) { return x[0] * x[1]; }, {a, b});
  CHECK_GRADCHECK([](const Inputs& x) { return x[0] / x[1]; }, {a, d});
}

TEST_CASE("gradcheck: binary ops broadcasting a 3x1 column with a 1x4 row") {
  const Tensor col = random_input({3, 1}, 21), row = random_input({1, 4}, 22);
  const Tensor row_d = random_away_from_zero({1, 4}, 23, 0.5, 2.0);
  const Tensor col_d = random_away_from_zero({3, 1}, 24, 0.5, 2.0);
  CHECK_GRADCHECK([](const Inputs& x) { return add(x[0], x[1]); }, {col, row});
  CHECK_GRADCHECK([](const Inputs& x) { return sub(x[0], x[1]); }, {col, row});
  CHECK_GRADCHECK([](const Inputs& x) { return mul(x[0], x[1]); }, {col, row});
  CHECK_GRADCHECK([](const Inputs& x) { return div(x[0], x[1]); }, {col, row_d});
  CHECK_GRADCHECK([](const Inputs& x) { return div(x[0], x[1]); }, {row, col_d});
}

TEST_CASE("gradcheck: binary ops broadcasting a vector of 5 with a 2x5 matrix both ways") {
  const Tensor v = random_input({5}, 31), m = random_input({2, 5}, 32);
  const Tensor v_d = random_away_from_zero({5}, 33, 0.5, 2.0);
  const Tensor m_d = random_away_from_zero({2, 5}, 34, 0.5, 2.0);
  CHECK_GRADCHECK([](const Inputs& x) { return add(x[0], x[1]); }, {v, m});
  CHECK_GRADCHECK([](const Inputs& x) { return add(x[0], x[1]); }, {m, v});
  CHECK_GRADCHECK([](const Inputs& x) { return sub(x[0], x[1]); }, {v, m});
  CHECK_GRADCHECK([](const Inputs& x) { return sub(x[0], x[1]); }, {m, v});
  CHECK_GRADCHECK([](const Inputs& x) { return mul(x[0], x[1]); }, {v, m});
  CHECK_GRADCHECK([](const Inputs& x) { return div(x[0], x[1]); }, {v, m_d});
  CHECK_GRADCHECK([](const Inputs& x) { return div(x[0], x[1]); }, {m, v_d});
}

TEST_CASE("gradcheck: binary ops with a scalar-shaped operand") {
  const Tensor s = random_input(Shape{}, 41), m = random_input({3, 4}, 42);
  const Tensor s_d = random_away_from_zero(Shape{}, 43, 0.5, 2.0);
  const Tensor m_d = random_away_from_zero({3, 4}, 44, 0.5, 2.0);
  const Tensor one = random_input({1}, 45), seven = random_input({7}, 46);
  CHECK_GRADCHECK([](const Inputs& x) { return add(x[0], x[1]); }, {s, m});
  CHECK_GRADCHECK([](const Inputs& x) { return sub(x[0], x[1]); }, {m, s});
  CHECK_GRADCHECK([](const Inputs& x) { return mul(x[0], x[1]); }, {s, m});
  CHECK_GRADCHECK([](const Inputs& x) { return div(x[0], x[1]); }, {m, s_d});
  CHECK_GRADCHECK([](const Inputs& x) { return div(x[0], x[1]); }, {s, m_d});
  CHECK_GRADCHECK([](const Inputs& x) { return mul(x[0], x[1]); }, {one, seven});
  CHECK_GRADCHECK([](const Inputs& x) { return mul(x[0], x[1]); }, {s, s_d});
}

TEST_CASE("gradcheck: scalar variants and operators") {
  const Tensor a = random_input({3, 5}, 51);
  CHECK_GRADCHECK([](const Inputs& x) { return add(x[0], 2.5); }, {a});
  CHECK_GRADCHECK([](const Inputs& x) { return mul(x[0], -1.5); }, {a});
  CHECK_GRADCHECK([](const Inputs& x) { return x[0] + 2.0; }, {a});
  CHECK_GRADCHECK([](const Inputs& x) { return 2.0 + x[0]; }, {a});
  CHECK_GRADCHECK([](const Inputs& x) { return x[0] - 2.0; }, {a});
  CHECK_GRADCHECK([](const Inputs& x) { return 2.0 - x[0]; }, {a});
  CHECK_GRADCHECK([](const Inputs& x) { return x[0] * 3.0; }, {a});
  CHECK_GRADCHECK([](const Inputs& x) { return 3.0 * x[0]; }, {a});
  CHECK_GRADCHECK([](const Inputs& x) { return x[0] / 4.0; }, {a});
  CHECK_GRADCHECK([](const Inputs& x) { return -x[0]; }, {a});
}

TEST_CASE("gradcheck: neg, exp, log, relu") {
  CHECK_GRADCHECK([](const Inputs& x) { return neg(x[0]); }, {random_input({7}, 61)});
  CHECK_GRADCHECK([](const Inputs& x) { return x[0].neg(); }, {random_input({1, 9}, 62)});
  CHECK_GRADCHECK([](const Inputs& x) { return exp(x[0]); }, {random_input({3, 5}, 63)});
  CHECK_GRADCHECK([](const Inputs& x) { return x[0].exp(); }, {random_input({7}, 64)});
  CHECK_GRADCHECK([](const Inputs& x) { return log(x[0]); }, {positive({3, 5}, 65)});
  CHECK_GRADCHECK([](const Inputs& x) { return x[0].log(); }, {positive({1, 9}, 66)});
  CHECK_GRADCHECK([](const Inputs& x) { return relu(x[0]); }, {random_away_from_zero({3, 5}, 67)});
  CHECK_GRADCHECK([](const Inputs& x) { return x[0].relu(); }, {random_away_from_zero({7}, 68)});
  // Through a transposed (non-contiguous) input.
  CHECK_GRADCHECK([](const Inputs& x) { return exp(x[0].t()); }, {random_input({3, 5}, 69)});
  CHECK_GRADCHECK([](const Inputs& x) { return relu(x[0].t()); },
                  {random_away_from_zero({3, 5}, 70)});
}

TEST_CASE("gradcheck: sum over everything and over dims, with and without keepdim") {
  const Tensor a = random_input({3, 5}, 71), c = random_input({2, 3, 5}, 72);
  CHECK_GRADCHECK([](const Inputs& x) { return sum(x[0]); }, {a});
  CHECK_GRADCHECK([](const Inputs& x) { return x[0].sum(); }, {c});
  CHECK_GRADCHECK([](const Inputs& x) { return sum(x[0], {0}); }, {a});
  CHECK_GRADCHECK([](const Inputs& x) { return sum(x[0], {1}); }, {a});
  CHECK_GRADCHECK([](const Inputs& x) { return sum(x[0], {-1}, true); }, {a});
  CHECK_GRADCHECK([](const Inputs& x) { return sum(x[0], {0}, true); }, {a});
  CHECK_GRADCHECK([](const Inputs& x) { return sum(x[0], {0, 2}); }, {c});
  CHECK_GRADCHECK([](const Inputs& x) { return sum(x[0], {2, 0}, true); }, {c});
  CHECK_GRADCHECK([](const Inputs& x) { return sum(x[0], {1}); }, {c});
  CHECK_GRADCHECK([](const Inputs& x) { return sum(x[0], {0, 1, 2}); }, {c});
  CHECK_GRADCHECK([](const Inputs& x) { return sum(x[0], {}, true); }, {c});
  // Of a view.
  CHECK_GRADCHECK([](const Inputs& x) { return sum(x[0].t(), {1}); }, {a});
  CHECK_GRADCHECK([](const Inputs& x) { return sum(x[0].narrow(1, 1, 3), {0}); }, {a});
}

TEST_CASE("gradcheck: mean over everything and over dims") {
  const Tensor a = random_input({3, 5}, 81), c = random_input({2, 3, 5}, 82);
  CHECK_GRADCHECK([](const Inputs& x) { return mean(x[0]); }, {a});
  CHECK_GRADCHECK([](const Inputs& x) { return x[0].mean(); }, {c});
  CHECK_GRADCHECK([](const Inputs& x) { return mean(x[0], {0}); }, {a});
  CHECK_GRADCHECK([](const Inputs& x) { return mean(x[0], {-1}, true); }, {a});
  CHECK_GRADCHECK([](const Inputs& x) { return mean(x[0], {0, 2}); }, {c});
  CHECK_GRADCHECK([](const Inputs& x) { return x[0].mean({1}, true); }, {c});
}

TEST_CASE("gradcheck: matmul, including transposed and narrowed views") {
  const Tensor a = random_input({3, 5}, 91), b = random_input({5, 4}, 92);
  const Tensor at = random_input({5, 3}, 93), bt = random_input({4, 5}, 94);
  CHECK_GRADCHECK([](const Inputs& x) { return matmul(x[0], x[1]); }, {a, b});
  CHECK_GRADCHECK([](const Inputs& x) { return x[0].matmul(x[1]); }, {a, b});
  CHECK_GRADCHECK([](const Inputs& x) { return matmul(x[0].t(), x[1]); }, {at, b});
  CHECK_GRADCHECK([](const Inputs& x) { return matmul(x[0], x[1].t()); }, {a, bt});
  CHECK_GRADCHECK([](const Inputs& x) { return matmul(x[0].t(), x[1].t()); }, {at, bt});
  CHECK_GRADCHECK([](const Inputs& x) { return matmul(x[0], x[0].t()); }, {a});
  // Row vector times column vector, and a narrowed (strided) operand.
  CHECK_GRADCHECK([](const Inputs& x) { return matmul(x[0], x[1]); },
                  {random_input({1, 9}, 95), random_input({9, 1}, 96)});
  CHECK_GRADCHECK([](const Inputs& x) { return matmul(x[0].narrow(1, 1, 5), x[1]); },
                  {random_input({3, 7}, 97), b});
  // An expanded (stride-0) operand, which BLAS cannot read directly.
  CHECK_GRADCHECK(
      [](const Inputs& x) {
        return matmul(x[0].expand({3, 5}), x[1]);
      },
      {random_input({1, 5}, 98), b});
}

TEST_CASE("gradcheck: linear with and without bias") {
  const Tensor x = random_input({4, 7}, 101), w = random_input({3, 7}, 102),
               b = random_input({3}, 103);
  CHECK_GRADCHECK([](const Inputs& v) { return linear(v[0], v[1], v[2]); }, {x, w, b});
  CHECK_GRADCHECK([](const Inputs& v) { return linear(v[0], v[1]); }, {x, w});
  CHECK_GRADCHECK([](const Inputs& v) { return linear(v[0], v[1], v[2]); },
                  {random_input({1, 9}, 104), random_input({5, 9}, 105), random_input({5}, 106)});
}

TEST_CASE("gradcheck: log_softmax over the last dim and over dim 0") {
  const Tensor a = random_input({3, 5}, 111, -3.0, 3.0);
  CHECK_GRADCHECK([](const Inputs& x) { return log_softmax(x[0], -1); }, {a});
  CHECK_GRADCHECK([](const Inputs& x) { return log_softmax(x[0], 1); }, {a});
  CHECK_GRADCHECK([](const Inputs& x) { return log_softmax(x[0], 0); }, {a});
  CHECK_GRADCHECK([](const Inputs& x) { return x[0].log_softmax(); },
                  {random_input({7}, 112, -3.0, 3.0)});
  CHECK_GRADCHECK([](const Inputs& x) { return log_softmax(x[0], 1); },
                  {random_input({2, 3, 5}, 113, -3.0, 3.0)});
  CHECK_GRADCHECK([](const Inputs& x) { return log_softmax(x[0].t(), -1); }, {a});
}

TEST_CASE("gradcheck: cross_entropy") {
  const Tensor logits = random_input({4, 5}, 121, -3.0, 3.0);
  const Tensor targets = from_vector(std::vector<int64_t>{2, 0, 4, 2}, {4});
  CHECK_GRADCHECK([](const Inputs& x) { return cross_entropy(x[0], x[1]); }, {logits, targets});
  CHECK_GRADCHECK(
      [](const Inputs& x) { return cross_entropy(x[0], x[1]); },
      {random_input({1, 9}, 122, -3.0, 3.0), from_vector(std::vector<int64_t>{8}, {1})});
  // Logits from a transposed view, targets from a strided view.
  const Tensor targets_strided = from_vector(std::vector<int64_t>{1, 9, 0, 9, 2, 9}, {6});
  CHECK_GRADCHECK(
      [](const Inputs& x) { return cross_entropy(x[0].t(), ops::as_strided(x[1], {3}, {2}, 0)); },
      {random_input({4, 3}, 123, -3.0, 3.0), targets_strided});
  // Composed with a scale, so the incoming gradient is not 1.
  CHECK_GRADCHECK([](const Inputs& x) { return cross_entropy(x[0], x[1]) * 2.5; },
                  {logits, targets});
}

TEST_CASE("gradcheck: reshape and view") {
  const Tensor a = random_input({3, 4}, 131);
  CHECK_GRADCHECK([](const Inputs& x) { return reshape(x[0], {2, 6}); }, {a});
  CHECK_GRADCHECK([](const Inputs& x) { return x[0].reshape({-1}); }, {a});
  CHECK_GRADCHECK([](const Inputs& x) { return x[0].reshape({4, -1, 1}); }, {a});
  // A transposed input cannot be viewed: reshape copies, and the gradient must still flow.
  CHECK_GRADCHECK([](const Inputs& x) { return x[0].t().reshape({12}); }, {a});
  CHECK_GRADCHECK([](const Inputs& x) { return view(x[0], {6, 2}); }, {a});
  CHECK_GRADCHECK([](const Inputs& x) { return x[0].view({1, 12}) * x[0].view({12, 1}); }, {a});
}

TEST_CASE("gradcheck: transpose, narrow, expand, contiguous") {
  const Tensor a = random_input({3, 5}, 141), c = random_input({2, 3, 5}, 142);
  CHECK_GRADCHECK([](const Inputs& x) { return x[0].t(); }, {a});
  CHECK_GRADCHECK([](const Inputs& x) { return transpose(x[0], 0, 2); }, {c});
  CHECK_GRADCHECK([](const Inputs& x) { return x[0].transpose(-1, -2); }, {c});
  CHECK_GRADCHECK([](const Inputs& x) { return narrow(x[0], 1, 1, 3); }, {a});
  CHECK_GRADCHECK([](const Inputs& x) { return x[0].narrow(0, -2, 2); }, {a});
  CHECK_GRADCHECK([](const Inputs& x) { return x[0].narrow(2, 4, 1); }, {c});
  CHECK_GRADCHECK(
      [](const Inputs& x) {
        return expand(x[0], {3, 4});
      },
      {random_input({3, 1}, 143)});
  CHECK_GRADCHECK([](const Inputs& x) { return x[0].expand({2, 3, 4}); }, {random_input({4}, 144)});
  CHECK_GRADCHECK(
      [](const Inputs& x) {
        return x[0].expand({5, -1});
      },
      {random_input({1, 3}, 145)});
  CHECK_GRADCHECK([](const Inputs& x) { return contiguous(x[0].t()); }, {a});
  CHECK_GRADCHECK([](const Inputs& x) { return x[0].contiguous(); }, {a});
  CHECK_GRADCHECK([](const Inputs& x) { return x[0].transpose(0, 1).narrow(0, 1, 2).contiguous(); },
                  {a});
}

TEST_CASE("gradcheck: cat, chunk, split") {
  const Tensor a = random_input({2, 5}, 151), b = random_input({3, 5}, 152),
               c = random_input({1, 5}, 153);
  CHECK_GRADCHECK([](const Inputs& x) { return cat(x, 0); }, {a, b, c});
  CHECK_GRADCHECK([](const Inputs& x) { return cat({x[0].t(), x[1].t()}, 1); }, {a, b});
  CHECK_GRADCHECK(
      [](const Inputs& x) {
        return cat({x[0], x[1]}, -1);
      },
      {random_input({3, 2}, 154), random_input({3, 4}, 155)});
  // One input used twice.
  CHECK_GRADCHECK([](const Inputs& x) { return cat({x[0], x[0]}, 0); }, {c});
  // chunk and split have several outputs: each gets its own random weight.
  const Tensor rows = random_input({9, 3}, 156);
  CHECK_GRADCHECK([](const Inputs& x) { return chunk(x[0], 4, 0); }, {rows});
  CHECK_GRADCHECK([](const Inputs& x) { return chunk(x[0], 2, 1); }, {rows});
  CHECK_GRADCHECK([](const Inputs& x) { return split(x[0], {2, 5, 2}, 0); }, {rows});
  // Only one piece used: the others get zero gradient.
  CHECK_GRADCHECK([](const Inputs& x) { return chunk(x[0], 3, 0)[1]; }, {rows});
}

TEST_CASE("gradcheck: to(Device::cpu())") {
  CHECK_GRADCHECK([](const Inputs& x) { return to(x[0], Device::cpu()); },
                  {random_input({3, 5}, 161)});
  CHECK_GRADCHECK([](const Inputs& x) { return x[0].to(Device("cpu")) * x[0]; },
                  {random_input({7}, 162)});
}

TEST_CASE("gradcheck: compositions (diamond, MLP)") {
  // x used by three paths that meet again.
  CHECK_GRADCHECK([](const Inputs& x) { return x[0] * x[0] + exp(x[0]) - x[0] / 3.0; },
                  {random_input({3, 5}, 171)});
  // linear -> relu -> linear -> cross_entropy, gradients for every parameter and the input.
  // The first seeds whose hidden pre-activations all keep clear of relu's kink at 0.
  Tensor x, w1, b1;
  for (uint64_t seed = 172;; seed += 10) {
    REQUIRE(seed < 2000);
    x = random_input({5, 7}, seed);
    w1 = random_input({6, 7}, seed + 1);
    b1 = random_input({6}, seed + 2);
    bool clear = true;
    for (float h : linear(x, w1, b1).to_vector<float>()) clear = clear && std::fabs(h) > 2e-2f;
    if (clear) break;
  }
  const Tensor w2 = random_input({3, 6}, 175), b2 = random_input({3}, 176);
  const Tensor targets = from_vector(std::vector<int64_t>{0, 2, 1, 1, 0}, {5});
  CHECK_GRADCHECK(
      [](const Inputs& v) {
        return cross_entropy(linear(relu(linear(v[0], v[1], v[2])), v[3], v[4]), v[5]);
      },
      {x, w1, b1, w2, b2, targets});
}
