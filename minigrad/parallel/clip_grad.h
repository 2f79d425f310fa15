// clip_grad_norm_ over any split of a model: the norm of the single-device model's gradient,
// read off the placements each form recorded (placement.h), never off names or module
// types -- as PyTorch's clip_grad_norm_ over DTensor parameters. One function for tensor
// parallelism (and its sequence-parallel variant), ZeRO, FSDP, DDP, pipelines and their
// products on a mesh.
//
//   partial = sum over this rank's counted pieces of |g|^p       (max |g| for p = infinity)
//   total   = (all-reduce over the world of partial)^(1/p)        (all-reduce max for infinity)
//   g      *= min(max_norm / (total + 1e-6), 1)                   (every local gradient)
//
// Each element of the whole gradient is counted exactly once: a piece counts on rank 0 of
// every dimension that replicates it (ParameterPiece::counted_here), on every rank that
// holds a shard of it, and a flat range on the rank that holds it; a tensor without a spec
// counts where it is (a pipeline stage's own layers). A flat shard whose every piece counts
// here is counted whole, in one reduction: its padding is zeros. The arithmetic after the
// sum -- the root, the 1e-6, the coefficient clamped to 1 -- is nn::utils::clip_grad_norm_'s
// (nn/utils/clip_grad.h), so one device and every split scale by the same formula, and
// every rank gets the same norm (one all-reduce: the same bits everywhere).
//
// Which tensors: those that hold this rank's gradients -- the optimizer's parameters
// (ZeRO-2's and FSDP's shards, tp shards, a DDP replica's parameters). Gradients must be
// final: partial ones summed first (partial_gradients.h).
#pragma once

#include <memory>
#include <vector>

#include <minigrad/core/tensor.h>
#include <minigrad/parallel/c10d/device_mesh.h>
#include <minigrad/parallel/c10d/process_group.h>

namespace mg::parallel {

// A collective over `world` (every rank of the job calls it, also one with nothing counted):
// one all-reduce of one number (an all-gather of the ranks' maxima for p = infinity; float64
// partials travel as their bits, context_parallel/wire.h). `world` null: every rank's
// tensors are in this process (TensorParallel's threads), and the sum is local. Returns the
// total norm, the gradients' dtype, a 0-dim tensor on world's device (or the first
// gradient's). norm_type > 0 or infinity; max_norm >= 0; with error_if_nonfinite a NaN or
// infinite total is an mg::Error on every rank and no gradient is changed.
Tensor clip_grad_norm_(const std::vector<Tensor>& parameters, const std::shared_ptr<ProcessGroup>& world,
                       double max_norm, double norm_type = 2.0, bool error_if_nonfinite = false);
// The same over the mesh's world.
Tensor clip_grad_norm_(const std::vector<Tensor>& parameters, const DeviceMesh& mesh, double max_norm,
                       double norm_type = 2.0, bool error_if_nonfinite = false);

// This rank's gradients that count in the norm (views of the local gradients): the first
// half of clip_grad_norm_, for tests and for a caller who sums some other way.
std::vector<Tensor> counted_gradients(const std::vector<Tensor>& parameters);

}  // namespace mg::parallel
