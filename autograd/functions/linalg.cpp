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

Tensor linear(const Tensor& x, const Tensor& w, const Tensor& b) {
  MG_CHECK(x.dim() == 2 && w.dim() == 2,
           "linear: expected input [batch, in] and weight [out, in], got {} and {}", x.shape(),
           w.shape());
  MG_CHECK(x.size(1) == w.size(1),
           "linear: input of shape {} has {} features but the weight of shape {} expects {}",
           x.shape(), x.size(1), w.shape(), w.size(1));
  Tensor y = matmul(x, transpose(w, 0, 1));
  if (!b.defined()) return y;
  MG_CHECK(b.dim() == 1 && b.size(0) == w.size(0),
           "linear: bias of shape {} does not match weight of shape {} (expected [{}])", b.shape(),
           w.shape(), w.size(0));
  return add(y, b);
}

}  // namespace mg
