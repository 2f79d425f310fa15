// The test loss and accuracy of a classifier over a whole DataLoader, with autograd off.
#pragma once

#include <minigrad/core/device.h>
#include <minigrad/core/dtype.h>
#include <minigrad/data/dataloader.h>
#include <minigrad/nn/module.h>

namespace mg::samples {

struct EvalResult {
  double loss = 0.0;      // mean cross-entropy per example
  double accuracy = 0.0;  // fraction of examples whose largest logit is their label
};

// Runs `net` in eval mode over every batch of `loader` (moved to `device`, its inputs
// converted to `input_dtype`: bfloat16 for a bfloat16 model), then puts it back in training
// mode.
EvalResult evaluate(nn::Module& net, data::DataLoader& loader, Device device, DType input_dtype = DType::Float32);

}  // namespace mg::samples
