// log_softmax and cross-entropy. cross_entropy is fused (one kernel forward, one
// backward: softmax minus the smoothed one-hot target), which is both faster and stabler
// than composing log_softmax with a gather; ignore_index, label smoothing and the
// reduction are options of the same kernels (core/cross_entropy_options.h).
#include <optional>

#include <minigrad/autograd/autocast.h>
#include <minigrad/autograd/cross_entropy_override.h>
#include <minigrad/autograd/functions.h>
#include <minigrad/autograd/node.h>
#include <minigrad/autograd/saved_tensor.h>
#include <minigrad/core/ops.h>

namespace mg {

Tensor log_softmax(const Tensor& x_in, int64_t dim) {
  const Tensor x = autocast::cast_input(autocast::AutocastOp::LogSoftmax, x_in);
  Tensor out = ops::log_softmax(x, dim);
  record_function("LogSoftmaxBackward", {x}, {out}, [y = SavedTensor(out), dim](const BackwardArgs& g) {
    return std::vector<Tensor>{ops::log_softmax_backward(g.grad(), y.unpack(g), dim)};
  });
  return out;
}

Tensor cross_entropy(const Tensor& logits_in, const Tensor& targets,
                     const CrossEntropyOptions& options) {
  const Tensor logits = autocast::cast_input(autocast::AutocastOp::CrossEntropy, logits_in);
  // Over a split model's logits a LossParallel stands in (autograd/cross_entropy_override.h).
  if (std::optional<Tensor> loss = overridden_cross_entropy(logits, targets, options)) return *loss;
  Tensor loss = ops::cross_entropy(logits, targets, options);
  record_function("CrossEntropyBackward", {logits}, {loss},
                  [logits = SavedTensor(logits), targets = SavedTensor(targets),
                   options](const BackwardArgs& g) {
                    return std::vector<Tensor>{ops::cross_entropy_backward(
                        g.grad(), logits.unpack(g), targets.unpack(g), options)};
                  });
  return loss;
}

}  // namespace mg
