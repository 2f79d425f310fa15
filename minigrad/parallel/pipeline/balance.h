// Where to cut an nn::Sequential into pipeline stages (torchgpipe.balance): a dry run
// on a sample batch measures every layer, and the layers are then cut into
// devices.size() contiguous stages so that the largest stage is as small as possible.
// Both return the layers per stage, for PipeOptions::balance.
//
//   balance_by_size: a layer's size is param_scale times its parameters (2: the
//     parameters and their gradients; 3 with SGD's momentum, 4 with Adam) plus the
//     activations its forward keeps on `sample`, counted by the allocator. Give a whole
//     mini-batch: what GPipe keeps alive at its peak.
//   balance_by_time: a layer's time is its forward and backward on `sample`, the
//     median of `repeats` runs after one to warm up.
//
// The dry run happens where the layers are (each layer's parameters' device), before
// the Pipe moves them; the gradients the timing run makes are dropped again.
#pragma once

#include <vector>

#include <minigrad/nn/layers.h>
#include <minigrad/nn/module.h>

namespace mg::parallel {

std::vector<int64_t> balance_by_size(const nn::ModulePtr& model, const std::vector<Device>& devices,
                                     const Tensor& sample, double param_scale = 2.0);
std::vector<int64_t> balance_by_time(const nn::ModulePtr& model, const std::vector<Device>& devices,
                                     const Tensor& sample, int repeats = 3);

// The measurements behind them, one per layer: bytes, and seconds.
std::vector<double> layer_sizes(const nn::ModulePtr& model, const Tensor& sample,
                                double param_scale = 2.0);
std::vector<double> layer_times(const nn::ModulePtr& model, const Tensor& sample,
                                int repeats = 3);

// The cut: `costs` into `parts` non-empty runs of consecutive entries, the largest sum
// as small as possible. Returns the runs' lengths.
std::vector<int64_t> balance_costs(const std::vector<double>& costs, int64_t parts);

// By count alone: `layers` / `stages` each, one more for the first `layers % stages`.
// What Pipe uses when PipeOptions::balance is empty.
std::vector<int64_t> even_balance(int64_t layers, int64_t stages);

// Stage `stage`'s layers of `model` (an nn::Sequential) under `balance`: a new
// nn::Sequential holding the same layer modules (not copies) under their names in the
// model. Checks the balance against the model. Pipe cuts its stages with this; a
// multi-process pipeline's rank takes its own stage with it.
std::shared_ptr<nn::Sequential> split_stage(const nn::ModulePtr& model,
                                            const std::vector<int64_t>& balance, int stage,
                                            const char* what = "split_stage");

}  // namespace mg::parallel
