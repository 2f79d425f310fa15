// Embedding: forward gathers rows of the table, backward scatters the output gradient
// back into a zeroed table, summing repeated indices in index order.
#include <minigrad/autograd/functions.h>
#include <minigrad/autograd/node.h>
#include <minigrad/autograd/saved_tensor.h>
#include <minigrad/core/ops.h>

namespace mg {

Tensor embedding(const Tensor& weight, const Tensor& indices) {
  Tensor out = ops::embedding(weight, indices);
  record_function("EmbeddingBackward", {weight}, {out},
                  [indices = SavedTensor(indices), vocab = weight.size(0)](const BackwardArgs& g) {
                    return std::vector<Tensor>{
                        ops::embedding_backward(g.grad(), indices.unpack(g), vocab)};
                  });
  return out;
}

}  // namespace mg
