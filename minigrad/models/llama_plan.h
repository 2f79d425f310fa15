// How the Llama (llama.h) is split: its plans, its FSDP units and its pipeline cut, naming its
// modules (torchtitan's parallelize_llama). No parallel code of its own: every style, the
// placements, the sums and the cut are generic (parallel/parallelize.h, split_module.h).
//
//   tensor parallelism (Megatron's recipe, as torchtitan's apply_tp):
//     model.embed_tokens             RowwiseParallel: the vocabulary's rows
//     layers.*.self_attn.q_proj      ColwiseParallel: this rank's n_heads / tp query heads
//     layers.*.self_attn.k_proj      ColwiseParallel: its n_kv_heads / tp kv heads (the kv heads
//     layers.*.self_attn.v_proj        of its query heads: the groups are whole on a rank)
//     layers.*.self_attn.o_proj      RowwiseParallel, all-reduced
//     layers.*.mlp.gate_proj         ColwiseParallel: SiLU and the product on the slice
//     layers.*.mlp.up_proj           ColwiseParallel
//     layers.*.mlp.down_proj         RowwiseParallel, all-reduced
//     lm_head                        ColwiseParallel: logits Shard(-1), the loss vocabulary-parallel
//   with sequence parallelism the residual stream is Shard(1): the RMSNorms run SequenceParallel.
//   context parallelism: every attention through ring attention, RoPE at the rank's chunks'
//   positions (ContextParallelPositions on each rotary_emb).
#pragma once

#include <memory>

#include <minigrad/models/llama.h>
#include <minigrad/parallel/c10d/device_mesh.h>
#include <minigrad/parallel/parallelize.h>
#include <minigrad/parallel/pipeline/split_module.h>
#include <minigrad/parallel/sharded/fully_shard.h>

namespace mg::models {

parallel::ParallelPlan llama_tensor_parallel_plan(bool sequence_parallel);
parallel::ParallelPlan llama_context_parallel_plan();

// The mesh's cp plan (cp > 1), then its tp plan (tp > 1), applied in place. mg::Error unless
// tp divides num_attention_heads, num_key_value_heads and vocab_size.
void parallelize_llama(Llama& llama, const parallel::DeviceMesh& mesh, bool sequence_parallel,
                       parallel::ParallelizeOptions options = {});

// FSDP: a unit per decoder layer, then the root's (embed_tokens, norm, lm_head); the last layer
// kept gathered from its forward to its backward; mp_policy's output_dtype the root's alone.
// After parallelize_llama, over the dp group.
std::shared_ptr<parallel::FSDPModule> fully_shard_llama(const std::shared_ptr<Llama>& llama,
                                                        std::shared_ptr<parallel::ProcessGroup> dp_group,
                                                        parallel::FSDPOptions options = {});

// Activation checkpointing (nn/checkpoint.h) on each decoder layer: forward keeps a layer's input
// alone and backward runs the layer again.
void set_layer_checkpointing(Llama& llama, bool on = true);

// The layers dealt over stages x model_chunks virtual stages: embed_tokens on the first, norm and
// lm_head on the last; no ties (the head is its own weight).
parallel::PipelineCut llama_pipeline_cut(const LlamaConfig& config, int stages, int model_chunks = 1);

}  // namespace mg::models
