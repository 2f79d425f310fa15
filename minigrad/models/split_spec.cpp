#include <minigrad/models/split_spec.h>

#include <minigrad/models/gpt_checkpointing.h>
#include <minigrad/models/gpt_plan.h>
#include <minigrad/models/llama_plan.h>

namespace mg::models {

SplitSpec gpt_split_spec(const std::shared_ptr<GPT>& gpt) {
  MG_CHECK(gpt != nullptr, "gpt_split_spec: the GPT is null");
  return {"GPT",
          gpt,
          [gpt](const auto& mesh, bool sp, auto options) { parallelize_gpt(*gpt, mesh, sp, options); },
          &gpt_context_parallel_plan,
          [gpt](auto dp, auto options) { return fully_shard_gpt(gpt, std::move(dp), options); },
          [gpt](int stages, int chunks) { return gpt_pipeline_cut(gpt->config(), stages, chunks); },
          [gpt] { set_block_checkpointing(*gpt); },
          [](const Tensor& logits, const Tensor& y, Reduction r) { return GPT::loss(logits, y, r); },
          &GPT::state_dict_of};
}

SplitSpec llama_split_spec(const std::shared_ptr<Llama>& llama) {
  MG_CHECK(llama != nullptr, "llama_split_spec: the Llama is null");
  return {"Llama",
          llama,
          [llama](const auto& mesh, bool sp, auto options) { parallelize_llama(*llama, mesh, sp, options); },
          &llama_context_parallel_plan,
          [llama](auto dp, auto options) { return fully_shard_llama(llama, std::move(dp), options); },
          [llama](int stages, int chunks) { return llama_pipeline_cut(llama->config(), stages, chunks); },
          [llama] { set_layer_checkpointing(*llama); },
          [](const Tensor& logits, const Tensor& y, Reduction r) { return Llama::loss(logits, y, r); },
          [](nn::TensorDict parameters) { return parameters; }};
}

}  // namespace mg::models
