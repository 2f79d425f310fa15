#include "evaluate.h"

#include <minigrad/autograd/functions.h>
#include <minigrad/autograd/grad_mode.h>
#include <minigrad/core/ops.h>

namespace mg::samples {

EvalResult evaluate(nn::Module& net, data::DataLoader& loader, Device device, DType input_dtype) {
  NoGradGuard no_grad;
  net.eval();
  double loss_sum = 0.0;
  int64_t correct = 0, seen = 0;
  for (const data::Batch& host_batch : loader) {
    const data::Batch batch = host_batch.to(device);
    const Tensor logits = net.forward(ops::to_dtype(batch.data, input_dtype));
    // The logits come out where the model ends (a pipeline's last stage): the targets go there.
    const Tensor target = batch.target.device() == logits.device() ? batch.target
                                                                    : batch.target.to(logits.device());
    // A bfloat16 model's loss is bfloat16 (--precision bf16-true): read through float32.
    loss_sum += static_cast<double>(ops::to_dtype(cross_entropy(logits, target), DType::Float32).item<float>()) *
                static_cast<double>(batch.size());
    const std::vector<int64_t> predicted = logits.argmax(1).to_vector<int64_t>();
    const std::vector<int64_t> labels = host_batch.target.to_vector<int64_t>();
    for (size_t i = 0; i < labels.size(); ++i) correct += predicted[i] == labels[i];
    seen += batch.size();
  }
  net.train();
  return {loss_sum / static_cast<double>(seen),
          static_cast<double>(correct) / static_cast<double>(seen)};
}

}  // namespace mg::samples
