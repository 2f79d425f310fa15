// scaled_dot_product_attention: the fused path equals the composition (values and every
// gradient; causal and not; lengths that are not multiples of the CPU kernel's 64-key
// blocks; with dropout, the same mask), the switch picks the path, and the errors.
#include "catch_compat.h"
#include "gradcheck.h"

#include <cmath>

#include <minigrad/autograd/functions.h>
#include <minigrad/autograd/node.h>
#include <minigrad/core/generator.h>
#include <minigrad/core/ops.h>

using namespace mg;
using mg::testing::random_input;

namespace {

double max_abs_diff(const Tensor& a, const Tensor& b) {
  REQUIRE(a.shape() == b.shape());
  const std::vector<double> x = ops::to_dtype(a, DType::Float64).to_vector<double>();
  const std::vector<double> y = ops::to_dtype(b, DType::Float64).to_vector<double>();
  double worst = 0.0;
  for (size_t i = 0; i < x.size(); ++i) worst = std::max(worst, std::fabs(x[i] - y[i]));
  return worst;
}

struct Run {
  Tensor out, gq, gk, gv;
};

// Forward, then backward seeded with a fixed random gradient; the generator (for
// dropout) restarted at one state for each path.
Run run(bool fused, const Tensor& q0, const Tensor& k0, const Tensor& v0, bool causal,
        double dropout_p, DType dtype) {
  Tensor q = ops::to_dtype(q0, dtype), k = ops::to_dtype(k0, dtype), v = ops::to_dtype(v0, dtype);
  for (Tensor* t : {&q, &k, &v}) {
    *t = ops::clone(*t);
    t->set_requires_grad(true);
  }
  Generator gen(2024);
  // A transposed query: both paths read strided input.
  const Tensor qt = q.transpose(-1, -2).contiguous().transpose(-1, -2);
  Tensor out = fused ? scaled_dot_product_attention_fused(qt, k, v, causal, dropout_p, &gen)
                     : scaled_dot_product_attention_composed(qt, k, v, causal, dropout_p, &gen);
  const Tensor seed = ops::to_dtype(random_input(out.shape(), 77), dtype);
  out.backward(seed);
  return {out, q.grad(), k.grad(), v.grad()};
}

void check_equal(const Shape& qs, const Shape& ks, const Shape& vs, bool causal, double p,
                 DType dtype, double tolerance) {
  INFO(fmt::format("q {} k {} v {} causal {} dropout {} {}", qs, ks, vs, causal, p, dtype));
  const Tensor q = random_input(qs, 1, -2.0, 2.0), k = random_input(ks, 2, -2.0, 2.0);
  const Tensor v = random_input(vs, 3);
  const Run composed = run(false, q, k, v, causal, p, dtype);
  const Run fused = run(true, q, k, v, causal, p, dtype);
  CHECK(fused.out.dtype() == dtype);
  CHECK(max_abs_diff(composed.out, fused.out) < tolerance);
  CHECK(max_abs_diff(composed.gq, fused.gq) < tolerance);
  CHECK(max_abs_diff(composed.gk, fused.gk) < tolerance);
  CHECK(max_abs_diff(composed.gv, fused.gv) < tolerance);
}

}  // namespace

TEST_CASE("attention: fused equals composed, values and gradients, causal and not",
          "[attention]") {
  for (bool causal : {false, true}) {
    for (DType dtype : {DType::Float64, DType::Float32}) {
      const double tol = dtype == DType::Float64 ? 1e-12 : 2e-5;
      check_equal({2, 3, 7, 5}, {2, 3, 7, 5}, {2, 3, 7, 3}, causal, 0.0, dtype, tol);
      // 130 queries and keys: three blocks of 64, the last of 2.
      check_equal({2, 130, 9}, {2, 130, 9}, {2, 130, 11}, causal, 0.0, dtype, tol);
      // Fewer queries than keys and more (cross-attention shapes).
      check_equal({1, 67, 4}, {1, 129, 4}, {1, 129, 4}, causal, 0.0, dtype, tol);
      check_equal({3, 70, 4}, {3, 5, 4}, {3, 5, 6}, causal, 0.0, dtype, tol);
      // One query, one key.
      check_equal({1, 1, 1}, {1, 1, 1}, {1, 1, 1}, causal, 0.0, dtype, tol);
    }
  }
}

TEST_CASE("attention: with dropout both paths draw the same mask", "[attention][dropout]") {
  for (bool causal : {false, true}) {
    check_equal({2, 2, 69, 5}, {2, 2, 69, 5}, {2, 2, 69, 3}, causal, 0.25, DType::Float64, 1e-12);
    check_equal({3, 13, 8}, {3, 13, 8}, {3, 13, 8}, causal, 0.6, DType::Float32, 2e-5);
  }
}

TEST_CASE("attention: the switch picks the path, and causal attention ignores the future",
          "[attention]") {
  CHECK(fused_attention_enabled());
  const Tensor q = random_input({1, 6, 4}, 4), k = random_input({1, 6, 4}, 5);
  const Tensor v = random_input({1, 6, 4}, 6);
  Tensor q_leaf = ops::clone(q);
  q_leaf.set_requires_grad(true);
  {
    FusedAttentionGuard composed(false);
    CHECK_FALSE(fused_attention_enabled());
    const Tensor out = scaled_dot_product_attention(q_leaf, k, v, true);
    CHECK(out.grad_fn()->name() == "BmmBackward");  // the composition's last op
  }
  CHECK(fused_attention_enabled());
  const Tensor out = scaled_dot_product_attention(q_leaf, k, v, true);
  CHECK(out.grad_fn()->name() == "ScaledDotProductAttentionBackward");

  // Changing keys and values after position 2 leaves causal outputs 0..2 unchanged.
  Tensor k2 = ops::clone(k), v2 = ops::clone(v);
  ops::narrow(k2, 1, 3, 3).fill_(5.0);
  ops::narrow(v2, 1, 3, 3).fill_(-5.0);
  for (bool fused : {false, true}) {
    FusedAttentionGuard guard(fused);
    const Tensor a = scaled_dot_product_attention(q, k, v, true);
    const Tensor b = scaled_dot_product_attention(q, k2, v2, true);
    CHECK(max_abs_diff(ops::narrow(a, 1, 0, 3), ops::narrow(b, 1, 0, 3)) == 0.0);
    CHECK(max_abs_diff(ops::narrow(a, 1, 3, 3), ops::narrow(b, 1, 3, 3)) > 0.1);
    // The first query sees only the first key: its output is v[0].
    CHECK(max_abs_diff(ops::narrow(a, 1, 0, 1), ops::narrow(v, 1, 0, 1)) < 1e-6);
  }
}

TEST_CASE("attention: errors name the op and the shapes", "[attention]") {
  const Tensor q = random_input({2, 5, 4}, 7);
  for (bool fused : {false, true}) {
    FusedAttentionGuard guard(fused);
    REQUIRE_THROWS_WITH(scaled_dot_product_attention(q, random_input({2, 5, 3}, 8), q),
                        MG_CONTAINS("[2, 5, 3]"));
  }
  REQUIRE_THROWS_WITH(scaled_dot_product_attention_fused(q, random_input({3, 5, 4}, 8), q),
                      MG_CONTAINS("scaled_dot_product_attention") && MG_CONTAINS("[3, 5, 4]"));
  REQUIRE_THROWS_WITH(scaled_dot_product_attention_fused(q, q, q, false, 1.0),
                      MG_CONTAINS("dropout_p") && MG_CONTAINS("[0, 1)"));
  REQUIRE_THROWS_WITH(scaled_dot_product_attention_fused(q, q, ops::to_dtype(q, DType::Float64)),
                      MG_CONTAINS("float32") && MG_CONTAINS("float64"));
  REQUIRE_THROWS_WITH(scaled_dot_product_attention(random_input({4}, 9), q, q),
                      MG_CONTAINS("scaled_dot_product_attention") && MG_CONTAINS("[4]"));
}
