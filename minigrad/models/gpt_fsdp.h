// How a GPT is sharded with FSDP (ZeRO-3), one block at a time, and how its blocks
// recompute their activations: the policy torchtitan's parallelize_llama applies, for
// nanoGPT's model (models/gpt.h). The walkthrough is docs/gpt-fsdp.md.
//
//   auto gpt = std::make_shared<models::GPT>(config);
//   models::set_block_checkpointing(*gpt);                  // optional: recompute blocks
//   auto fsdp = models::fully_shard_gpt(gpt, dp_group);     // the data-parallel group
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

#include <minigrad/models/gpt.h>
#include <minigrad/parallel/sharded/fully_sharded_data_parallel.h>

namespace mg::models {

// The units above (the auto-wrap policy for a GPT).
std::vector<parallel::FSDPUnit> gpt_fsdp_units(const GPT& gpt);

// parallel::fully_shard(gpt, dp_group, gpt_fsdp_units(*gpt), options).
std::shared_ptr<parallel::FullyShardedDataParallel> fully_shard_gpt(
    std::shared_ptr<GPT> gpt, std::shared_ptr<parallel::ProcessGroup> dp_group,
    parallel::FSDPOptions options = {});

// Activation checkpointing of every block (nn::set_checkpointing, nn/checkpoint.h):
// each keeps only its input in forward and runs again in backward, dropout masks included.
void set_block_checkpointing(GPT& gpt, bool on = true);

}  // namespace mg::models
