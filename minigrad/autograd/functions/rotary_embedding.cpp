// Rotary position embedding (RoPE), forward beside backward. The op is a rotation of each
// pair of features by an angle of its position, so its Jacobian is orthogonal: the gradient
// is the same rotation by the opposite angles, and backward saves nothing but the tables.
#include <minigrad/autograd/functions.h>
#include <minigrad/autograd/node.h>
#include <minigrad/core/ops.h>

namespace mg {

Tensor rotary_embedding(const Tensor& x, const Tensor& cos, const Tensor& sin) {
  MG_CHECK(!cos.requires_grad() && !sin.requires_grad(),
           "rotary_embedding: cos and sin are tables of the positions, not differentiated; got tables that "
           "require grad (detach them)");
  Tensor out = ops::rotary_embedding(x, cos, sin, /*inverse=*/false);
  // The tables are constants (no version to check): kept as they are.
  record_function("RotaryEmbeddingBackward", {x}, {out}, [cos, sin](const BackwardArgs& g) {
    return std::vector<Tensor>{ops::rotary_embedding(g.grad(), cos, sin, /*inverse=*/true)};
  });
  return out;
}

}  // namespace mg
