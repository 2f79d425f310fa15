#include <minigrad/models/gpt_plan.h>

#include <minigrad/parallel/context_parallel/style.h>
#include <minigrad/parallel/tensor_parallel/styles.h>

namespace mg::models {

parallel::ParallelPlan gpt_tensor_parallel_plan(bool sequence_parallel) {
  using namespace parallel;
  // The residual stream: whole on every rank, or (sequence parallelism) each rank's positions.
  const Layout stream = sequence_parallel ? Layout::shard(1) : Layout::replicate();
  ParallelPlan plan{"tp",
                    {{"transformer.wte", std::make_shared<RowwiseParallel>(Layout::replicate(), stream)},
                     {"transformer.h.*.attn.c_attn", std::make_shared<ColwiseParallel>(stream, Layout::shard(-1), 3)},
                     {"transformer.h.*.attn.attn_dropout", std::make_shared<ShardedDropout>()},
                     {"transformer.h.*.attn.c_proj", std::make_shared<RowwiseParallel>(Layout::shard(-1), stream)},
                     {"transformer.h.*.mlp.c_fc", std::make_shared<ColwiseParallel>(stream, Layout::shard(-1))},
                     {"transformer.h.*.mlp.c_proj", std::make_shared<RowwiseParallel>(Layout::shard(-1), stream)},
                     {"lm_head", std::make_shared<ColwiseParallel>(stream, Layout::shard(-1))}}};
  if (!sequence_parallel) return plan;
  plan.styles.push_back({"transformer.wpe", std::make_shared<PrepareModuleInput>(Layout::replicate(), Layout::shard(0))});
  for (const char* on_stream : {"transformer.wpe", "transformer.drop", "transformer.h.*.ln_1", "transformer.h.*.ln_2",
                                "transformer.h.*.attn.resid_dropout", "transformer.h.*.mlp.dropout", "transformer.ln_f"})
    plan.styles.push_back({on_stream, std::make_shared<SequenceParallel>()});
  return plan;
}

parallel::ParallelPlan gpt_context_parallel_plan() {
  using namespace parallel;
  return {"cp",
          {{"transformer.h.*.attn", std::make_shared<ContextParallel>()},
           {"transformer.wpe", std::make_shared<ContextParallelPositions>()}}};
}

void parallelize_gpt(GPT& gpt, const parallel::DeviceMesh& mesh, bool sequence_parallel,
                     parallel::ParallelizeOptions options) {
  const int tp = mesh.size("tp");
  const GPTConfig& c = gpt.config();
  // What the plan cannot see in a module's sizes: heads are whole on a rank.
  MG_CHECK(c.n_head % tp == 0,
           "parallelize_gpt: n_head (attention is split by heads) = {} is not divisible by the tensor-parallel "
           "size {} ({})", c.n_head, tp, c.str());
  MG_CHECK(c.vocab_size % tp == 0,
           "parallelize_gpt: vocab_size (the embedding and the logits are split by vocabulary; choose a "
           "multiple, as nanoGPT pads 50257 to 50304) = {} is not divisible by the tensor-parallel size {} ({}); "
           "minigrad refuses uneven shards rather than padding them", c.vocab_size, tp, c.str());
  MG_CHECK(mesh.size("cp") == 1 || c.dropout == 0.0,
           "parallelize_gpt: no dropout under context parallelism (cp = {}), got dropout {}: ring attention has "
           "no attention dropout, and each cp rank would draw the residual dropout's masks for other tokens "
           "(set dropout to 0)", mesh.size("cp"), c.dropout);
  if (mesh.size("cp") > 1) parallel::parallelize_module(gpt, mesh, gpt_context_parallel_plan(), options);
  if (tp > 1) parallel::parallelize_module(gpt, mesh, gpt_tensor_parallel_plan(sequence_parallel), options);
}

// ---- FSDP ----

std::shared_ptr<parallel::FSDPModule> fully_shard_gpt(const std::shared_ptr<GPT>& gpt,
                                                      std::shared_ptr<parallel::ProcessGroup> dp_group,
                                                      parallel::FSDPOptions options) {
  MG_CHECK(gpt != nullptr, "fully_shard_gpt: the GPT is null");
  return parallel::fully_shard_blocks(gpt, gpt->child("transformer")->child("h")->children(), std::move(dp_group),
                                      options);
}

// ---------------------------------------------------------------- the pipeline cut

parallel::PipelineCut gpt_pipeline_cut(const GPTConfig& config, int stages, int model_chunks) {
  MG_CHECK(stages >= 1 && model_chunks >= 1 && config.n_layer >= int64_t{stages} * model_chunks,
           "GPT pipeline: {} blocks (n_layer) cannot fill {} stages x {} model chunks = {} virtual stages; "
           "every virtual stage needs at least one block",
           config.n_layer, stages, model_chunks, int64_t{stages} * model_chunks);
  parallel::PipelineCut cut;
  cut.split_points = parallel::even_split_points("transformer.h", config.n_layer, stages * model_chunks);
  cut.ties = {{"transformer.wte.weight", "lm_head.weight"}};
  return cut;
}

}  // namespace mg::models
