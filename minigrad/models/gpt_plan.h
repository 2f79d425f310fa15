// How the GPT (gpt.h) is split: its plans, beside the model, naming its modules. Everything
// else of every split is generic (parallel/parallelize.h and the forms' own code).
//
//   tensor parallelism (Megatron's recipe, as torchtitan's apply_tp says it for Llama):
//     transformer.wte       RowwiseParallel: the vocabulary's rows (an Embedding's rows)
//     h.*.attn.c_attn       ColwiseParallel, stride 3: the q, k and v rows of this rank's heads
//     h.*.attn.attn_dropout ShardedDropout: the attention of a rank's heads, its own masks
//     h.*.attn.c_proj       RowwiseParallel: the columns of this rank's heads, all-reduced
//     h.*.mlp.c_fc          ColwiseParallel, then GELU on the slice
//     h.*.mlp.c_proj        RowwiseParallel, all-reduced
//     lm_head               ColwiseParallel: wte's rows again (tied: the same tensor); the
//                           logits stay Shard(-1), the loss is vocabulary-parallel
//                           (parallel::LossParallel)
//   with sequence parallelism the residual stream is Shard(1) (each rank its positions):
//   the column layers gather it, the row layers reduce-scatter into it, and the modules
//   on it (wpe at the rank's positions, drop, ln_*, the residual dropouts, ln_f) run
//   SequenceParallel.
//
//   context parallelism: every block's attention through ring attention, wpe at the rank's
//   chunks' positions.
#pragma once

#include <memory>

#include <minigrad/models/gpt.h>
#include <minigrad/parallel/c10d/device_mesh.h>
#include <minigrad/parallel/parallelize.h>
#include <minigrad/parallel/pipeline/split_module.h>
#include <minigrad/parallel/sharded/fully_shard.h>

namespace mg::models {

parallel::ParallelPlan gpt_tensor_parallel_plan(bool sequence_parallel);
parallel::ParallelPlan gpt_context_parallel_plan();

// The mesh's cp plan (cp > 1), then its tp plan (tp > 1), applied to `gpt` in place.
void parallelize_gpt(GPT& gpt, const parallel::DeviceMesh& mesh, bool sequence_parallel,
                     parallel::ParallelizeOptions options = {});

// ---- FSDP: the GPT's units (parallel/sharded/fully_shard.h) ----
// fully_shard on each block, then on the GPT: a unit per block, and the root's unit of the
// rest -- wte (the tied head's weight too: the nearest common ancestor of wte and lm_head is
// the GPT), wpe, ln_f -- gathered from the GPT's forward to the end of its backward. The last
// block keeps its parameters from its forward to its backward, which comes first
// (torchtitan's reshard_after_forward=False for it). Under a tp plan, call it after
// parallelize_gpt, over the mesh's dp group. Returns the GPT's state: parameters() for the
// optimizer. options.mp_policy's output_dtype is the root's alone (the logits); the blocks
// pass param_dtype on. docs/gpt-fsdp.md.
std::shared_ptr<parallel::FSDPModule> fully_shard_gpt(const std::shared_ptr<GPT>& gpt,
                                                      std::shared_ptr<parallel::ProcessGroup> dp_group,
                                                      parallel::FSDPOptions options = {});

// ---------------------------------------------------------------- the pipeline cut
// (parallel/pipeline/split_module.h, docs/gpt-pipeline.md)
// The n_layer blocks dealt over stages x model_chunks virtual stages as even_balance deals
// them (the first n_layer mod (stages x model_chunks) one more): the first block of every
// later stage ("transformer.h.2"); the head's weight tied to the token embedding. wte, wpe
// and drop go to the first stage, ln_f and lm_head to the last. mg::Error when there are
// fewer blocks than virtual stages.
parallel::PipelineCut gpt_pipeline_cut(const GPTConfig& config, int stages, int model_chunks = 1);

}  // namespace mg::models
