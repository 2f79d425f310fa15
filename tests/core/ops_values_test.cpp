// Values of the CPU ops against hand-computed results and naive loops: broadcasting
// arithmetic, reductions over strided views, matmul on every layout BLAS is handed,
// log_softmax and cross-entropy at large logits, argmax, in-place updates.
#include "catch_compat.h"

#include <cmath>

#include <minigrad/autograd/functions.h>
#include <minigrad/autograd/grad_mode.h>
#include <minigrad/core/generator.h>
#include <minigrad/core/ops.h>
#include <minigrad/core/tensor.h>

using namespace mg;

namespace {
Tensor iota(const Shape& shape) {
  return arange(0.0, static_cast<double>(shape.numel()), 1.0, DType::Float32).reshape(shape);
}
// Reads element (i, j) of a 2-D tensor through its logical indices.
float at(const std::vector<float>& v, int64_t cols, int64_t i, int64_t j) {
  return v[static_cast<size_t>(i * cols + j)];
}
void check_close(const std::vector<float>& got, const std::vector<float>& want,
                 double tolerance = 1e-5) {
  REQUIRE(got.size() == want.size());
  for (size_t i = 0; i < got.size(); ++i) {
    INFO("element " << i);
    CHECK(got[i] == Approx(want[i]).margin(tolerance).epsilon(tolerance));
  }
}
}  // namespace

TEST_CASE("elementwise arithmetic with broadcasting") {
  const Tensor col = from_vector(std::vector<float>{1, 2, 3}, {3, 1});
  const Tensor row = from_vector(std::vector<float>{10, 20, 30, 40}, {1, 4});
  const Tensor sum = col + row;
  CHECK(sum.shape() == Shape{3, 4});
  CHECK(sum.to_vector<float>() ==
        std::vector<float>{11, 21, 31, 41, 12, 22, 32, 42, 13, 23, 33, 43});
  CHECK((row - col).to_vector<float>() ==
        std::vector<float>{9, 19, 29, 39, 8, 18, 28, 38, 7, 17, 27, 37});
  CHECK((col * row).to_vector<float>()[5] == 40.0f);
  CHECK((row / col).to_vector<float>()[11] == Approx(40.0f / 3.0f));
  const Tensor s = scalar_tensor(2.0);
  CHECK((iota({2, 2}) * s).to_vector<float>() == std::vector<float>{0, 2, 4, 6});
  CHECK((s - iota({3})).to_vector<float>() == std::vector<float>{2, 1, 0});
  // Scalar variants and operators.
  const Tensor x = from_vector(std::vector<float>{1, -2, 4}, {3});
  CHECK((x + 1.0).to_vector<float>() == std::vector<float>{2, -1, 5});
  CHECK((1.0 + x).to_vector<float>() == std::vector<float>{2, -1, 5});
  CHECK((x - 1.0).to_vector<float>() == std::vector<float>{0, -3, 3});
  CHECK((1.0 - x).to_vector<float>() == std::vector<float>{0, 3, -3});
  CHECK((x * 2.0).to_vector<float>() == std::vector<float>{2, -4, 8});
  CHECK((2.0 * x).to_vector<float>() == std::vector<float>{2, -4, 8});
  CHECK((x / 4.0).to_vector<float>() == std::vector<float>{0.25f, -0.5f, 1.0f});
  CHECK((-x).to_vector<float>() == std::vector<float>{-1, 2, -4});
  CHECK(relu(x).to_vector<float>() == std::vector<float>{1, 0, 4});
  check_close(exp(x).to_vector<float>(), {std::exp(1.0f), std::exp(-2.0f), std::exp(4.0f)});
  check_close(log(from_vector(std::vector<float>{1, 2, 0.5f}, {3})).to_vector<float>(),
              {0.0f, std::log(2.0f), std::log(0.5f)});
  // int64 arithmetic.
  const Tensor i = from_vector(std::vector<int64_t>{7, -3}, {2});
  CHECK((i + i).to_vector<int64_t>() == std::vector<int64_t>{14, -6});
  CHECK((i * from_vector(std::vector<int64_t>{2}, {1})).to_vector<int64_t>() ==
        std::vector<int64_t>{14, -6});
}

TEST_CASE("sqrt, abs and maximum (the optimizers' ops): values, NaN, views, int64") {
  const float nan = std::nanf("");
  const Tensor x = from_vector(std::vector<float>{4.0f, 2.0f, 0.0f, -1.0f, 1e-30f}, {5});
  const auto root = ops::unary(UnaryOp::Sqrt, x).to_vector<float>();
  CHECK(root[0] == 2.0f);
  CHECK(root[1] == std::sqrt(2.0f));  // correctly rounded, as IEEE requires
  CHECK(root[2] == 0.0f);
  CHECK(std::isnan(root[3]));
  CHECK(root[4] == std::sqrt(1e-30f));
  CHECK(ops::unary(UnaryOp::Abs, x).to_vector<float>() ==
        std::vector<float>{4.0f, 2.0f, 0.0f, 1.0f, 1e-30f});
  // int64: sqrt in float32 (torch.sqrt of an int64 tensor is float32), abs stays int64.
  const Tensor isqrt = ops::unary(UnaryOp::Sqrt, arange(5.0));
  CHECK(isqrt.dtype() == DType::Float32);
  CHECK(isqrt.to_vector<float>() == std::vector<float>{0.0f, 1.0f, std::sqrt(2.0f), std::sqrt(3.0f), 2.0f});
  CHECK(ops::unary(UnaryOp::Abs, arange(-2.0, 2.0)).to_vector<int64_t>() == std::vector<int64_t>{2, 1, 0, 1});

  // torch.maximum: elementwise, broadcasting, and NaN wins on either side.
  const Tensor a = from_vector(std::vector<float>{1.0f, -2.0f, nan, 3.0f, 5.0f, -0.5f}, {2, 3});
  const Tensor b = from_vector(std::vector<float>{0.0f, -1.0f, 7.0f}, {3});
  const auto m = ops::binary(BinaryOp::Maximum, a, b).to_vector<float>();
  CHECK(m[0] == 1.0f);
  CHECK(m[1] == -1.0f);
  CHECK(std::isnan(m[2]));
  CHECK(m[3] == 3.0f);
  CHECK(m[4] == 5.0f);
  CHECK(m[5] == 7.0f);
  const auto m_swapped = ops::binary(BinaryOp::Maximum, b, a).to_vector<float>();
  CHECK(std::isnan(m_swapped[2]));
  CHECK(m_swapped[5] == 7.0f);
  // A transposed view against a contiguous tensor.
  const Tensor at = iota({3, 2}).t();
  const Tensor flat = from_vector(std::vector<float>{2.5f, 2.5f, 2.5f, 2.5f, 2.5f, 2.5f}, {2, 3});
  CHECK(ops::binary(BinaryOp::Maximum, at, flat).to_vector<float>() ==
        std::vector<float>{2.5f, 2.5f, 4.0f, 2.5f, 3.0f, 5.0f});
  CHECK(ops::binary(BinaryOp::Maximum, from_vector(std::vector<int64_t>{3, -4, 9}, {3}),
                    from_vector(std::vector<int64_t>{5, -7, 2}, {3}))
            .to_vector<int64_t>() == std::vector<int64_t>{5, -4, 9});
  // And against a scalar (clamping from below).
  CHECK(ops::binary_scalar(BinaryOp::Maximum, from_vector(std::vector<float>{-1.0f, 2.0f}, {2}),
                           0.5)
            .to_vector<float>() == std::vector<float>{0.5f, 2.0f});
}

TEST_CASE("abs_max: the largest magnitude, NaN wins, 0 when empty, strided input") {
  const Tensor x = from_vector(std::vector<float>{0.5f, -7.25f, 3.0f, 7.0f}, {2, 2});
  const Tensor m = ops::abs_max(x);
  CHECK(m.dim() == 0);
  CHECK(m.item<float>() == 7.25f);
  CHECK(ops::abs_max(x.t()).item<float>() == 7.25f);
  CHECK(ops::abs_max(ops::narrow(x, 1, 0, 1)).item<float>() == 3.0f);  // column 0: 0.5, 3
  CHECK(ops::abs_max(zeros({0, 3})).item<float>() == 0.0f);
  CHECK(ops::abs_max(from_vector(std::vector<float>{-INFINITY, 1.0f}, {2})).item<float>() ==
        INFINITY);
  CHECK(std::isnan(
      ops::abs_max(from_vector(std::vector<float>{1.0f, std::nanf(""), INFINITY}, {3}))
          .item<float>()));
  REQUIRE_THROWS_WITH(ops::abs_max(arange(3.0)),
                      MG_CONTAINS("abs_max: expected a floating-point tensor (float32, float64, bfloat16 or float16), got int64"));
}

TEST_CASE("elementwise ops read strided and broadcast views correctly") {
  const Tensor a = iota({3, 4});
  const Tensor t = a.t();                         // [4, 3] strides [1, 4]
  const Tensor n = iota({4, 5}).narrow(1, 1, 3);  // [4, 3] strides [5, 1], offset 1
  const std::vector<float> tv = t.to_vector<float>(), nv = n.to_vector<float>();
  const std::vector<float> sum = (t + n).to_vector<float>();
  for (size_t k = 0; k < sum.size(); ++k) CHECK(sum[k] == tv[k] + nv[k]);
  const std::vector<float> e = exp(t * 0.1).to_vector<float>();
  for (size_t k = 0; k < e.size(); ++k) CHECK(e[k] == Approx(std::exp(tv[k] * 0.1f)));
  // A broadcast (stride-0) operand on the left.
  const Tensor wide = iota({4, 1}).expand({4, 3});
  const std::vector<float> w = (wide - t).to_vector<float>();
  for (int64_t i = 0; i < 4; ++i)
    for (int64_t j = 0; j < 3; ++j)
      CHECK(at(w, 3, i, j) == static_cast<float>(i) - at(tv, 3, i, j));
}

TEST_CASE("sum over various dims of contiguous and strided tensors") {
  const Tensor x = iota({2, 3, 4});  // x[i][j][k] = 12i + 4j + k
  CHECK(x.sum().item<float>() == 276.0f);
  CHECK(x.sum().dim() == 0);
  CHECK(x.sum({0}).to_vector<float>() ==
        std::vector<float>{12, 14, 16, 18, 20, 22, 24, 26, 28, 30, 32, 34});
  CHECK(x.sum({1}).to_vector<float>() == std::vector<float>{12, 15, 18, 21, 48, 51, 54, 57});
  CHECK(x.sum({2}).to_vector<float>() == std::vector<float>{6, 22, 38, 54, 70, 86});
  CHECK(x.sum({-1}, true).shape() == Shape{2, 3, 1});
  CHECK(x.sum({0, 2}).to_vector<float>() == std::vector<float>{60, 92, 124});
  CHECK(x.sum({0, 2}, true).shape() == Shape{1, 3, 1});
  CHECK(x.sum({}, true).shape() == Shape{1, 1, 1});

  // Strided views: a transpose, a narrow, an expand.
  const Tensor t = x.transpose(0, 2);  // [4, 3, 2]
  // t[k][j][i] = 12i + 4j + k; summing k gives 4 (12i + 4j) + 6 at [j][i].
  CHECK(t.sum({0}).to_vector<float>() == std::vector<float>{6, 54, 22, 70, 38, 86});
  CHECK(t.sum({2}).to_vector<float>() ==
        std::vector<float>{12, 20, 28, 14, 22, 30, 16, 24, 32, 18, 26, 34});
  const Tensor n = x.narrow(2, 1, 2);  // k in {1, 2}
  CHECK(n.sum({2}).to_vector<float>() == std::vector<float>{3, 11, 19, 27, 35, 43});
  CHECK(n.sum().item<float>() == 138.0f);
  CHECK(n.sum({0}).to_vector<float>() == std::vector<float>{14, 16, 22, 24, 30, 32});
  const Tensor m = iota({3, 4}).t();  // [4, 3], sum over dim 0 is the rows of the original
  CHECK(m.sum({0}).to_vector<float>() == std::vector<float>{6, 22, 38});
  CHECK(m.sum({1}).to_vector<float>() == std::vector<float>{12, 15, 18, 21});
  const Tensor e = iota({3, 1}).expand({3, 5});
  CHECK(e.sum({1}).to_vector<float>() == std::vector<float>{0, 5, 10});
  CHECK(e.sum({0}).to_vector<float>() == std::vector<float>(5, 3.0f));
  // int64 and empty inputs.
  CHECK(arange(5.0).sum().item<int64_t>() == 10);
  CHECK(zeros({0, 3}).sum({0}).to_vector<float>() == std::vector<float>{0, 0, 0});
  // A large full reduction is accumulated in double: 0.1 summed a million times.
  CHECK(full({1000, 1000}, 0.1).sum().item<float>() == Approx(100000.0f).epsilon(1e-6));
}

TEST_CASE("mean over everything and over dims") {
  const Tensor x = iota({2, 3});
  CHECK(x.mean().item<float>() == 2.5f);
  CHECK(x.mean({0}).to_vector<float>() == std::vector<float>{1.5f, 2.5f, 3.5f});
  CHECK(x.mean({1}, true).to_vector<float>() == std::vector<float>{1.0f, 4.0f});
  CHECK(x.mean({1}, true).shape() == Shape{2, 1});
  CHECK(x.t().mean({1}).to_vector<float>() == std::vector<float>{1.5f, 2.5f, 3.5f});
}

TEST_CASE("matmul matches a naive triple loop on every operand layout") {
  manual_seed(17);
  auto naive = [](const Tensor& a, const Tensor& b) {
    const int64_t m = a.size(0), k = a.size(1), n = b.size(1);
    const std::vector<float> av = a.to_vector<float>(), bv = b.to_vector<float>();
    std::vector<float> c(static_cast<size_t>(m * n));
    for (int64_t i = 0; i < m; ++i)
      for (int64_t j = 0; j < n; ++j) {
        double acc = 0.0;
        for (int64_t p = 0; p < k; ++p) acc += double(at(av, k, i, p)) * at(bv, n, p, j);
        c[static_cast<size_t>(i * n + j)] = static_cast<float>(acc);
      }
    return c;
  };
  auto check = [&](const Tensor& a, const Tensor& b) {
    INFO("a " << a.shape().str() << " strides " << a.stride(0) << "," << a.stride(1) << "; b "
              << b.shape().str() << " strides " << b.stride(0) << "," << b.stride(1));
    const Tensor c = matmul(a, b);
    REQUIRE(c.shape() == Shape{a.size(0), b.size(1)});
    check_close(c.to_vector<float>(), naive(a, b), 1e-4);
  };
  const Tensor a = randn({5, 7}), b = randn({7, 3});
  check(a, b);
  check(randn({7, 5}).t(), b);                  // transposed lhs
  check(a, randn({3, 7}).t());                  // transposed rhs
  check(randn({7, 5}).t(), randn({3, 7}).t());  // both transposed
  check(randn({5, 11}).narrow(1, 2, 7), b);     // row stride > cols
  check(randn({9, 5}).narrow(0, 1, 7).t(), b);  // transposed narrow
  check(a, randn({7, 6}).narrow(1, 3, 3));      // narrowed rhs
  check(randn({1, 7}).expand({5, 7}), b);       // stride-0 rows: copied
  check(a, randn({7, 1}).expand({7, 3}));       // stride-0 cols: copied
  check(randn({1, 7}), randn({7, 1}));          // dot product
  check(randn({9, 1}), randn({1, 4}));          // outer product
  check(randn({1, 9}).t(), randn({4, 1}).t());  // outer product of views
  check(randn({7, 1}).t(), b);                  // [1, 7] with stride [1, 1]
  check(randn({2, 3, 4}).transpose(0, 2).narrow(2, 1, 1).reshape({4, 3}), randn({3, 2}));
  CHECK(matmul(zeros({3, 0}), zeros({0, 4})).to_vector<float>() == std::vector<float>(12, 0.0f));
  CHECK(matmul(zeros({0, 3}), zeros({3, 4})).shape() == Shape{0, 4});
}

TEST_CASE("log_softmax: hand-computed values, stable at logits of 1000") {
  const Tensor x = from_vector(std::vector<float>{1, 2, 3, 0, 0, 0}, {2, 3});
  const double lse = std::log(std::exp(1.0) + std::exp(2.0) + std::exp(3.0));
  check_close(log_softmax(x).to_vector<float>(),
              {float(1 - lse), float(2 - lse), float(3 - lse), float(-std::log(3.0)),
               float(-std::log(3.0)), float(-std::log(3.0))});
  // Over dim 0: columns are normalised.
  const std::vector<float> d0 = log_softmax(x, 0).to_vector<float>();
  for (int64_t j = 0; j < 3; ++j) {
    const double top = static_cast<double>(j + 1);
    const double l = std::log(std::exp(top) + 1.0);
    CHECK(at(d0, 3, 0, j) == Approx(top - l));
    CHECK(at(d0, 3, 1, j) == Approx(-l));
  }
  // Huge logits: exp(1000) overflows, log_softmax must not.
  const Tensor big = from_vector(std::vector<float>{1000, 1001, 1002, -1000, 0, 1000}, {2, 3});
  const std::vector<float> y = log_softmax(big).to_vector<float>();
  for (float v : y) CHECK(std::isfinite(v));
  const double l3 = std::log(1.0 + std::exp(-1.0) + std::exp(-2.0));  // lse = 1002 + l3
  check_close(y,
              {float(-2 - l3), float(-1 - l3), float(-l3), -2000.0f,
               float(-1000.0 - std::log1p(std::exp(-1000.0))), 0.0f},
              1e-4);
  // Rows of exp(log_softmax) sum to one, for a row of identical logits too.
  const std::vector<float> flat = log_softmax(full({1, 4}, 1000.0)).to_vector<float>();
  for (float v : flat) CHECK(v == Approx(-std::log(4.0)));
  // 1-D input, and a transposed input.
  check_close(log_softmax(from_vector(std::vector<float>{0, 0}, {2})).to_vector<float>(),
              {float(-std::log(2.0)), float(-std::log(2.0))});
  check_close(log_softmax(x.t(), 1).to_vector<float>(), log_softmax(x, 0).t().to_vector<float>());
}

TEST_CASE("cross_entropy: hand-computed values, stable at logits of 1000") {
  const Tensor logits = from_vector(std::vector<float>{1, 2, 3, 0, 0, 0}, {2, 3});
  const Tensor targets = from_vector(std::vector<int64_t>{2, 0}, {2});
  const double lse = std::log(std::exp(1.0) + std::exp(2.0) + std::exp(3.0));
  const double expected = ((lse - 3.0) + std::log(3.0)) / 2.0;
  const Tensor loss = cross_entropy(logits, targets);
  CHECK(loss.dim() == 0);
  CHECK(loss.item<float>() == Approx(expected));
  // It equals the mean of -log_softmax at the targets.
  const std::vector<float> ls = log_softmax(logits).to_vector<float>();
  CHECK(loss.item<float>() == Approx(-(ls[2] + ls[3]) / 2.0f));

  // At logits of 1000 the loss is finite and exact: the target row's margin decides it.
  const Tensor big = from_vector(std::vector<float>{1000, 0, -1000, 1000, 1000, 1000}, {2, 3});
  const Tensor big_loss = cross_entropy(big, from_vector(std::vector<int64_t>{0, 1}, {2}));
  REQUIRE(std::isfinite(big_loss.item<float>()));
  CHECK(big_loss.item<float>() == Approx((0.0 + std::log(3.0)) / 2.0).margin(1e-5));
  // A confidently wrong prediction costs its margin, still finite.
  const Tensor wrong = cross_entropy(from_vector(std::vector<float>{1000, -1000}, {1, 2}),
                                     from_vector(std::vector<int64_t>{1}, {1}));
  CHECK(wrong.item<float>() == Approx(2000.0f));
  // Its gradient is softmax - onehot over the batch, finite as well.
  Tensor l = from_vector(std::vector<float>{1000, 0, -1000, 1000, 1000, 1000}, {2, 3})
                 .set_requires_grad(true);
  cross_entropy(l, from_vector(std::vector<int64_t>{0, 1}, {2})).backward();
  check_close(l.grad().to_vector<float>(),
              {0.0f, 0.0f, 0.0f, 1.0f / 6.0f, (1.0f / 3.0f - 1.0f) / 2.0f, 1.0f / 6.0f}, 1e-6);
}

TEST_CASE("argmax over the last dim, over other dims, first index on ties") {
  const Tensor x = from_vector(std::vector<float>{1, 5, 2, 7, 0, 7}, {2, 3});
  CHECK(x.argmax().to_vector<int64_t>() == std::vector<int64_t>{1, 0});  // tie: first
  CHECK(x.argmax().dtype() == DType::Int64);
  CHECK(x.argmax(0).to_vector<int64_t>() == std::vector<int64_t>{1, 0, 1});
  CHECK(x.t().argmax(1).to_vector<int64_t>() == std::vector<int64_t>{1, 0, 1});
  CHECK(from_vector(std::vector<float>{-3, -1, -2}, {3}).argmax().item<int64_t>() == 1);
  // 3-D, over each dim, against a direct search.
  manual_seed(4);
  const Tensor c = randn({3, 4, 5});
  const std::vector<float> v = c.to_vector<float>();
  auto value = [&](int64_t i, int64_t j, int64_t k) {
    return v[static_cast<size_t>(i * 20 + j * 5 + k)];
  };
  const std::vector<int64_t> a0 = c.argmax(0).to_vector<int64_t>();
  const std::vector<int64_t> a1 = c.argmax(1).to_vector<int64_t>();
  const std::vector<int64_t> a2 = c.argmax(2).to_vector<int64_t>();
  REQUIRE(c.argmax(0).shape() == Shape{4, 5});
  REQUIRE(c.argmax(1).shape() == Shape{3, 5});
  REQUIRE(c.argmax(-1).shape() == Shape{3, 4});
  for (int64_t j = 0; j < 4; ++j)
    for (int64_t k = 0; k < 5; ++k) {
      int64_t best = 0;
      for (int64_t i = 1; i < 3; ++i)
        if (value(i, j, k) > value(best, j, k)) best = i;
      CHECK(a0[static_cast<size_t>(j * 5 + k)] == best);
    }
  for (int64_t i = 0; i < 3; ++i)
    for (int64_t k = 0; k < 5; ++k) {
      int64_t best = 0;
      for (int64_t j = 1; j < 4; ++j)
        if (value(i, j, k) > value(i, best, k)) best = j;
      CHECK(a1[static_cast<size_t>(i * 5 + k)] == best);
    }
  for (int64_t i = 0; i < 3; ++i)
    for (int64_t j = 0; j < 4; ++j) {
      int64_t best = 0;
      for (int64_t k = 1; k < 5; ++k)
        if (value(i, j, k) > value(i, j, best)) best = k;
      CHECK(a2[static_cast<size_t>(i * 4 + j)] == best);
    }
}

TEST_CASE("in-place updates: fill_, add_, mul_, copy_ on contiguous and strided tensors") {
  NoGradGuard no_grad;
  Tensor x = zeros({3, 4});
  x.narrow(1, 1, 2).fill_(5.0);  // strided fill
  CHECK(x.to_vector<float>() == std::vector<float>{0, 5, 5, 0, 0, 5, 5, 0, 0, 5, 5, 0});
  x.add_(from_vector(std::vector<float>{1, 2, 3, 4}, {4}));  // broadcast row
  CHECK(x.to_vector<float>() == std::vector<float>{1, 7, 8, 4, 1, 7, 8, 4, 1, 7, 8, 4});
  x.mul_(0.5);
  CHECK(x.to_vector<float>()[1] == 3.5f);
  x.mul_(from_vector(std::vector<float>{2, 0, 1}, {3, 1}));
  CHECK(x.to_vector<float>() == std::vector<float>{1, 7, 8, 4, 0, 0, 0, 0, 0.5f, 3.5f, 4, 2});
  Tensor y = zeros({4, 3});
  y.t().copy_(x);  // copy into a transposed view
  CHECK(y.t().to_vector<float>() == x.to_vector<float>());
  Tensor z = empty({2, 2});
  z.copy_(scalar_tensor(3.0));  // broadcast a scalar
  CHECK(z.to_vector<float>() == std::vector<float>{3, 3, 3, 3});
  Tensor acc = zeros({2});
  acc.add_(ones({2}), 2.5);
  CHECK(acc.to_vector<float>() == std::vector<float>{2.5f, 2.5f});
}
