// Gradients in bfloat16 and float16: every differentiable function's backward in the
// 16-bit dtype against float32's on the same rounded inputs (the gradient half of
// tests/core/reduced_float_ops_test.cpp's table).
//
// Each row computes L = sum(f(x) * r), with r a fixed random tensor (rounded, the same in
// both runs), so the upstream gradient of f is r exactly in both; the inputs' gradients
// are compared element by element:
//
//   |g16 - g32| <= k u (|g32| + c max|r|)      (+ k 2^-25 below float16's normals)
//
// with u = 2^-8 (bfloat16) or 2^-11 (float16). k counts the roundings on the path from
// the inputs to the gradient that float32 does not make, times how much the backward
// formula amplifies them (its condition); c max|r| is the size of the terms a gradient
// element is summed from where they may cancel (then |g32| alone says nothing of the
// error). Each row's k and c are derived beside it. A backward that reads only its
// inputs and r rounds once (k = 1, c = 0); one that reads a saved forward output reads it
// rounded, and that rounding is carried through its formula.
#include "catch_compat.h"
#include "reduced_float_compare.h"

#include <cmath>
#include <functional>
#include <string>
#include <vector>

#include <minigrad/autograd/functions.h>
#include <minigrad/core/generator.h>
#include <minigrad/core/ops.h>

using namespace mg;
using mg::testing::values_of;

namespace {

enum class Kind { Normal, Positive, Index };
struct Input {
  Shape shape;
  Kind kind = Kind::Normal;
  int64_t range = 0;
};
using V = std::vector<Tensor>;
struct Row {
  std::string name;
  std::vector<Input> inputs;
  std::function<Tensor(const V&)> f;
  double k = 1.0;
  // c as a function of the float32 inputs (most rows: a constant).
  std::function<double(const V&)> c = [](const V&) { return 0.0; };
};

Input normal(Shape s) { return {std::move(s), Kind::Normal, 0}; }
Input positive(Shape s) { return {std::move(s), Kind::Positive, 0}; }
Input index(Shape s, int64_t range) { return {std::move(s), Kind::Index, range}; }
std::function<double(const V&)> constant(double c) {
  return [c](const V&) { return c; };
}
double max_abs(const Tensor& t) {
  double m = 0.0;
  for (double v : values_of(t)) m = std::max(m, std::fabs(v));
  return m;
}

std::vector<Row> rows() {
  std::vector<Row> r;
  // Broadcasting sums r over the broadcast dims in float32 and rounds once.
  r.push_back({"add (broadcast)", {normal({6, 9}), normal({9})}, [](const V& x) { return add(x[0], x[1]); }});
  r.push_back({"sub (broadcast)", {normal({6, 1}), normal({6, 9})}, [](const V& x) { return sub(x[0], x[1]); }});
  r.push_back({"mul", {normal({6, 9}), normal({6, 9})}, [](const V& x) { return mul(x[0], x[1]); }});
  // d/db (a / b) = -(g a) / (b b): three roundings of a product and a quotient, no sum:
  // 3u to first order; k = 4 leaves the second-order terms room.
  r.push_back({"div", {normal({6, 9}), positive({6, 9})}, [](const V& x) { return div(x[0], x[1]); }, 4.0});
  r.push_back({"scalar add and mul", {normal({6, 9})}, [](const V& x) { return mul(add(x[0], 0.5), 0.3); }});
  r.push_back({"neg", {normal({6, 9})}, [](const V& x) { return neg(x[0]); }});
  // g * exp(x), exp(x) saved rounded: two roundings.
  r.push_back({"exp", {normal({6, 9})}, [](const V& x) { return exp(x[0]); }, 2.0});
  r.push_back({"log", {positive({6, 9})}, [](const V& x) { return log(x[0]); }});
  r.push_back({"relu", {normal({6, 9})}, [](const V& x) { return relu(x[0]); }});
  // g (1 - y^2), y = tanh(x) saved rounded: y^2 off by 2u y^2, rounded (u y^2), 1 - y^2
  // rounded (u (1 - y^2)), the product rounded (u |g|): <= 3u |r| + u |g|, as k = 3, c = 1.
  r.push_back({"tanh", {normal({6, 9})}, [](const V& x) { return tanh(x[0]); }, 3.0, constant(1.0)});
  r.push_back({"gelu (erf)", {normal({6, 9})}, [](const V& x) { return gelu(x[0]); }});
  r.push_back({"gelu (tanh)", {normal({6, 9})}, [](const V& x) { return gelu(x[0], "tanh"); }});
  r.push_back({"masked_fill", {normal({6, 9}), index({9}, 2)}, [](const V& x) { return masked_fill(x[0], x[1], 0.25); }});
  r.push_back({"dropout", {normal({6, 9})}, [](const V& x) {
                 Generator g(5);
                 return dropout(x[0], 0.3, true, &g);
               }});
  r.push_back({"sum and mean over dims", {normal({5, 4, 7})},
               [](const V& x) { return add(sum(x[0], {1}, true), mean(x[0], {1}, true)); }});
  r.push_back({"views: reshape, transpose, narrow, expand, permute, contiguous, cat, chunk", {normal({4, 6}), normal({2, 6})},
               [](const V& x) {
                 const Tensor a = contiguous(permute(reshape(transpose(x[0], 0, 1), Shape{3, 2, 4}), {2, 0, 1}));
                 const Tensor b = expand(narrow(x[1], 0, 1, 1), Shape{4, 6});
                 const Tensor c = cat({reshape(a, Shape{4, 6}), b}, 0);
                 return chunk(c, 2, 0)[1];
               }});
  r.push_back({"to(float32) and back", {normal({6, 9})}, [](const V& x) { return mul(x[0].to(DType::Float32), 2.0).to(x[0].dtype()); }});
  // GEMM gradients round once; but the float32 run hands a transposed operand to sgemm as
  // a flag while the 16-bit run widens it into a contiguous copy, and OpenBLAS may sum in
  // another order: at most 2 K^2 2^-24 max|g| max|b| apart (K = 13 terms, |b| < 5), which
  // c = 0.3 covers against u = 2^-11 (0.2 needed) and bfloat16's 2^-8 more so.
  r.push_back({"matmul", {normal({7, 13}), normal({13, 5})}, [](const V& x) { return matmul(x[0], x[1]); }, 1.0, constant(0.3)});
  r.push_back({"matmul (batched)", {normal({2, 3, 7, 13}), normal({2, 3, 13, 5})},
               [](const V& x) { return matmul(x[0], x[1]); }, 1.0, constant(0.3)});
  r.push_back({"linear", {normal({7, 13}), normal({5, 13}), normal({5})}, [](const V& x) { return linear(x[0], x[1], x[2]); },
               1.0, constant(0.3)});
  r.push_back({"linear_relu", {normal({7, 13}), normal({5, 13}), normal({5})},
               [](const V& x) { return linear_relu(x[0], x[1], x[2]); }, 1.0, constant(0.3)});
  // g - exp(y) sum(g), y = log_softmax saved rounded (u |y|): exp(y) = p is off by
  // u p |y| <= u / e, times |sum_j g_j| <= C max|r| (C = 13 classes): c = C / e.
  r.push_back({"log_softmax", {normal({7, 13})}, [](const V& x) { return log_softmax(mul(x[0], 2.0), -1); }, 1.0,
               constant(13.0 / std::exp(1.0))});
  // y (g - <g, y>), y = softmax saved rounded (u y): u y |g - <g,y>| <= 2u y max|r| and
  // y |<g, dy>| <= u y max|r| sum y = u y max|r|: c = 3.
  r.push_back({"softmax", {normal({7, 13})}, [](const V& x) { return softmax(mul(x[0], 2.0), -1); }, 1.0, constant(3.0)});
  r.push_back({"cross_entropy (smoothing)", {normal({9, 13}), index({9}, 13)},
               [](const V& x) { return cross_entropy(x[0], x[1], CrossEntropyOptions().label_smoothing(0.1)); }});
  r.push_back({"embedding (repeated indices)", {normal({7, 6}), index({3, 8}, 7)}, [](const V& x) { return embedding(x[0], x[1]); }});
  // The backward kernel reads x, weight and the float32 mean and rstd: the same numbers.
  r.push_back({"layer_norm", {normal({3, 5, 11}), normal({11}), normal({11})},
               [](const V& x) { return layer_norm(x[0], {11}, x[1], x[2]); }});
  // Fused attention's backward reads the saved output O rounded (u |O|): D_i = sum_j dO_ij
  // O_ij moves by u dv max|dO| max|O|, and dS = P (dP - D) carries it into dq (times scale
  // max|k|, P summing to 1), dk (times scale max|q|), and dv not at all: c = scale dv
  // max|v| max(max|k|, max|q|) (|O| <= max|v|), the rest one rounding each.
  const auto attention_c = [](const V& x) {
    return (1.0 / std::sqrt(5.0)) * 7.0 * max_abs(x[2]) * std::max(max_abs(x[0]), max_abs(x[1]));
  };
  r.push_back({"scaled_dot_product_attention (fused, causal)", {normal({2, 3, 9, 5}), normal({2, 3, 11, 5}), normal({2, 3, 11, 7})},
               [](const V& x) { return scaled_dot_product_attention_fused(x[0], x[1], x[2], true); }, 1.0, attention_c});
  return r;
}

}  // namespace

TEST_CASE("reduced floats: every differentiable function's gradients in bfloat16 and float16",
          "[reduced_float][grad]") {
  const std::vector<Row> table = rows();
  for (DType dtype : {DType::BFloat16, DType::Float16}) {
    for (size_t n = 0; n < table.size(); ++n) {
      const Row& row = table[n];
      manual_seed(2000 + n);
      V low, wide;
      for (const Input& in : row.inputs) {
        Tensor x;
        if (in.kind == Kind::Index) {
          x = randint(0, in.range, in.shape);
          low.push_back(x);
          wide.push_back(x);
          continue;
        }
        x = randn(in.shape);
        if (in.kind == Kind::Positive) x = ops::binary_scalar(BinaryOp::Add, ops::unary(UnaryOp::Abs, x), 0.5);
        low.push_back(ops::to_dtype(x, dtype).set_requires_grad(true));
        wide.push_back(ops::to_dtype(low.back(), DType::Float32).set_requires_grad(true));
      }
      Tensor r;
      V grads[2];
      for (int w = 0; w < 2; ++w) {
        const V& x = w ? wide : low;
        const Tensor y = row.f(x);
        if (!r.defined()) r = ops::to_dtype(randn(y.shape()), dtype);  // rounded once, used by both
        REQUIRE(y.dtype() == (w ? DType::Float32 : dtype));
        sum(mul(y, ops::to_dtype(r, y.dtype()))).backward();
        for (const Tensor& t : x)
          if (t.requires_grad()) grads[w].push_back(t.grad());
      }
      const double c = row.c(wide), floor = c * max_abs(r);
      for (size_t i = 0; i < grads[0].size(); ++i) {
        const std::string what = row.name + ": gradient of input " + std::to_string(i) + " in " +
                                 std::string(dtype_name(dtype));
        CHECK(grads[0][i].dtype() == dtype);
        mg::testing::check_within(what, grads[0][i], grads[1][i], dtype, row.k, floor);
      }
    }
  }
}
