#include <minigrad/models/llama_plan.h>

#include <minigrad/nn/checkpoint.h>
#include <minigrad/parallel/context_parallel/style.h>
#include <minigrad/parallel/tensor_parallel/styles.h>

namespace mg::models {

parallel::ParallelPlan llama_tensor_parallel_plan(bool sequence_parallel) {
  using namespace parallel;
  const Layout stream = sequence_parallel ? Layout::shard(1) : Layout::replicate();
  const auto colwise = std::make_shared<ColwiseParallel>(stream, Layout::shard(-1));
  const auto rowwise = std::make_shared<RowwiseParallel>(Layout::shard(-1), stream);
  ParallelPlan plan{"tp", {{"model.embed_tokens", std::make_shared<RowwiseParallel>(Layout::replicate(), stream)}}};
  for (const char* name : {"self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj", "mlp.gate_proj", "mlp.up_proj"})
    plan.styles.push_back({std::string("model.layers.*.") + name, colwise});
  for (const char* name : {"self_attn.o_proj", "mlp.down_proj"})
    plan.styles.push_back({std::string("model.layers.*.") + name, rowwise});
  plan.styles.push_back({"lm_head", colwise});
  if (sequence_parallel)
    for (const char* on_stream : {"model.layers.*.input_layernorm", "model.layers.*.post_attention_layernorm", "model.norm"})
      plan.styles.push_back({on_stream, std::make_shared<SequenceParallel>()});
  return plan;
}

parallel::ParallelPlan llama_context_parallel_plan() {
  using namespace parallel;
  return {"cp", {{"model.layers.*.self_attn", std::make_shared<ContextParallel>()},
                 {"model.layers.*.self_attn.rotary_emb", std::make_shared<ContextParallelPositions>()}}};
}

void parallelize_llama(Llama& llama, const parallel::DeviceMesh& mesh, bool sequence_parallel,
                       parallel::ParallelizeOptions options) {
  const int tp = mesh.size("tp");
  const LlamaConfig& c = llama.config();
  // What the plan cannot see in a module's sizes: heads, and each kv head's group, whole on a rank.
  for (const auto& [what, size] : {std::pair<const char*, int64_t>{"num_attention_heads", c.num_attention_heads},
                                   {"num_key_value_heads", c.num_key_value_heads}, {"vocab_size", c.vocab_size}})
    MG_CHECK(size % tp == 0, "parallelize_llama: {} = {} is not divisible by the tensor-parallel size {} (attention "
             "is split by query and kv heads, the embedding and logits by vocabulary; minigrad refuses uneven "
             "shards) ({})", what, size, tp, c.str());
  if (mesh.size("cp") > 1) parallel::parallelize_module(llama, mesh, llama_context_parallel_plan(), options);
  if (tp > 1) parallel::parallelize_module(llama, mesh, llama_tensor_parallel_plan(sequence_parallel), options);
}

std::shared_ptr<parallel::FSDPModule> fully_shard_llama(const std::shared_ptr<Llama>& llama,
                                                        std::shared_ptr<parallel::ProcessGroup> dp_group,
                                                        parallel::FSDPOptions options) {
  MG_CHECK(llama != nullptr, "fully_shard_llama: the Llama is null");
  return parallel::fully_shard_blocks(llama, llama->child("model")->child("layers")->children(), std::move(dp_group),
                                      options);
}

void set_layer_checkpointing(Llama& llama, bool on) {
  for (const nn::ModulePtr& layer : llama.child("model")->child("layers")->children()) nn::set_checkpointing(layer, on);
}

parallel::PipelineCut llama_pipeline_cut(const LlamaConfig& config, int stages, int model_chunks) {
  MG_CHECK(stages >= 1 && model_chunks >= 1 && config.num_hidden_layers >= int64_t{stages} * model_chunks,
           "Llama pipeline: {} layers (num_hidden_layers) cannot fill {} stages x {} model chunks; every virtual "
           "stage needs at least one layer", config.num_hidden_layers, stages, model_chunks);
  parallel::PipelineCut cut;
  cut.split_points = parallel::even_split_points("model.layers", config.num_hidden_layers, stages * model_chunks);
  return cut;
}

}  // namespace mg::models
