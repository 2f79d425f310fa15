// The sums of partial gradients, read from placements (placement.h): after backward, a
// parameter whose placement says its gradient is Partial on a dimension holds this rank's
// share of the sum -- sequence parallelism's replicated weights (each rank saw its
// positions), every parameter under context parallelism (each rank saw its chunks' tokens),
// a pipeline's tied copies (each stage its use of the weight). One function sums them all,
// whatever form placed them:
//
//   loss.backward();
//   parallel::reduce_partial_gradients(model->parameters());
//   optimizer.step();
//
// Per dimension (in a fixed order: tied, tp, cp, then any other by name), the gradients
// Partial there are summed over that dimension's group in one coalesced all-reduce. A
// parameter without a gradient reduces zeros, so every rank of a group reduces the same
// list. With gradient accumulation, call it once, after the last micro-step.
#pragma once

#include <vector>

#include <minigrad/core/tensor.h>

namespace mg::parallel {

void reduce_partial_gradients(const std::vector<Tensor>& parameters);

}  // namespace mg::parallel
