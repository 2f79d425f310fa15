// The table of tests/core/reduced_float_ops_test.cpp (every op of the Backend interface
// in bfloat16 and float16), shared with tests/cuda/reduced_float_test.cpp, which runs each
// row on a GPU against the CPU. A row's function runs on whatever device its inputs are on.
#pragma once

#include <functional>
#include <string>
#include <vector>

#include <minigrad/core/backend.h>
#include <minigrad/core/generator.h>
#include <minigrad/core/ops.h>
#include <minigrad/core/tensor.h>

namespace mg::testing {

enum class Kind {
  Normal,    // N(0, 1)
  Positive,  // 0.5 + |N(0, 1)|: logs, square roots, divisors, variances
  Index,     // int64 in [0, range): targets, embedding indices (not rounded)
  Mask,      // int64 0/1
};
struct Input {
  Shape shape;
  Kind kind = Kind::Normal;
  int64_t range = 0;
};
using Run = std::function<std::vector<Tensor>(const std::vector<Tensor>& in, DType low)>;
struct Row {
  std::string name;      // the Backend method(s) it exercises, then what is special
  std::vector<Input> inputs;
  Run run;               // in: the inputs in the run's dtype; low: the 16-bit dtype under test
};

inline Input normal(Shape s) { return {std::move(s), Kind::Normal, 0}; }
inline Input positive(Shape s) { return {std::move(s), Kind::Positive, 0}; }
inline Input index(Shape s, int64_t range) { return {std::move(s), Kind::Index, range}; }
inline Input mask(Shape s) { return {std::move(s), Kind::Mask, 2}; }

inline Tensor draw(const Input& in) {
  switch (in.kind) {
    case Kind::Normal: return randn(in.shape);
    case Kind::Positive: return ops::binary_scalar(BinaryOp::Add, ops::unary(UnaryOp::Abs, randn(in.shape)), 0.5);
    case Kind::Index:
    case Kind::Mask: return randint(0, in.range, in.shape);
  }
  return Tensor();
}

// y's values rounded to `low`, in `dtype`: an input a row computes from its inputs (x * 3)
// is rounded in both runs, so that both meet the same numbers.
inline Tensor rounded_like(const Tensor& y, DType low, DType dtype) {
  return ops::to_dtype(ops::to_dtype(y, low), dtype);
}

// The table. Shapes are odd so that no vector width divides them.
inline std::vector<Row> reduced_float_rows() {
  using V = std::vector<Tensor>;
  const CrossEntropyOptions smoothing = CrossEntropyOptions().label_smoothing(0.1).ignore_index(2);
  std::vector<Row> r;
  // ---- data ----
  r.push_back({"copy (clone, a strided view)", {normal({5, 7})},
               [](const V& in, DType) { return V{ops::clone(in[0]), ops::contiguous(ops::transpose(in[0], 0, 1))}; }});
  r.push_back({"convert (to float64 and back, to int64)", {normal({5, 7})}, [](const V& in, DType low) {
                 const Tensor x = rounded_like(ops::binary_scalar(BinaryOp::Mul, in[0], 100.0), low, in[0].dtype());
                 const Tensor wide = ops::to_dtype(x, DType::Float64);
                 return V{ops::to_dtype(wide, in[0].dtype()), ops::to_dtype(wide, DType::Int64)};
               }});
  r.push_back({"fill", {normal({3})},
               [](const V& in, DType) { return V{full(Shape{5, 3}, 1.0 / 3.0, in[0].dtype(), in[0].device())}; }});
  r.push_back({"arange", {normal({3})},
               [](const V& in, DType) { return V{arange(-2.0, 3.0, 0.3, in[0].dtype(), in[0].device())}; }});
  r.push_back({"random_uniform, random_normal", {normal({3})}, [](const V& in, DType) {
                 manual_seed(7);
                 Tensor u = empty(Shape{9, 11}, in[0].dtype(), in[0].device());
                 u.uniform_(-2.0, 3.0);
                 Tensor n = empty(Shape{9, 11}, in[0].dtype(), in[0].device());
                 n.normal_(0.5, 2.0);
                 return V{u, n};
               }});
  // ---- elementwise ----
  for (UnaryOp op : {UnaryOp::Neg, UnaryOp::Exp, UnaryOp::Relu, UnaryOp::Abs, UnaryOp::Tanh}) {
    r.push_back({std::string("unary ") + op_name(op), {normal({6, 9})},
                 [op](const V& in, DType) { return V{ops::unary(op, in[0])}; }});
  }
  for (UnaryOp op : {UnaryOp::Log, UnaryOp::Sqrt}) {
    r.push_back({std::string("unary ") + op_name(op), {positive({6, 9})},
                 [op](const V& in, DType) { return V{ops::unary(op, in[0])}; }});
  }
  for (BinaryOp op : {BinaryOp::Add, BinaryOp::Sub, BinaryOp::Mul, BinaryOp::Maximum}) {
    // [6, 9] with [9] (a broadcast row) and with [6, 1] (a broadcast column).
    r.push_back({std::string("binary ") + op_name(op) + " (broadcast)", {normal({6, 9}), normal({9}), normal({6, 1})},
                 [op](const V& in, DType) { return V{ops::binary(op, in[0], in[1]), ops::binary(op, in[2], in[0])}; }});
    r.push_back({std::string("binary_scalar ") + op_name(op), {normal({6, 9})},
                 [op](const V& in, DType) { return V{ops::binary_scalar(op, in[0], 0.3)}; }});
  }
  r.push_back({"binary div", {normal({6, 9}), positive({6, 9})},
               [](const V& in, DType) { return V{ops::binary(BinaryOp::Div, in[0], in[1])}; }});
  r.push_back({"binary_scalar div", {normal({6, 9})},
               [](const V& in, DType) { return V{ops::binary_scalar(BinaryOp::Div, in[0], 0.3)}; }});
  r.push_back({"binary add with alpha (in place: add_)", {normal({6, 9}), normal({6, 9})}, [](const V& in, DType) {
                 Tensor a = ops::clone(in[0]);
                 a.add_(in[1], -0.7);
                 return V{a};
               }});
  r.push_back({"relu_backward", {normal({6, 9}), normal({6, 9})},
               [](const V& in, DType) { return V{ops::relu_backward(in[0], in[1])}; }});
  for (bool tanh_form : {false, true}) {
    const std::string form = tanh_form ? " (tanh)" : " (erf)";
    r.push_back({"gelu" + form, {normal({6, 9})}, [tanh_form](const V& in, DType) { return V{ops::gelu(in[0], tanh_form)}; }});
    r.push_back({"gelu_backward" + form, {normal({6, 9}), normal({6, 9})},
                 [tanh_form](const V& in, DType) { return V{ops::gelu_backward(in[0], in[1], tanh_form)}; }});
  }
  r.push_back({"silu", {normal({6, 9})}, [](const V& in, DType) { return V{ops::silu(in[0]), ops::silu(ops::transpose(in[0], 0, 1))}; }});
  r.push_back({"silu_backward", {normal({6, 9}), normal({6, 9})},
               [](const V& in, DType) { return V{ops::silu_backward(in[0], in[1])}; }});
  r.push_back({"masked_fill (int64 and 16-bit masks)", {normal({6, 9}), mask({6, 9}), mask({9})}, [](const V& in, DType) {
                 const Tensor float_mask = ops::to_dtype(in[2], in[0].dtype());
                 return V{ops::masked_fill(in[0], in[1], -1.5), ops::masked_fill(in[0], float_mask, 2.0)};
               }});
  r.push_back({"dropout", {normal({6, 9})}, [](const V& in, DType) { return V{ops::dropout(in[0], 0.3, 11, 5)}; }});
  // ---- reductions ----
  r.push_back({"sum (all, over dims, of columns)", {normal({7, 5, 9})}, [](const V& in, DType) {
                 return V{ops::sum(in[0], {}, false), ops::sum(in[0], {0, 2}, true), ops::sum(in[0], {1}, false)};
               }});
  r.push_back({"argmax", {normal({7, 13})}, [](const V& in, DType) { return V{ops::argmax(in[0], -1), ops::argmax(in[0], 0)}; }});
  r.push_back({"abs_max", {normal({7, 13})}, [](const V& in, DType) { return V{ops::abs_max(in[0])}; }});
  // ---- linear algebra ----
  r.push_back({"matmul", {normal({7, 13}), normal({13, 5})},
               [](const V& in, DType) { return V{ops::matmul(in[0], in[1])}; }});
  r.push_back({"matmul (transposed operands)", {normal({13, 7}), normal({5, 13})},
               [](const V& in, DType) { return V{ops::matmul(ops::transpose(in[0], 0, 1), ops::transpose(in[1], 0, 1))}; }});
  r.push_back({"addmm", {normal({5}), normal({7, 13}), normal({5, 13})},
               [](const V& in, DType) { return V{ops::addmm(in[0], in[1], ops::transpose(in[2], 0, 1))}; }});
  r.push_back({"addmm_relu", {normal({5}), normal({7, 13}), normal({5, 13})},
               [](const V& in, DType) { return V{ops::addmm_relu(in[0], in[1], ops::transpose(in[2], 0, 1))}; }});
  r.push_back({"bmm (broadcast batch)", {normal({3, 2, 7, 11}), normal({2, 11, 5})},
               [](const V& in, DType) { return V{ops::bmm(in[0], in[1])}; }});
  // ---- softmax and cross-entropy ----
  r.push_back({"softmax, log_softmax", {normal({7, 13})}, [](const V& in, DType low) {
                 const Tensor x = rounded_like(ops::binary_scalar(BinaryOp::Mul, in[0], 3.0), low, in[0].dtype());
                 return V{ops::softmax(x, -1), ops::log_softmax(x, -1), ops::softmax(x, 0)};
               }});
  r.push_back({"softmax_backward, log_softmax_backward", {normal({7, 13}), normal({7, 13})}, [](const V& in, DType) {
                 return V{ops::softmax_backward(in[0], in[1], -1), ops::log_softmax_backward(in[0], in[1], -1)};
               }});
  r.push_back({"cross_entropy (mean, sum, none; smoothing, ignore_index)", {normal({9, 13}), index({9}, 13)},
               [smoothing](const V& in, DType) {
                 const Tensor x = ops::binary_scalar(BinaryOp::Mul, in[0], 2.0);
                 return V{ops::cross_entropy(x, in[1]),
                          ops::cross_entropy(x, in[1], CrossEntropyOptions().reduction(Reduction::Sum)),
                          ops::cross_entropy(x, in[1], CrossEntropyOptions().reduction(Reduction::None)),
                          ops::cross_entropy(x, in[1], smoothing)};
               }});
  r.push_back({"cross_entropy_backward", {normal({9, 13}), index({9}, 13), normal({9})}, [smoothing](const V& in, DType) {
                 const Tensor one = ops::view(ops::clone(ops::narrow(in[2], 0, 0, 1)), Shape{});
                 return V{ops::cross_entropy_backward(one, in[0], in[1], smoothing),
                          ops::cross_entropy_backward(in[2], in[0], in[1],
                                                      CrossEntropyOptions().reduction(Reduction::None))};
               }});
  // ---- the transformer's ops ----
  r.push_back({"layer_norm (affine, plain; mean and rstd in float32)", {normal({3, 5, 11}), normal({11}), normal({11})},
               [](const V& in, DType low) {
                 // A mean far from 0, rounded as an input.
                 const Tensor x = rounded_like(ops::binary_scalar(BinaryOp::Add, in[0], 4.0), low, in[0].dtype());
                 const ops::LayerNormOutput a = ops::layer_norm(x, 1, in[1], in[2], 1e-5);
                 const ops::LayerNormOutput b = ops::layer_norm(x, 2, Tensor(), Tensor(), 1e-5);
                 return V{a.out, a.mean, a.rstd, b.out};
               }});
  r.push_back({"layer_norm_backward", {normal({3, 5, 11}), normal({11}), normal({3, 5, 11})}, [](const V& in, DType) {
                 const ops::LayerNormOutput f = ops::layer_norm(in[0], 1, in[1], Tensor(), 1e-5);
                 return ops::layer_norm_backward(in[2], in[0], 1, f.mean, f.rstd, in[1], true, true);
               }});
  r.push_back({"rms_norm (weighted, plain; rstd in float32)", {normal({3, 5, 11}), normal({11})}, [](const V& in, DType) {
                 const ops::RmsNormOutput a = ops::rms_norm(in[0], 1, in[1], 1e-6);
                 const ops::RmsNormOutput b = ops::rms_norm(in[0], 2, Tensor(), 1e-6);
                 return V{a.out, a.rstd, b.out};
               }});
  r.push_back({"rms_norm_backward", {normal({3, 5, 11}), normal({11}), normal({3, 5, 11})}, [](const V& in, DType) {
                 const ops::RmsNormOutput f = ops::rms_norm(in[0], 1, in[1], 1e-6);
                 return ops::rms_norm_backward(in[2], in[0], 1, f.rstd, in[1], true);
               }});
  // Tables of any values: the kernel rotates by whatever cos and sin it is given.
  r.push_back({"rotary_embedding (and its inverse)", {normal({2, 5, 3, 8}), normal({5, 4}), normal({5, 4})},
               [](const V& in, DType) {
                 return V{ops::rotary_embedding(in[0], in[1], in[2], false), ops::rotary_embedding(in[0], in[1], in[2], true)};
               }});
  r.push_back({"embedding", {normal({11, 6}), index({3, 5}, 11)},
               [](const V& in, DType) { return V{ops::embedding(in[0], in[1]), ops::embedding(ops::narrow(in[0], 1, 1, 4), in[1])}; }});
  r.push_back({"embedding_backward (repeated indices)", {normal({3, 8, 6}), index({3, 8}, 5)},
               [](const V& in, DType) { return V{ops::embedding_backward(in[0], in[1], 7)}; }});
  for (bool causal : {false, true}) {
    const std::string c = causal ? " (causal)" : "";
    r.push_back({"attention" + c + ", lse in float32", {normal({2, 3, 9, 5}), normal({2, 3, 11, 5}), normal({2, 3, 11, 7})},
                 [causal](const V& in, DType) {
                   return ops::attention(in[0], in[1], in[2], 0.4, causal, 0.0, 0, 0);
                 }});
    r.push_back({"attention with dropout" + c, {normal({2, 9, 5}), normal({2, 11, 5}), normal({2, 11, 7})},
                 [causal](const V& in, DType) {
                   return V{ops::attention(in[0], in[1], in[2], 0.4, causal, 0.2, 3, 1)[0]};
                 }});
    r.push_back({"attention_backward" + c, {normal({2, 9, 5}), normal({2, 11, 5}), normal({2, 11, 7}), normal({2, 9, 7})},
                 [causal](const V& in, DType low) {
                   // out and lse from float32's forward on the same inputs, out rounded to
                   // the 16-bit dtype in both runs: backward's inputs are the same numbers.
                   const auto wide = [](const Tensor& t) { return ops::to_dtype(t, DType::Float32); };
                   const V f = ops::attention(wide(in[0]), wide(in[1]), wide(in[2]), 0.4, causal, 0.1, 9, 2);
                   const Tensor out = rounded_like(f[0], low, in[0].dtype());
                   return ops::attention_backward(in[3], in[0], in[1], in[2], out, f[1], 0.4, causal, 0.1, 9, 2);
                 }});
  }
  return r;
}

}  // namespace mg::testing
