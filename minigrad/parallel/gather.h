// gather: step 4 of DataParallel. Concatenates the replicas' outputs along `dim` on
// `output_device`, as one autograd node whose backward scatters the gradient back to
// each output's device (the same ordered copies as scatter).
#pragma once

#include <vector>

#include <minigrad/core/tensor.h>

namespace mg::parallel {

Tensor gather(const std::vector<Tensor>& outputs, Device output_device, int64_t dim = 0);

}  // namespace mg::parallel
