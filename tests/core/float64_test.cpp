// float64 through the dtype plumbing: creation, values, printing, conversion, every CPU
// kernel family (elementwise, reductions, dgemm, softmax and cross-entropy, fill, copy,
// random numbers), and strided float64 inputs.
#include "catch_compat.h"

#include <cmath>
#include <vector>

#include <minigrad/autograd/functions.h>
#include <minigrad/core/dispatch.h>
#include <minigrad/core/generator.h>
#include <minigrad/core/ops.h>
#include <minigrad/core/tensor.h>

using namespace mg;

namespace {
Tensor doubles(const std::vector<double>& v, const Shape& shape) { return from_vector(v, shape); }
}  // namespace

TEST_CASE("float64: dtype facts, creation, item, to_vector and printing", "[float64]") {
  CHECK(element_size(DType::Float64) == 8);
  CHECK(dtype_name(DType::Float64) == "float64");
  CHECK(dtype_of<double>() == DType::Float64);
  CHECK(is_floating_point(DType::Float64));
  CHECK_FALSE(is_floating_point(DType::Int64));
  CHECK(promote_types(DType::Int64, DType::Float32) == DType::Float32);
  CHECK(promote_types(DType::Float32, DType::Float64) == DType::Float64);
  CHECK(promote_types(DType::Int64, DType::Float64) == DType::Float64);

  const Tensor x = doubles({0.1, 1e-300, -2.5}, {3});
  CHECK(x.dtype() == DType::Float64);
  CHECK(x.to_vector<double>() == std::vector<double>{0.1, 1e-300, -2.5});  // exact
  CHECK(x.nbytes() == 24);
  CHECK(doubles({3.25}, {}).item<double>() == 3.25);
  CHECK_THAT(x.str(), MG_CONTAINS("dtype=float64"));
  REQUIRE_THROWS_WITH(x.to_vector<float>(), MG_CONTAINS("float64") && MG_CONTAINS("float32"));
  CHECK(zeros({2}, DType::Float64).to_vector<double>() == std::vector<double>{0.0, 0.0});
  CHECK(full({2}, 0.1, DType::Float64).to_vector<double>() == std::vector<double>{0.1, 0.1});
  CHECK(arange(0.0, 1.0, 0.25, DType::Float64).to_vector<double>() ==
        std::vector<double>{0.0, 0.25, 0.5, 0.75});
  Tensor leaf = zeros({2}, DType::Float64);
  leaf.set_requires_grad(true);
  CHECK(leaf.requires_grad());
  REQUIRE_THROWS_WITH(zeros({2}, DType::Int64).set_requires_grad(true),
                      MG_CONTAINS("floating-point") && MG_CONTAINS("int64"));
}

TEST_CASE("float64: to(dtype) converts, and its backward converts the gradient back",
          "[float64]") {
  const Tensor f = from_vector(std::vector<float>{0.1f, -3.0f}, {2});
  const Tensor d = f.to(DType::Float64);
  CHECK(d.dtype() == DType::Float64);
  CHECK(d.to_vector<double>() == std::vector<double>{static_cast<double>(0.1f), -3.0});
  CHECK(f.to(DType::Float32).is_same(f));  // no copy when the dtype is already right
  CHECK(doubles({2.9, -2.9}, {2}).to(DType::Int64).to_vector<int64_t>() ==
        std::vector<int64_t>{2, -2});  // truncation toward zero
  CHECK(to(from_vector(std::vector<int64_t>{5}, {1}), DType::Float64).item<double>() == 5.0);
  // A strided source.
  const Tensor m = doubles({1, 2, 3, 4, 5, 6}, {2, 3}).t().to(DType::Float32);
  CHECK(m.to_vector<float>() == std::vector<float>{1, 4, 2, 5, 3, 6});

  Tensor leaf = from_vector(std::vector<float>{1.0f, 2.0f}, {2});
  leaf.set_requires_grad(true);
  Tensor y = leaf.to(DType::Float64) * doubles({0.5, 3.0}, {2});
  CHECK(y.dtype() == DType::Float64);
  y.sum().backward();
  CHECK(leaf.grad().dtype() == DType::Float32);
  CHECK(leaf.grad().to_vector<float>() == std::vector<float>{0.5f, 3.0f});
}

TEST_CASE("float64: elementwise, reductions, matmul, softmax and loss keep double precision",
          "[float64]") {
  // 1 + 1e-12 is 1 in float32: a float32 path would lose it.
  const Tensor a = doubles({1.0 + 1e-12, 2.0, 3.0, 4.0, 5.0, 6.0}, {2, 3});
  CHECK((a - 1.0).to_vector<double>()[0] == Approx(1e-12).epsilon(1e-3));
  CHECK(a.sum().item<double>() == Approx(21.0 + 1e-12).epsilon(1e-15));
  CHECK(exp(doubles({1.0}, {1})).item<double>() == std::exp(1.0));
  CHECK(log(doubles({2.0}, {1})).item<double>() == std::log(2.0));
  CHECK(relu(doubles({-1.0, 2.0}, {2})).to_vector<double>() == std::vector<double>{0.0, 2.0});
  CHECK(ops::unary(UnaryOp::Sqrt, doubles({2.0}, {1})).item<double>() == std::sqrt(2.0));
  CHECK(ops::abs_max(doubles({-7.0, 2.0}, {2})).item<double>() == 7.0);
  CHECK(a.argmax(1).to_vector<int64_t>() == std::vector<int64_t>{2, 2});
  CHECK(a.mean({0}).to_vector<double>()[1] == 3.5);

  // dgemm, transposed operand, against a double loop.
  const Tensor b = doubles({0.5, -1.0, 2.0, 0.25, 1.5, -0.75}, {2, 3});
  const Tensor p = matmul(a, b.t());  // [2, 2]
  const std::vector<double> av = a.to_vector<double>(), bv = b.to_vector<double>();
  for (int i = 0; i < 2; ++i)
    for (int j = 0; j < 2; ++j) {
      double expect = 0.0;
      for (int k = 0; k < 3; ++k) expect += av[static_cast<size_t>(i * 3 + k)] * bv[static_cast<size_t>(j * 3 + k)];
      CHECK(p.to_vector<double>()[static_cast<size_t>(i * 2 + j)] == Approx(expect).epsilon(1e-15));
    }
  const Tensor l = linear(a, b, doubles({1.0, 2.0}, {2}));
  CHECK(l.dtype() == DType::Float64);
  CHECK(l.to_vector<double>()[0] == Approx(p.to_vector<double>()[0] + 1.0).epsilon(1e-15));

  // softmax, log_softmax and cross-entropy in double.
  const Tensor logits = doubles({1.0, 2.0, 3.0, 1.0, 1.0, 1.0}, {2, 3});
  const double lse0 = std::log(std::exp(1.0) + std::exp(2.0) + std::exp(3.0));
  CHECK(log_softmax(logits, 1).to_vector<double>()[0] == Approx(1.0 - lse0).epsilon(1e-14));
  CHECK(softmax(logits, 1).to_vector<double>()[2] == Approx(std::exp(3.0 - lse0)).epsilon(1e-14));
  const Tensor targets = from_vector(std::vector<int64_t>{2, 0}, {2});
  const Tensor loss = cross_entropy(logits, targets);
  CHECK(loss.dtype() == DType::Float64);
  CHECK(loss.item<double>() == Approx(((lse0 - 3.0) + std::log(3.0)) / 2.0).epsilon(1e-14));
}

TEST_CASE("float64: random numbers are the float32 stream widened", "[float64]") {
  manual_seed(7);
  const Tensor f = randn({5});
  manual_seed(7);
  Tensor d = zeros({5}, DType::Float64);
  d.normal_();
  const std::vector<float> fv = f.to_vector<float>();
  const std::vector<double> dv = d.to_vector<double>();
  for (size_t i = 0; i < 5; ++i) CHECK(dv[i] == static_cast<double>(fv[i]));
  d.uniform_(2.0, 3.0);
  for (double v : d.to_vector<double>()) CHECK((v >= 2.0 && v < 3.0));
}

TEST_CASE("dtype dispatch: one kernel template for every float type, errors name the op",
          "[float64]") {
  const auto size_of = [](DType dtype) {
    return MG_DISPATCH_FLOATING_TYPES(dtype, "size_of", [&] { return sizeof(scalar_t); });
  };
  CHECK(size_of(DType::Float32) == 4);
  CHECK(size_of(DType::Float64) == 8);
  REQUIRE_THROWS_WITH(size_of(DType::Int64),
                      MG_CONTAINS("size_of") && MG_CONTAINS("floating-point") && MG_CONTAINS("int64"));
}
