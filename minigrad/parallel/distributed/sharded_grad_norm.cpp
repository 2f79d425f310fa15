#include <minigrad/parallel/distributed/sharded_grad_norm.h>

#include <cmath>

#include <minigrad/autograd/grad_mode.h>
#include <minigrad/core/ops.h>

namespace mg::parallel {

double clip_grad_norm_(const std::vector<Tensor>& shards, double max_norm, ProcessGroup& group) {
  MG_CHECK(std::isfinite(max_norm) && max_norm >= 0.0,
           "clip_grad_norm_ (sharded): max_norm must be a finite number >= 0, got {}", max_norm);
  NoGradGuard no_grad;
  Tensor sum_of_squares = zeros(Shape{1}, DType::Float32, group.device());
  for (const Tensor& shard : shards) {
    const Tensor g = shard.grad();
    if (!g.defined() || g.numel() == 0) continue;
    sum_of_squares.add_(ops::sum(ops::binary(BinaryOp::Mul, g, g), {}, true).reshape(Shape{1}));
  }
  group.allreduce(sum_of_squares, ReduceOp::Sum)->wait();
  const double total = std::sqrt(static_cast<double>(sum_of_squares.to(Device::cpu()).item<float>()));
  const double coef = max_norm / (total + 1e-6);
  if (coef < 1.0) {
    for (const Tensor& shard : shards) {
      Tensor g = shard.grad();
      if (g.defined()) g.mul_(coef);
    }
  }
  return total;
}

}  // namespace mg::parallel
