// The GPT's FSDP units (parallel/sharded/gpt_fsdp.h).
#include <minigrad/parallel/sharded/gpt_fsdp.h>

#include <string>

namespace mg::parallel {

namespace {

nn::ModulePtr child_of(const nn::Module& module, const std::string& path, const std::string& name) {
  for (const auto& [child_name, child] : module.named_children())
    if (child_name == name) return child;
  MG_FAIL("gpt_fsdp_units: the module has no '{}{}'; expected nanoGPT's tree (transformer.wte, "
          "transformer.wpe, transformer.h.<i>, transformer.ln_f)",
          path, name);
}

}  // namespace

std::vector<FSDPUnit> gpt_fsdp_units(const nn::Module& gpt) {
  const nn::ModulePtr transformer = child_of(gpt, "", "transformer");
  std::vector<FSDPUnit> units;
  // The embeddings; read again as the head right after the transformer's forward.
  units.push_back({{child_of(*transformer, "transformer.", "wte"),
                    child_of(*transformer, "transformer.", "wpe")},
                   {transformer}});
  for (const nn::ModulePtr& block : child_of(*transformer, "transformer.", "h")->children())
    units.push_back({{block}, {}});
  units.push_back({{child_of(*transformer, "transformer.", "ln_f")}, {}});
  return units;
}

std::shared_ptr<FullyShardedDataParallel> fully_shard_gpt(nn::ModulePtr gpt,
                                                          std::shared_ptr<ProcessGroup> dp_group,
                                                          FSDPOptions options) {
  MG_CHECK(gpt != nullptr, "fully_shard_gpt: the GPT is null");
  std::vector<FSDPUnit> units = gpt_fsdp_units(*gpt);
  return fully_shard(std::move(gpt), std::move(dp_group), std::move(units), options);
}

}  // namespace mg::parallel
