// Matrix products. For C = A @ B: dA = dC @ B^T and dB = A^T @ dC. The transposes
// are views, which the backends hand to their GEMM as flags rather than copies.
#include <minigrad/autograd/functions.h>
#include <minigrad/autograd/node.h>
#include <minigrad/autograd/saved_tensor.h>
#include <minigrad/core/ops.h>

namespace mg {

Tensor matmul(const Tensor& a, const Tensor& b) {
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

// One node for the whole layer, as PyTorch's addmm: y = x @ w^T + b.
Tensor linear(const Tensor& x, const Tensor& w, const Tensor& b) {
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
Tensor linear_relu(const Tensor& x, const Tensor& w, const Tensor& b) {
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
