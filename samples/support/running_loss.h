// An epoch's training loss so far: the sum of each step's mean loss times its batch size,
// and the examples seen. The sum stays a tensor on the device, so adding a step's loss
// does not wait for the device; it is read when the progress bar redraws and at the end
// of the epoch.
#pragma once

#include <cstdint>

#include <minigrad/core/tensor.h>

#include "distributed_run.h"

namespace mg::samples {

struct RunningLoss {
  Tensor sum;  // float32 scalar
  int64_t seen = 0;

  // Zero, on `device`.
  static RunningLoss zero(Device device);
  void add(const Tensor& loss, int64_t examples);
  double mean() const;  // reads the sum back
  // The sum over every rank's examples, each counted once (in a run of one process: this
  // one's).
  RunningLoss over_ranks(const DistributedRun& dist) const;
};

}  // namespace mg::samples
