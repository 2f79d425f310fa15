// replicate: step 2 of DataParallel. One copy of the module per device, whose
// parameters are outputs of a single Broadcast node of the original parameters:
//
//   original parameters (leaves, on devices[0]) --Broadcast--> P x N replica parameters
//
// In backward, Broadcast's gradient is a reduce_add: every replica's gradient of a
// parameter is summed (summed, not averaged) into the original parameter's grad on
// devices[0]. That is how a step of DataParallel leaves exactly one gradient per
// parameter, where the optimizer expects it.
#pragma once

#include <vector>

#include <minigrad/nn/module.h>

namespace mg::parallel {

// Replica i lives on devices[i]: a shallow clone of `module` with every parameter
// replaced by its broadcast copy (replica 0 uses the original values without copying,
// but as an output of the Broadcast node too, so its gradient flows the same way) and
// every buffer copied (buffers are not differentiated). Every parameter and buffer of
// `module` must be on devices[0]. Without grad mode, or for parameters that do not
// require grad, the copies are plain tensors outside the graph.
std::vector<nn::ModulePtr> replicate(const nn::ModulePtr& module,
                                     const std::vector<Device>& devices);

}  // namespace mg::parallel
