// How a GPT is sharded with FSDP (ZeRO-3), one block per unit: the auto-wrap policy
// torchtitan's parallelize_llama applies, for nanoGPT's model (models/gpt.h), read from
// its module tree by nanoGPT's names (parallel/ does not include models/). The
// walkthrough is docs/gpt-fsdp.md.
//
//   auto gpt = std::make_shared<models::GPT>(config);
//   models::set_block_checkpointing(*gpt);                  // optional: recompute blocks
//   auto fsdp = parallel::fully_shard_gpt(gpt, dp_group);   // the data-parallel group
//   optim::AdamW opt(fsdp->parameters(), ...);              // this rank's shards
//   loss = models::GPT::loss(fsdp->forward(idx), targets); loss.backward(); opt.step();
//
// Units, in forward order: the embeddings (wte and wpe: one unit, gathered once for both),
// each Block, ln_f. The head is wte itself (logits = ln_f(x) wte^T, outside any module),
// so the embedding unit is gathered a second time after the transformer's forward, for
// the head, and freed again once the head's backward is done; its gradient (head and
// embedding together) is reduce-scattered when the embedding's backward has added its own.
#pragma once

#include <memory>
#include <vector>

#include <minigrad/nn/module.h>
#include <minigrad/parallel/sharded/fully_sharded_data_parallel.h>

namespace mg::parallel {

// The units above. `gpt` is a models::GPT, or any module with its tree: transformer.wte,
// transformer.wpe, transformer.h.<i>, transformer.ln_f (mg::Error naming what is missing).
std::vector<FSDPUnit> gpt_fsdp_units(const nn::Module& gpt);

// fully_shard(gpt, dp_group, gpt_fsdp_units(*gpt), options).
std::shared_ptr<FullyShardedDataParallel> fully_shard_gpt(nn::ModulePtr gpt,
                                                          std::shared_ptr<ProcessGroup> dp_group,
                                                          FSDPOptions options = {});

}  // namespace mg::parallel
