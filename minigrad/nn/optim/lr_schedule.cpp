#include <minigrad/nn/optim/lr_schedule.h>

#include <cmath>

#include <minigrad/core/error.h>

namespace mg::optim {

WarmupCosine::WarmupCosine(double max_lr, double min_lr, int64_t warmup_steps,
                           int64_t decay_steps)
    : max_lr_(max_lr), min_lr_(min_lr), warmup_steps_(warmup_steps), decay_steps_(decay_steps) {
  MG_CHECK(std::isfinite(max_lr) && std::isfinite(min_lr) && min_lr >= 0.0 && min_lr <= max_lr,
           "WarmupCosine: the learning rates must satisfy 0 <= min_lr <= max_lr, got max_lr {} "
           "and min_lr {}",
           max_lr, min_lr);
  MG_CHECK(warmup_steps >= 0 && warmup_steps <= decay_steps,
           "WarmupCosine: the steps must satisfy 0 <= warmup_steps <= decay_steps, got "
           "warmup_steps {} and decay_steps {}",
           warmup_steps, decay_steps);
}

double WarmupCosine::operator()(int64_t step) const {
  MG_CHECK(step >= 0, "WarmupCosine: step {} is negative (steps count from 0)", step);
  if (step < warmup_steps_)
    return max_lr_ * static_cast<double>(step + 1) / static_cast<double>(warmup_steps_ + 1);
  // At decay_steps the cosine reaches min_lr; decay_steps == warmup_steps: no decay, the
  // floor right after the warmup.
  if (step >= decay_steps_) return min_lr_;
  constexpr double kPi = 3.14159265358979323846;
  const double ratio = static_cast<double>(step - warmup_steps_) /
                       static_cast<double>(decay_steps_ - warmup_steps_);
  return min_lr_ + 0.5 * (1.0 + std::cos(kPi * ratio)) * (max_lr_ - min_lr_);
}

}  // namespace mg::optim
