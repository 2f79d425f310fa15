// ops::addmm (a @ b + bias on every row): the CPU backend fuses the bias into the GEMM
// (rows start as the bias, BLAS accumulates with beta = 1); it must agree with matmul
// followed by a broadcast add, for plain and transposed operands, and refuse bad biases.
#include "catch_compat.h"

#include <minigrad/core/generator.h>
#include <minigrad/core/ops.h>

using namespace mg;

namespace {
void check_close(const Tensor& got, const Tensor& want) {
  REQUIRE(got.shape() == want.shape());
  const auto g = got.to_vector<float>(), w = want.to_vector<float>();
  for (size_t i = 0; i < g.size(); ++i) CHECK(g[i] == Approx(w[i]).margin(1e-5));
}
Tensor composed(const Tensor& bias, const Tensor& a, const Tensor& b) {
  return ops::binary(BinaryOp::Add, ops::matmul(a, b), bias);
}
}  // namespace

TEST_CASE("addmm: equals matmul plus the bias broadcast over rows") {
  manual_seed(7);
  const Tensor a = randn({5, 3}), b = randn({3, 4}), bias = randn({4});
  check_close(ops::addmm(bias, a, b), composed(bias, a, b));
  // Odd sizes, and a single row.
  const Tensor a2 = randn({1, 17}), b2 = randn({17, 9}), bias2 = randn({9});
  check_close(ops::addmm(bias2, a2, b2), composed(bias2, a2, b2));
}

TEST_CASE("addmm: transposed operands are read in place, as Linear's x @ w^T") {
  manual_seed(8);
  const Tensor x = randn({6, 5}), w = randn({4, 5}), bias = randn({4});
  const Tensor wt = ops::transpose(w, 0, 1);
  check_close(ops::addmm(bias, x, wt), composed(bias, x, wt));
  const Tensor xt = ops::transpose(randn({5, 6}), 0, 1);
  check_close(ops::addmm(bias, xt, wt), composed(bias, xt, wt));
  // A strided bias (every other element) is made contiguous first.
  const Tensor wide = randn({4, 2});
  const Tensor strided_bias = ops::view(ops::narrow(wide, 1, 0, 1), Shape{4});
  check_close(ops::addmm(strided_bias, x, wt), composed(strided_bias, x, wt));
}

TEST_CASE("addmm: an empty inner dimension leaves the bias") {
  const Tensor a = zeros({3, 0}), b = zeros({0, 2});
  const Tensor bias = from_vector(std::vector<float>{1.5f, -2.0f}, {2});
  CHECK(ops::addmm(bias, a, b).to_vector<float>() ==
        std::vector<float>{1.5f, -2.0f, 1.5f, -2.0f, 1.5f, -2.0f});
}

TEST_CASE("addmm: a bias that does not match the columns is refused with the shapes") {
  const Tensor a = zeros({2, 3}), b = zeros({3, 4});
  REQUIRE_THROWS_WITH(ops::addmm(zeros({3}), a, b),
                      MG_CONTAINS("addmm: expected a float32 bias of shape [4]"));
  REQUIRE_THROWS_WITH(ops::addmm(zeros({1, 4}), a, b), MG_CONTAINS("got [1, 4]"));
  REQUIRE_THROWS_WITH(ops::addmm(zeros({4}), a, zeros({2, 4})),
                      MG_CONTAINS("addmm: shapes [2, 3] and [2, 4] cannot be multiplied"));
}
