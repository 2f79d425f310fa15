// The transformer's elementwise ops and softmax, each forward beside its backward: tanh,
// gelu, silu, softmax over any dim, masked_fill and dropout.
#include <minigrad/autograd/autocast.h>
#include <minigrad/autograd/functions.h>
#include <minigrad/autograd/node.h>
#include <minigrad/autograd/saved_tensor.h>
#include <minigrad/core/generator.h>
#include <minigrad/core/ops.h>

namespace mg {

Tensor tanh(const Tensor& x) {
  Tensor out = ops::tanh(x);
  // d tanh(x) = 1 - tanh(x)^2: the output is all backward needs.
  record_function("TanhBackward", {x}, {out}, [y = SavedTensor(out)](const BackwardArgs& g) {
    const Tensor& v = y.unpack(g);
    const Tensor one_minus_sq =
        ops::binary_scalar(BinaryOp::Add, ops::unary(UnaryOp::Neg, ops::binary(BinaryOp::Mul, v, v)), 1.0);
    return std::vector<Tensor>{ops::binary(BinaryOp::Mul, g.grad(), one_minus_sq)};
  });
  return out;
}

Tensor gelu(const Tensor& x, const std::string& approximate) {
  MG_CHECK(approximate == "none" || approximate == "tanh",
           "gelu: approximate must be \"none\" or \"tanh\", got \"{}\"", approximate);
  const bool tanh_form = approximate == "tanh";
  Tensor out = ops::gelu(x, tanh_form);
  record_function("GeluBackward", {x}, {out}, [x = SavedTensor(x), tanh_form](const BackwardArgs& g) {
    return std::vector<Tensor>{ops::gelu_backward(g.grad(), x.unpack(g), tanh_form)};
  });
  return out;
}

Tensor silu(const Tensor& x) {
  Tensor out = ops::silu(x);
  // d silu(x) = s (1 + x (1 - s)), s = sigmoid(x): backward needs x alone.
  record_function("SiluBackward", {x}, {out}, [x = SavedTensor(x)](const BackwardArgs& g) {
    return std::vector<Tensor>{ops::silu_backward(g.grad(), x.unpack(g))};
  });
  return out;
}

Tensor softmax(const Tensor& x_in, int64_t dim) {
  const Tensor x = autocast::cast_input(autocast::AutocastOp::Softmax, x_in);
  Tensor out = ops::softmax(x, dim);
  record_function("SoftmaxBackward", {x}, {out}, [y = SavedTensor(out), dim](const BackwardArgs& g) {
    return std::vector<Tensor>{ops::softmax_backward(g.grad(), y.unpack(g), dim)};
  });
  return out;
}

Tensor masked_fill(const Tensor& x, const Tensor& mask, double value) {
  Tensor out = ops::masked_fill(x, mask, value);
  // The filled elements no longer depend on x: their gradient is 0, the others' passes.
  record_function("MaskedFillBackward", {x}, {out}, [mask = SavedTensor(mask)](const BackwardArgs& g) {
    return std::vector<Tensor>{ops::masked_fill(g.grad(), mask.unpack(g), 0.0)};
  });
  return out;
}

Tensor dropout(const Tensor& x, double p, bool training, Generator* gen) {
  MG_CHECK(p >= 0.0 && p <= 1.0, "dropout: probability has to be between 0 and 1, but got {}", p);
  if (!training || p == 0.0) return x;
  if (p == 1.0) return mul(x, 0.0);  // every element dropped (torch: zeros, no 1/0 scale)
  ops::check_float("dropout", x);
  Generator& generator = gen != nullptr ? *gen : default_generator();
  // One Philox block gives four uniforms (core/philox.h: uniform).
  const auto draw = generator.reserve((static_cast<uint64_t>(x.numel()) + 3) / 4);
  Tensor out = ops::dropout(x, p, draw.seed, draw.offset);
  // dropout is x * mask / (1 - p), linear in x: its backward applies the same mask to the
  // gradient, redrawn from the same seed and offset rather than kept in memory.
  record_function("DropoutBackward", {x}, {out},
                  [p, seed = draw.seed, offset = draw.offset](const BackwardArgs& g) {
                    return std::vector<Tensor>{ops::dropout(g.grad(), p, seed, offset)};
                  });
  return out;
}

}  // namespace mg
