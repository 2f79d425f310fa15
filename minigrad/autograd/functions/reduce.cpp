// Sums and means: the gradient of a sum is the output gradient spread back (expanded)
// over the summed dimensions.
#include <minigrad/autograd/autocast.h>
#include <minigrad/autograd/functions.h>
#include <minigrad/autograd/node.h>
#include <minigrad/core/ops.h>

namespace mg {
namespace {

// The output gradient of a sum, broadcast back to the input's shape.
Tensor spread(const Tensor& grad, const Shape& input_shape, const std::vector<int64_t>& dims,
              bool keepdim) {
  // A 0-dim input (summed over its dim 0 or -1) has no dims to re-insert.
  if (keepdim || dims.empty() || input_shape.dim() == 0) return ops::expand(grad, input_shape);
  // Re-insert the reduced dims as size 1, then expand.
  std::vector<int64_t> sizes = input_shape.sizes();
  for (int64_t d : dims) sizes[static_cast<size_t>(wrap_dim(d, input_shape.dim(), "sum"))] = 1;
  return ops::expand(ops::view(grad, Shape(sizes)), input_shape);
}

int64_t count_reduced(const Shape& shape, const std::vector<int64_t>& dims) {
  if (dims.empty() || shape.dim() == 0) return shape.numel();
  int64_t n = 1;
  for (int64_t d : dims) n *= shape[wrap_dim(d, shape.dim(), "mean")];
  return n;
}

}  // namespace

Tensor sum(const Tensor& x_in, const std::vector<int64_t>& dims, bool keepdim) {
  const Tensor x = autocast::cast_input(autocast::AutocastOp::Sum, x_in);
  Tensor out = ops::sum(x, dims, keepdim);
  record_function("SumBackward", {x}, {out}, [shape = x.shape(), dims, keepdim](const BackwardArgs& g) {
    return std::vector<Tensor>{spread(g.grad(), shape, dims, keepdim)};
  });
  return out;
}

Tensor sum(const Tensor& x) { return sum(x, {}, false); }

Tensor mean(const Tensor& x_in, const std::vector<int64_t>& dims, bool keepdim) {
  const Tensor x = autocast::cast_input(autocast::AutocastOp::Mean, x_in);
  ops::check_float("mean", x);
  // The sum first: it refuses a dimension named twice, which count_reduced would count twice.
  const Tensor total = ops::sum(x, dims, keepdim);
  const int64_t n = count_reduced(x.shape(), dims);
  // No elements: 0 * (1 / 0) is NaN, torch's mean of nothing; backward spreads onto nothing.
  const double scale = 1.0 / static_cast<double>(n);
  Tensor out = ops::binary_scalar(BinaryOp::Mul, total, scale);
  record_function("MeanBackward", {x}, {out},
                  [shape = x.shape(), dims, keepdim, scale](const BackwardArgs& g) {
                    Tensor scaled = ops::binary_scalar(BinaryOp::Mul, g.grad(), scale);
                    return std::vector<Tensor>{spread(scaled, shape, dims, keepdim)};
                  });
  return out;
}

Tensor mean(const Tensor& x) { return mean(x, {}, false); }

}  // namespace mg
