// Layer normalisation, fused: forward normalises each row and keeps its mean and
// 1/sqrt(var + eps); backward computes the input's, weight's and bias's gradients from
// those in one pass (the composition of mean, sub, mul, rsqrt would save five tensors).
// RMS normalisation (the Llama's), the same without the mean and the bias.
#include <fmt/ranges.h>

#include <minigrad/autograd/autocast.h>
#include <minigrad/autograd/functions.h>
#include <minigrad/autograd/node.h>
#include <minigrad/autograd/saved_tensor.h>
#include <minigrad/core/ops.h>

namespace mg {

Tensor layer_norm(const Tensor& x_in, const Shape& normalized_shape, const Tensor& weight_in,
                  const Tensor& bias_in, double eps) {
  const std::vector<Tensor> cast =
      autocast::cast_inputs(autocast::AutocastOp::LayerNorm, {x_in, weight_in, bias_in});
  const Tensor &x = cast[0], &weight = cast[1], &bias = cast[2];
  const int64_t nd = normalized_shape.dim();
  bool fits = nd >= 1 && nd <= x.dim();
  for (int64_t i = 0; fits && i < nd; ++i)
    fits = x.size(x.dim() - nd + i) == normalized_shape[i];
  MG_CHECK(fits,
           "layer_norm: normalized_shape {} must be the trailing dimensions of the input, got "
           "input of shape {}",
           normalized_shape, x.shape());
  ops::LayerNormOutput r = ops::layer_norm(x, nd, weight, bias, eps);
  std::vector<Tensor> inputs{x};
  if (weight.defined()) inputs.push_back(weight);
  if (bias.defined()) inputs.push_back(bias);
  record_function(
      "LayerNormBackward", inputs, {r.out},
      [x = SavedTensor(x), weight = weight.defined() ? SavedTensor(weight) : SavedTensor(),
       has_weight = weight.defined(), has_bias = bias.defined(), mean = SavedTensor(r.mean),
       rstd = SavedTensor(r.rstd), nd](const BackwardArgs& g) {
        const size_t weight_at = 1, bias_at = has_weight ? 2 : 1;
        std::vector<Tensor> grads = ops::layer_norm_backward(
            g.grad(), x.unpack(g), nd, mean.unpack(g), rstd.unpack(g),
            has_weight ? weight.unpack(g) : Tensor(), has_weight && g.needs(weight_at),
            has_bias && g.needs(bias_at));
        std::vector<Tensor> result{grads[0]};
        if (has_weight) result.push_back(grads[1]);
        if (has_bias) result.push_back(grads[2]);
        return result;
      });
  return r.out;
}

Tensor layer_norm(const Tensor& x, const std::vector<int64_t>& normalized_shape,
                  const Tensor& weight, const Tensor& bias, double eps) {
  return layer_norm(x, Shape(normalized_shape), weight, bias, eps);
}

Tensor layer_norm(const Tensor& x, std::initializer_list<int64_t> normalized_shape,
                  const Tensor& weight, const Tensor& bias, double eps) {
  return layer_norm(x, Shape(std::vector<int64_t>(normalized_shape)), weight, bias, eps);
}

Tensor rms_norm(const Tensor& x, const Shape& normalized_shape, const Tensor& weight, double eps) {
  const int64_t nd = normalized_shape.dim();
  bool fits = nd >= 1 && nd <= x.dim();
  for (int64_t i = 0; fits && i < nd; ++i) fits = x.size(x.dim() - nd + i) == normalized_shape[i];
  MG_CHECK(fits, "rms_norm: normalized_shape {} must be the trailing dimensions of the input, got input of shape {}",
           normalized_shape, x.shape());
  MG_CHECK(eps >= 0.0, "rms_norm: eps must be >= 0, got {}", eps);
  ops::RmsNormOutput r = ops::rms_norm(x, nd, weight, eps);
  std::vector<Tensor> inputs{x};
  if (weight.defined()) inputs.push_back(weight);
  record_function("RmsNormBackward", inputs, {r.out},
                  [x = SavedTensor(x), weight = weight.defined() ? SavedTensor(weight) : SavedTensor(),
                   has_weight = weight.defined(), rstd = SavedTensor(r.rstd), nd](const BackwardArgs& g) {
                    std::vector<Tensor> grads =
                        ops::rms_norm_backward(g.grad(), x.unpack(g), nd, rstd.unpack(g),
                                               has_weight ? weight.unpack(g) : Tensor(), has_weight && g.needs(1));
                    if (!has_weight) grads.pop_back();
                    return grads;
                  });
  return r.out;
}

Tensor rms_norm(const Tensor& x, std::initializer_list<int64_t> normalized_shape, const Tensor& weight,
                double eps) {
  return rms_norm(x, Shape(std::vector<int64_t>(normalized_shape)), weight, eps);
}

}  // namespace mg
