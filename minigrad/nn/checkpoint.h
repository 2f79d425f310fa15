// Activation checkpointing, as torch.utils.checkpoint.checkpoint: trade compute for the
// memory of a region's activations.
//
//   Tensor y = nn::checkpoint(*block, x);        // or a function: nn::checkpoint(fn, x)
//   nn::set_checkpointing(block);                // the same each time block is called
//
// Forward runs the region under NoGradGuard: no graph, so none of its intermediate
// tensors outlive it; what is kept is its input x, the random generator's state (seed,
// offset) and one node, CheckpointBackward, which the output gets as its grad_fn. In
// backward that node
//   1. sets the default generator back to the saved state, so every dropout inside
//      draws the same Philox numbers, hence the same mask, as in forward (torch preserves
//      the RNG state the same way), and restores the generator's own state afterwards;
//   2. runs the region's forward again, with grad on, from a detached copy of x that
//      requires grad;
//   3. runs that graph's backward at once with the gradient it was given (a nested
//      backward, torch's reentrant variant): the region's parameters accumulate their
//      gradients there, exactly as they would have in the plain graph, and x's copy
//      collects the input's gradient, which the node passes on.
// So the values, the parameters' gradients and the input's gradient are the plain
// forward's, bit for bit; the price is one more forward of the region per backward.
//
// A parameter used both inside and outside a checkpointed region (a tied weight) would
// get two separate accumulations: checkpoint regions that own their parameters (GPT's
// blocks). The region's module must outlive the backward, as in PyTorch.
#pragma once

#include <cstddef>
#include <functional>
#include <memory>

#include <minigrad/nn/module.h>

namespace mg::nn {

using CheckpointFunction = std::function<Tensor(const Tensor&)>;

// fn(input), with fn's activations recomputed in backward (see above). Without grad
// mode it is fn(input) plain.
Tensor checkpoint(CheckpointFunction fn, const Tensor& input);
// The module called as Module::operator() calls it (hooks included), checkpointed.
Tensor checkpoint(Module& module, const Tensor& input);

// Checkpoints every call of `module` through Module::operator() with grad on (hooks
// included), as torch's checkpoint_wrapper, applied in place: names, parameters and the
// module tree stay as they are. A copy (clone) is not checkpointed.
void set_checkpointing(const ModulePtr& module, bool on = true);
bool is_checkpointing(const Module& module);

// True on this thread while a checkpoint's backward runs its forward again:
// FSDP's hooks (fully_shard) gather a unit for that forward too.
bool is_recomputing();

// How many regions have been recomputed in this process (for tests and benchmarks).
size_t checkpoint_recomputations();

}  // namespace mg::nn
