// parallel_apply: step 3 of DataParallel. Runs replicas[i]->forward(inputs[i]) for all i
// at once, replica i on a worker thread of its own that
//   - makes devices[i] its current device and that device's compute stream its current
//     stream (or the stream the caller has current there, if the caller chose another),
//     so the replica's kernels queue there and replicas on distinct GPUs overlap;
//   - runs under the caller's grad mode (grad mode is thread-local: without carrying it,
//     a caller's NoGradGuard would not reach the workers);
//   - hands any exception back: the caller re-throws the first failure (lowest index) as
//     an mg::Error "parallel_apply: replica {i} on {device} failed: {what}".
// The workers are a persistent pool (worker_pool.h), one thread per replica slot, so
// per-thread device state is set up once rather than at every step. With a single
// replica the forward runs inline on the calling thread.
#pragma once

#include <vector>

#include <minigrad/nn/module.h>

namespace mg::parallel {

std::vector<Tensor> parallel_apply(const std::vector<nn::ModulePtr>& replicas,
                                   const std::vector<Tensor>& inputs,
                                   const std::vector<Device>& devices);

}  // namespace mg::parallel
