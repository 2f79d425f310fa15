#include "running_loss.h"

#include <minigrad/autograd/grad_mode.h>
#include <minigrad/core/ops.h>

namespace mg::samples {

RunningLoss RunningLoss::zero(Device device) { return {zeros({}, DType::Float32, device), 0}; }

void RunningLoss::add(const Tensor& loss, int64_t examples) {
  NoGradGuard no_grad;
  sum.add_(loss.detach(), static_cast<double>(examples));
  seen += examples;
}

double RunningLoss::mean() const { return sum.item<float>() / static_cast<double>(seen); }

RunningLoss RunningLoss::over_ranks(const DistributedRun& dist) const {
  if (!dist.active()) return *this;
  RunningLoss total{ops::clone(sum), 0};
  Tensor seen_total = full({}, static_cast<double>(seen), DType::Float32, sum.device());
  sum_over_data_ranks(dist, {total.sum, seen_total});
  total.seen = static_cast<int64_t>(seen_total.item<float>());
  return total;
}

}  // namespace mg::samples
