// Gradient clipping for the GPT on a dp x pp x cp x tp mesh (gpt_mesh_pipeline.h): the
// global norm of the single-device GPT's gradient, from the shards the ranks hold, every
// element counted once, then clip_grads_with_norm_ on this rank's parameters.
//
// After finish_gradients every rank of a dp row and cp group holds the same gradients, so
// the sum of squares runs over pp (the stages' blocks) and tp only:
//   sharded tensors    each tp rank its own elements: summed over tp;
//   replicated tensors (is_replicated: wpe, LayerNorms, row biases) the same on every tp
//                      rank: counted on tp rank 0 only;
//   lm_head.weight     the last stage's copy of the tied wte shard, equal to stage 0's
//                      after the tied sum: not counted (stage 0's wte is).
// One all-reduce over tp, one over pp (float32); the same total on every rank.
#pragma once

#include <minigrad/core/tensor.h>
#include <minigrad/models/gpt_mesh_pipeline.h>
#include <minigrad/parallel/c10d/device_mesh.h>

namespace mg::models {

// The 2-norm of the whole GPT's gradient (a float32 scalar, every rank the same), and this
// rank's gradients scaled by min(max_norm / (norm + 1e-6), 1), as nn::utils::clip_grad_norm_
// does on one device. `mesh` is the one the pipeline was built on. A collective of the mesh.
Tensor clip_mesh_grad_norm_(GPTMeshPipeline& model, const parallel::DeviceMesh& mesh, double max_norm);

}  // namespace mg::models
