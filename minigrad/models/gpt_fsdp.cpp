// The GPT's FSDP units and block checkpointing (models/gpt_fsdp.h).
#include <minigrad/models/gpt_fsdp.h>

#include <minigrad/nn/checkpoint.h>

namespace mg::models {

namespace {

std::vector<nn::ModulePtr> blocks_of(const GPT& gpt) {
  return gpt.child("transformer")->child("h")->children();
}

}  // namespace

std::vector<parallel::FSDPUnit> gpt_fsdp_units(const GPT& gpt) {
  const nn::ModulePtr transformer = gpt.child("transformer");
  std::vector<parallel::FSDPUnit> units;
  // The embeddings; read again as the head right after the transformer's forward.
  units.push_back({{transformer->child("wte"), transformer->child("wpe")}, {transformer}});
  for (const nn::ModulePtr& block : blocks_of(gpt)) units.push_back({{block}, {}});
  units.push_back({{transformer->child("ln_f")}, {}});
  return units;
}

std::shared_ptr<parallel::FullyShardedDataParallel> fully_shard_gpt(
    std::shared_ptr<GPT> gpt, std::shared_ptr<parallel::ProcessGroup> dp_group,
    parallel::FSDPOptions options) {
  MG_CHECK(gpt != nullptr, "fully_shard_gpt: the GPT is null");
  std::vector<parallel::FSDPUnit> units = gpt_fsdp_units(*gpt);
  return parallel::fully_shard(std::move(gpt), std::move(dp_group), std::move(units), options);
}

void set_block_checkpointing(GPT& gpt, bool on) {
  for (const nn::ModulePtr& block : blocks_of(gpt)) nn::set_checkpointing(block, on);
}

}  // namespace mg::models
