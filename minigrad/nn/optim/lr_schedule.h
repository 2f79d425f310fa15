// optim::WarmupCosine: nanoGPT's learning-rate schedule (get_lr in its train.py). A
// linear warmup to max_lr over the first warmup_steps steps, then a cosine from max_lr
// down to min_lr at step decay_steps, then min_lr for good:
//
//   step <  warmup_steps:  max_lr * (step + 1) / (warmup_steps + 1)
//   step <= decay_steps:   min_lr + (max_lr - min_lr) * (1 + cos(pi * r)) / 2,
//                          r = (step - warmup_steps) / (decay_steps - warmup_steps)
//   step >  decay_steps:   min_lr
//
// Warmup keeps Adam's first steps small, while its second moment still knows little;
// the floor keeps the last steps learning. It depends on the step alone, so a resumed
// run continues it: opt.set_lr(schedule(step)) before each step.
#pragma once

#include <cstdint>

namespace mg::optim {

class WarmupCosine {
 public:
  // mg::Error unless 0 <= min_lr <= max_lr (finite) and 0 <= warmup_steps <= decay_steps.
  WarmupCosine(double max_lr, double min_lr, int64_t warmup_steps, int64_t decay_steps);

  // The learning rate of step `step` (counted from 0; a negative step is an mg::Error).
  double operator()(int64_t step) const;

  double max_lr() const { return max_lr_; }
  double min_lr() const { return min_lr_; }
  int64_t warmup_steps() const { return warmup_steps_; }
  int64_t decay_steps() const { return decay_steps_; }

 private:
  double max_lr_, min_lr_;
  int64_t warmup_steps_, decay_steps_;
};

}  // namespace mg::optim
