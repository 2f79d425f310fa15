// The loss and the gradient sum of context parallelism: see context_parallel_loss.h.
#include <minigrad/parallel/context_parallel/context_parallel_loss.h>

#include <minigrad/autograd/functions.h>
#include <minigrad/autograd/grad_mode.h>
#include <minigrad/core/fault_injection.h>
#include <minigrad/core/ops.h>
#include <minigrad/parallel/context_parallel/wire.h>

namespace mg::parallel::context_parallel {

Tensor context_parallel_cross_entropy(const Tensor& logits, const Tensor& targets,
                                      ProcessGroup& group) {
  MG_CHECK(logits.dim() == 3 && targets.dim() == 2 && targets.size(0) == logits.size(0) &&
               targets.size(1) == logits.size(1) && targets.dtype() == DType::Int64,
           "context_parallel_cross_entropy: expected logits [B, Tl, V] and int64 targets "
           "[B, Tl], got {} and {} ({})",
           logits.shape(), targets.shape(), targets.dtype());
  const int64_t rows = logits.size(0) * logits.size(1);
  // This rank's tokens: the sum of their losses, and how many count (-1 is ignored).
  const Tensor local_sum =
      cross_entropy(reshape(logits, {rows, logits.size(2)}), reshape(targets, {rows}),
                    CrossEntropyOptions().ignore_index(-1).reduction(Reduction::Sum));
  int64_t counted = 0;
  for (int64_t t : targets.to_vector<int64_t>()) counted += t != -1 ? 1 : 0;
  const Tensor count = sum_over_group(from_vector(std::vector<int64_t>{counted}, Shape{1},
                                                  group.device()), group);
  const auto global_count = static_cast<double>(count.to_vector<int64_t>()[0]);
  return context_parallel_sum(local_sum / global_count, group);
}

Tensor context_parallel_sum(const Tensor& local, ProcessGroup& group) {
  // The value is the group's sum; the gradient is that of local alone (local -
  // local.detach() is exactly zero, and carries local's gradient).
  return (local - local.detach()) + sum_over_group(local.detach(), group);
}

void all_reduce_gradients(const std::vector<Tensor>& parameters, ProcessGroup& group) {
  // parity fault: every rank keeps the gradient of its own tokens only (fault_injection.h).
  if (testing::fault_is_on(testing::Fault::ContextParallelGradsNotReduced)) return;
  std::vector<Tensor> grads;
  for (const Tensor& p : parameters) {
    if (!p.grad().defined()) p.set_grad(zeros_like(p));
    grads.push_back(p.grad());
  }
  if (grads.empty() || group.size() == 1) return;
  if (grads.front().dtype() == DType::Float32) {
    group.allreduce(grads)->wait();  // one coalesced buffer
    return;
  }
  for (const Tensor& g : grads) ops::copy_(g, sum_over_group(g, group));
}

}  // namespace mg::parallel::context_parallel
