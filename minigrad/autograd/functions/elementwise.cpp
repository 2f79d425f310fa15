// Elementwise ops: forward and backward side by side.
// A broadcast input's gradient is summed back to that input's shape (ops::sum_to).
#include <utility>
#include <vector>

#include <minigrad/autograd/autocast.h>
#include <minigrad/autograd/functions.h>
#include <minigrad/autograd/node.h>
#include <minigrad/autograd/saved_tensor.h>
#include <minigrad/core/ops.h>

namespace mg {

using ops::sum_to;

namespace {
// torch's type promotion for two tensors: both converted (differentiably) to their common
// dtype; the conversions' backward brings each gradient back to its operand's dtype.
std::pair<Tensor, Tensor> promoted(const Tensor& a, const Tensor& b) {
  const DType common = promote_types(a.dtype(), b.dtype());
  return {to(a, common), to(b, common)};
}

// The tensor in the dtype of its result with scalar s: an int64 tensor meets a
// floating-point scalar in float32, whatever the scalar's value (promotion by category).
Tensor promoted_for_scalar(const Tensor& a, const Scalar& s) { return to(a, promote_types(a.dtype(), s)); }

// x op s for an x already in the result's dtype. An int64 x takes an integer s (its
// promotion saw to that), passed exactly even past 2^53, where a double would round it.
Tensor scalar_op(BinaryOp op, const Tensor& x, const Scalar& s) {
  constexpr int64_t kExactInDouble = int64_t{1} << 53;
  if (x.dtype() == DType::Int64 && (s.to_int64() > kExactInDouble || s.to_int64() < -kExactInDouble)) {
    const Tensor value = ops::copy_to(from_vector(std::vector<int64_t>{s.to_int64()}, Shape{}), x.device());
    return ops::binary(op, x, value);
  }
  return ops::binary_scalar(op, x, s.to_double());
}
}  // namespace

Tensor add(const Tensor& a_in, const Tensor& b_in) {
  const auto [a, b] = promoted(a_in, b_in);
  Tensor out = ops::binary(BinaryOp::Add, a, b);
  record_function("AddBackward", {a, b}, {out}, [sa = a.shape(), sb = b.shape()](const BackwardArgs& g) {
    return std::vector<Tensor>{sum_to(g.grad(), sa), sum_to(g.grad(), sb)};
  });
  return out;
}

Tensor sub(const Tensor& a_in, const Tensor& b_in) {
  const auto [a, b] = promoted(a_in, b_in);
  Tensor out = ops::binary(BinaryOp::Sub, a, b);
  record_function("SubBackward", {a, b}, {out}, [sa = a.shape(), sb = b.shape()](const BackwardArgs& g) {
    Tensor gb = g.needs(1) ? sum_to(ops::unary(UnaryOp::Neg, g.grad()), sb) : Tensor();
    return std::vector<Tensor>{sum_to(g.grad(), sa), gb};
  });
  return out;
}

Tensor mul(const Tensor& a_in, const Tensor& b_in) {
  const auto [a, b] = promoted(a_in, b_in);
  Tensor out = ops::binary(BinaryOp::Mul, a, b);
  record_function("MulBackward", {a, b}, {out},
                  [a = SavedTensor(a), b = SavedTensor(b), sa = a.shape(), sb = b.shape()](
                      const BackwardArgs& g) {
                    // Each factor's gradient needs the other factor only.
                    Tensor ga = g.needs(0) ? sum_to(ops::binary(BinaryOp::Mul, g.grad(), b.unpack(g)), sa)
                                           : Tensor();
                    Tensor gb = g.needs(1) ? sum_to(ops::binary(BinaryOp::Mul, g.grad(), a.unpack(g)), sb)
                                           : Tensor();
                    return std::vector<Tensor>{ga, gb};
                  });
  return out;
}

Tensor div(const Tensor& a_in, const Tensor& b_in) {
  auto [a, b] = promoted(a_in, b_in);
  if (a.dtype() == DType::Int64) {  // true division: integers divide as float32
    a = to(a, DType::Float32);
    b = to(b, DType::Float32);
  }
  Tensor out = ops::binary(BinaryOp::Div, a, b);
  record_function("DivBackward", {a, b}, {out},
                  [a = SavedTensor(a), b = SavedTensor(b), sa = a.shape(), sb = b.shape()](
                      const BackwardArgs& g) {
    // d(a/b)/da = 1/b ; d(a/b)/db = -a/b^2
    const Tensor& vb = b.unpack(g);
    Tensor ga = g.needs(0) ? sum_to(ops::binary(BinaryOp::Div, g.grad(), vb), sa) : Tensor();
    Tensor gb;
    if (g.needs(1)) {
      Tensor b2 = ops::binary(BinaryOp::Mul, vb, vb);
      Tensor t = ops::binary(BinaryOp::Div, ops::binary(BinaryOp::Mul, g.grad(), a.unpack(g)), b2);
      gb = sum_to(ops::unary(UnaryOp::Neg, t), sb);
    }
    return std::vector<Tensor>{ga, gb};
  });
  return out;
}

Tensor add(const Tensor& a_in, Scalar b) {
  const Tensor a = promoted_for_scalar(a_in, b);
  Tensor out = scalar_op(BinaryOp::Add, a, b);
  record_function("AddScalarBackward", {a}, {out},
                  [](const BackwardArgs& g) { return std::vector<Tensor>{g.grad()}; });
  return out;
}

Tensor sub(const Tensor& a_in, Scalar b) {
  const Tensor a = promoted_for_scalar(a_in, b);
  Tensor out = scalar_op(BinaryOp::Sub, a, b);
  record_function("SubScalarBackward", {a}, {out},
                  [](const BackwardArgs& g) { return std::vector<Tensor>{g.grad()}; });
  return out;
}

Tensor mul(const Tensor& a_in, Scalar b) {
  const Tensor a = promoted_for_scalar(a_in, b);
  Tensor out = scalar_op(BinaryOp::Mul, a, b);
  record_function("MulScalarBackward", {a}, {out}, [b = b.to_double()](const BackwardArgs& g) {
    return std::vector<Tensor>{ops::binary_scalar(BinaryOp::Mul, g.grad(), b)};
  });
  return out;
}

Tensor div(const Tensor& a_in, Scalar b) {
  Tensor a = promoted_for_scalar(a_in, b);
  if (a.dtype() == DType::Int64) a = to(a, DType::Float32);  // true division
  // a / b itself, not a * (1 / b): the quotient torch computes, correctly rounded.
  Tensor out = ops::binary_scalar(BinaryOp::Div, a, b.to_double());
  record_function("DivScalarBackward", {a}, {out}, [b = b.to_double()](const BackwardArgs& g) {
    return std::vector<Tensor>{ops::binary_scalar(BinaryOp::Div, g.grad(), b)};
  });
  return out;
}

// b - a as (-a) + b: negation is exact, so this is b - a's rounding (and int64's wrap).
Tensor rsub(const Tensor& a, Scalar b) { return add(neg(promoted_for_scalar(a, b)), b); }

// torch's `b / a` is reciprocal(a) * b, two roundings; this takes the same two.
Tensor rdiv(const Tensor& a_in, Scalar b) {
  const Tensor a = a_in.dtype() == DType::Int64 ? to(a_in, DType::Float32) : a_in;
  const Tensor one = ops::copy_to(scalar_tensor(1.0, a.dtype()), a.device());
  return mul(div(one, a), b);
}

Tensor neg(const Tensor& x) {
  Tensor out = ops::unary(UnaryOp::Neg, x);
  record_function("NegBackward", {x}, {out}, [](const BackwardArgs& g) {
    return std::vector<Tensor>{ops::unary(UnaryOp::Neg, g.grad())};
  });
  return out;
}

Tensor exp(const Tensor& x_in) {
  const Tensor x = autocast::cast_input(autocast::AutocastOp::Exp, x_in);
  Tensor out = ops::unary(UnaryOp::Exp, x);
  // d exp(x) = exp(x): save the output (SavedTensor detaches it: the node must not own itself).
  record_function("ExpBackward", {x}, {out}, [y = SavedTensor(out)](const BackwardArgs& g) {
    return std::vector<Tensor>{ops::binary(BinaryOp::Mul, g.grad(), y.unpack(g))};
  });
  return out;
}

Tensor log(const Tensor& x_in) {
  const Tensor x = autocast::cast_input(autocast::AutocastOp::Log, x_in);
  Tensor out = ops::unary(UnaryOp::Log, x);
  record_function("LogBackward", {x}, {out}, [x = SavedTensor(x)](const BackwardArgs& g) {
    return std::vector<Tensor>{ops::binary(BinaryOp::Div, g.grad(), x.unpack(g))};
  });
  return out;
}

Tensor relu(const Tensor& x) {
  Tensor out = ops::unary(UnaryOp::Relu, x);
  // relu(x) > 0 exactly where x > 0 (and relu(NaN) is NaN), so the output serves as the
  // mask, as PyTorch's threshold_backward(grad, result, 0).
  record_function("ReluBackward", {x}, {out}, [y = SavedTensor(out)](const BackwardArgs& g) {
    return std::vector<Tensor>{ops::relu_backward(g.grad(), y.unpack(g))};
  });
  return out;
}

Tensor operator+(const Tensor& a, const Tensor& b) { return add(a, b); }
Tensor operator-(const Tensor& a, const Tensor& b) { return sub(a, b); }
Tensor operator*(const Tensor& a, const Tensor& b) { return mul(a, b); }
Tensor operator/(const Tensor& a, const Tensor& b) { return div(a, b); }
Tensor operator-(const Tensor& x) { return neg(x); }
Tensor operator+(const Tensor& a, Scalar b) { return add(a, b); }
Tensor operator+(Scalar a, const Tensor& b) { return add(b, a); }
Tensor operator-(const Tensor& a, Scalar b) { return sub(a, b); }
Tensor operator-(Scalar a, const Tensor& b) { return rsub(b, a); }
Tensor operator*(const Tensor& a, Scalar b) { return mul(a, b); }
Tensor operator*(Scalar a, const Tensor& b) { return mul(b, a); }
Tensor operator/(const Tensor& a, Scalar b) { return div(a, b); }
Tensor operator/(Scalar a, const Tensor& b) { return rdiv(b, a); }

}  // namespace mg
