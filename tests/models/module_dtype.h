// A module's parameters in another float dtype, for the tests that check a form of
// parallelism (or recomputation) in float64, where only the order of sums may differ:
// the GPT tests of tests/nn, tests/parallel, tests/distributed and the parity table build
// their GPT in float32 (its initialisation draws float32) and widen it here.
#pragma once

#include <minigrad/minigrad.h>

namespace mg::test {

// Every parameter of `module` replaced by a copy in `dtype`: a new leaf that requires
// grad, under the same name (a tied parameter, listed once, stays tied).
inline void set_parameters_dtype(nn::Module& module, DType dtype) {
  for (const auto& [name, p] : module.named_parameters()) {
    Tensor wide = p.detach().to(dtype);
    wide.set_requires_grad(true);
    module.set_parameter(name, wide);
  }
}

}  // namespace mg::test
