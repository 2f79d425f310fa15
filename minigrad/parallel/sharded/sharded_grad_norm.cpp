#include <minigrad/parallel/sharded/sharded_grad_norm.h>

#include <minigrad/core/ops.h>
#include <minigrad/nn/utils/clip_grad.h>

namespace mg::parallel {

Tensor clip_grad_norm_(const std::vector<Tensor>& shards, double max_norm, ProcessGroup& group,
                       double norm_type) {
  return nn::utils::clip_grad_norm_(
      shards, max_norm, norm_type, /*error_if_nonfinite=*/false,
      [&group](Tensor& partial, nn::utils::NormReduction op) {
        if (op == nn::utils::NormReduction::Sum) {
          group.allreduce(partial, ReduceOp::Sum)->wait();
          return;
        }
        // The infinity norm: the largest of every rank's max |g| (the groups reduce by sum
        // or average only, so gather the N partials and take their max here).
        Tensor all = empty(Shape{group.size()}, DType::Float32, partial.device());
        group.all_gather(all, ops::view(ops::contiguous(partial), Shape{1}))->wait();
        ops::copy_(partial, ops::abs_max(all));  // partials are >= 0
      });
}

}  // namespace mg::parallel
