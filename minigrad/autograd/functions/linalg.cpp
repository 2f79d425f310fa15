// Matrix products. For C = A @ B: dA = dC @ B^T and dB = A^T @ dC. The transposes
// are views, which the backends hand to their GEMM as flags rather than copies. matmul
// follows torch.matmul's rules for 1-D and N-D operands by views around two ops: the
// 2-D product and the batched one (whose broadcast batch dimensions sum their gradient
// back, as any broadcast does).
#include <minigrad/autograd/autocast.h>
#include <minigrad/autograd/functions.h>
#include <minigrad/autograd/node.h>
#include <minigrad/autograd/saved_tensor.h>
#include <minigrad/core/ops.h>

namespace mg {

namespace {

Tensor matmul_2d(const Tensor& a, const Tensor& b) {
  Tensor out = ops::matmul(a, b);
  record_function("MatmulBackward", {a, b}, {out},
                  [a = SavedTensor(a), b = SavedTensor(b)](const BackwardArgs& g) {
                    Tensor ga = g.needs(0) ? ops::matmul(g.grad(), ops::transpose(b.unpack(g), 0, 1))
                                           : Tensor();
                    Tensor gb = g.needs(1) ? ops::matmul(ops::transpose(a.unpack(g), 0, 1), g.grad())
                                           : Tensor();
                    return std::vector<Tensor>{ga, gb};
                  });
  return out;
}

// a[..., m, k] @ b[..., k, n], the batch dimensions broadcast.
Tensor matmul_batched(const Tensor& a, const Tensor& b) {
  Tensor out = ops::bmm(a, b);
  record_function("BmmBackward", {a, b}, {out},
                  [a = SavedTensor(a), b = SavedTensor(b), sa = a.shape(), sb = b.shape()](
                      const BackwardArgs& g) {
                    Tensor ga = g.needs(0)
                                    ? ops::sum_to(ops::bmm(g.grad(), ops::transpose(b.unpack(g), -1, -2)), sa)
                                    : Tensor();
                    Tensor gb = g.needs(1)
                                    ? ops::sum_to(ops::bmm(ops::transpose(a.unpack(g), -1, -2), g.grad()), sb)
                                    : Tensor();
                    return std::vector<Tensor>{ga, gb};
                  });
  return out;
}

// shape without dimension d (negative: from the end).
Shape without(const Shape& shape, int64_t d) {
  std::vector<int64_t> sizes = shape.sizes();
  sizes.erase(sizes.begin() + (d < 0 ? static_cast<int64_t>(sizes.size()) + d : d));
  return Shape(std::move(sizes));
}

}  // namespace

Tensor matmul(const Tensor& a_in, const Tensor& b_in) {
  const std::vector<Tensor> cast = autocast::cast_inputs(autocast::AutocastOp::Matmul, {a_in, b_in});
  const Tensor &a = cast[0], &b = cast[1];
  MG_CHECK(a.dim() >= 1 && b.dim() >= 1,
           "matmul: both arguments need at least 1 dimension, got shapes {} and {}", a.shape(),
           b.shape());
  if (a.dim() == 2 && b.dim() == 2) return matmul_2d(a, b);
  const int64_t k = a.size(-1);
  MG_CHECK(b.size(b.dim() == 1 ? 0 : -2) == k,
           "matmul: shapes {} and {} cannot be multiplied (inner dimensions {} and {} differ)",
           a.shape(), b.shape(), k, b.size(b.dim() == 1 ? 0 : -2));
  if (a.dim() == 1 && b.dim() == 1)  // a dot product
    return reshape(matmul_2d(reshape(a, Shape{1, k}), reshape(b, Shape{k, 1})), Shape{});
  if (a.dim() == 1) {  // [k] as [1, k]; the 1 is removed from the result
    const Tensor r = matmul(reshape(a, Shape{1, k}), b);
    return reshape(r, without(r.shape(), -2));
  }
  if (b.dim() == 1) {  // [k] as [k, 1]
    const Tensor r = matmul(a, reshape(b, Shape{k, 1}));
    return reshape(r, without(r.shape(), -1));
  }
  if (b.dim() == 2) {
    // [..., m, k] @ [k, n] is one matrix product of the rows: [(...) * m, k] @ [k, n].
    std::vector<int64_t> out_sizes = a.shape().sizes();
    out_sizes.back() = b.size(1);
    return reshape(matmul_2d(reshape(a, Shape{-1, k}), b), Shape(out_sizes));
  }
  return matmul_batched(a, b);
}

namespace {

void check_linear(const char* op, const Tensor& x, const Tensor& w, const Tensor& b) {
  MG_CHECK(x.dim() == 2 && w.dim() == 2,
           "{}: expected input [batch, in] and weight [out, in], got {} and {}", op, x.shape(),
           w.shape());
  MG_CHECK(x.size(1) == w.size(1),
           "{}: input of shape {} has {} features but the weight of shape {} expects {}", op,
           x.shape(), x.size(1), w.shape(), w.size(1));
  if (b.defined()) {
    MG_CHECK(b.dim() == 1 && b.size(0) == w.size(0),
             "{}: bias of shape {} does not match weight of shape {} (expected [{}])", op,
             b.shape(), w.shape(), w.size(0));
  }
}

// The gradients of y = x @ w^T + b, given dy, each in the layout of its input: dx = dy @ w,
// dw = dy^T @ x (a contiguous [out, in], not the transpose of x^T @ dy that a composed
// matmul would give and AccumulateGrad would then have to copy), db = dy summed over
// the batch.
std::vector<Tensor> linear_grads(const BackwardArgs& g, const Tensor& dy, const SavedTensor& x,
                                 const SavedTensor& w, bool has_bias) {
  std::vector<Tensor> grads;
  grads.push_back(g.needs(0) ? ops::matmul(dy, w.unpack(g)) : Tensor());
  grads.push_back(g.needs(1) ? ops::matmul(ops::transpose(dy, 0, 1), x.unpack(g)) : Tensor());
  if (has_bias) grads.push_back(g.needs(2) ? ops::sum(dy, {0}, false) : Tensor());
  return grads;
}

}  // namespace

namespace {

// Records linear's node (LinearBackward) for x, w, b producing y.
void record_linear(const Tensor& x, const Tensor& w, const Tensor& b, const Tensor& y) {
  std::vector<Tensor> inputs{x, w};
  if (b.defined()) inputs.push_back(b);
  record_function("LinearBackward", inputs, {y},
                  [x = SavedTensor(x), w = SavedTensor(w), has_bias = b.defined()](const BackwardArgs& g) {
                    return linear_grads(g, g.grad(), x, w, has_bias);
                  });
}

}  // namespace

// One node for the whole layer, as PyTorch's addmm: y = x @ w^T + b. An input of another
// rank than 2 is seen as the matrix of its rows ([B, T, C] as [B * T, C]) around it.
Tensor linear(const Tensor& x_in, const Tensor& w_in, const Tensor& b_in) {
  const std::vector<Tensor> cast = autocast::cast_inputs(autocast::AutocastOp::Linear, {x_in, w_in, b_in});
  const Tensor &x = cast[0], &w = cast[1], &b = cast[2];
  if (x.dim() != 2 && x.dim() >= 1 && w.dim() == 2) {
    MG_CHECK(x.size(-1) == w.size(1),
             "linear: input of shape {} has {} features but the weight of shape {} expects {}",
             x.shape(), x.size(-1), w.shape(), w.size(1));
    std::vector<int64_t> out_sizes = x.shape().sizes();
    out_sizes.back() = w.size(0);
    return reshape(linear(reshape(x, Shape{-1, w.size(1)}), w, b), Shape(out_sizes));
  }
  check_linear("linear", x, w, b);
  const Tensor wt = ops::transpose(w, 0, 1);
  Tensor y = b.defined() ? ops::addmm(b, x, wt) : ops::matmul(x, wt);
  record_linear(x, w, b, y);
  return y;
}

// y = relu(x @ w^T + b), computed in one op; the pre-activation never exists.
//
// The backward graph is still the unfused one, LinearBackward then ReluBackward, and
// not one node: the engine frees a node's incoming gradient and saved tensors once it
// has run, so ReluBackward's dy and y are gone before LinearBackward allocates dx and
// dw. A single node would hold dy, y and the masked gradient through its matmuls: two
// activations more at the peak of backward (512 MiB for wide_mlp on the H200). In the
// graph, an alias of y stands for the pre-activation: only its shape, dtype and device
// are read, and ReluBackward masks with y itself (relu(v) > 0 exactly where v > 0).
Tensor linear_relu(const Tensor& x_in, const Tensor& w_in, const Tensor& b_in) {
  const std::vector<Tensor> cast = autocast::cast_inputs(autocast::AutocastOp::Linear, {x_in, w_in, b_in});
  const Tensor &x = cast[0], &w = cast[1], &b = cast[2];
  MG_CHECK(b.defined(), "linear_relu: the bias is an undefined tensor (use relu(linear(x, w)) "
                        "for a layer without bias)");
  check_linear("linear_relu", x, w, b);
  Tensor y = ops::addmm_relu(b, x, ops::transpose(w, 0, 1));
  if (!needs_graph({x, w, b})) return y;
  const Tensor pre = y.detach();
  record_linear(x, w, b, pre);
  record_function("ReluBackward", {pre}, {y}, [y = SavedTensor(y)](const BackwardArgs& g) {
    return std::vector<Tensor>{ops::relu_backward(g.grad(), y.unpack(g))};
  });
  return y;
}

}  // namespace mg
