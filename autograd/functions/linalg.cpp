// Matrix products. For C = A @ B: dA = dC @ B^T and dB = A^T @ dC. The transposes
// are views, which the backends hand to their GEMM as flags rather than copies.
#include <minigrad/autograd/functions.h>
#include <minigrad/autograd/node.h>
#include <minigrad/core/ops.h>

namespace mg {

Tensor matmul(const Tensor& a, const Tensor& b) {
  Tensor out = ops::matmul(a, b);
  record_function("MatmulBackward", {a, b}, {out}, [a = a.detach(), b = b.detach()](const BackwardArgs& g) {
    Tensor ga = g.needs(0) ? ops::matmul(g.grad(), ops::transpose(b, 0, 1)) : Tensor();
    Tensor gb = g.needs(1) ? ops::matmul(ops::transpose(a, 0, 1), g.grad()) : Tensor();
    return std::vector<Tensor>{ga, gb};
  });
  return out;
}

// One node for the whole layer, as PyTorch's addmm: y = x @ w^T + b. Its backward
// writes each gradient in the layout of its input: dx = dy @ w, dw = dy^T @ x (a
// contiguous [out, in], not the transpose of x^T @ dy that a composed matmul would give
// and AccumulateGrad would then have to copy), db = dy summed over the batch.
Tensor linear(const Tensor& x, const Tensor& w, const Tensor& b) {
  MG_CHECK(x.dim() == 2 && w.dim() == 2,
           "linear: expected input [batch, in] and weight [out, in], got {} and {}", x.shape(),
           w.shape());
  MG_CHECK(x.size(1) == w.size(1),
           "linear: input of shape {} has {} features but the weight of shape {} expects {}",
           x.shape(), x.size(1), w.shape(), w.size(1));
  if (b.defined()) {
    MG_CHECK(b.dim() == 1 && b.size(0) == w.size(0),
             "linear: bias of shape {} does not match weight of shape {} (expected [{}])",
             b.shape(), w.shape(), w.size(0));
  }
  const Tensor wt = ops::transpose(w, 0, 1);
  Tensor y = b.defined() ? ops::addmm(b, x, wt) : ops::matmul(x, wt);
  std::vector<Tensor> inputs{x, w};
  if (b.defined()) inputs.push_back(b);
  record_function("LinearBackward", inputs, {y},
                  [x = x.detach(), w = w.detach(), has_bias = b.defined()](const BackwardArgs& g) {
                    const Tensor& dy = g.grad();
                    std::vector<Tensor> grads;
                    grads.push_back(g.needs(0) ? ops::matmul(dy, w) : Tensor());
                    grads.push_back(g.needs(1) ? ops::matmul(ops::transpose(dy, 0, 1), x) : Tensor());
                    if (has_bias) grads.push_back(g.needs(2) ? ops::sum(dy, {0}, false) : Tensor());
                    return grads;
                  });
  return y;
}

}  // namespace mg
