// What a model brings to be split every way: its plans, its FSDP units, its pipeline cut, its
// recompute, its loss and its checkpoint layout -- names and a few calls over the unchanged
// model, bound to one built model (torchtitan's ModelSpec). Everything else is generic: the
// trainer's split (samples/support/split_model.h), the parity table (tests/parity) and the
// benches take a SplitSpec and never name a module. docs/split-your-model.md walks through one.
#pragma once

#include <functional>
#include <memory>
#include <string>

#include <minigrad/models/gpt.h>
#include <minigrad/models/llama.h>
#include <minigrad/parallel/c10d/device_mesh.h>
#include <minigrad/parallel/parallelize.h>
#include <minigrad/parallel/pipeline/split_module.h>
#include <minigrad/parallel/sharded/fully_shard.h>

namespace mg::models {

struct SplitSpec {
  std::string name;      // "GPT", "Llama": for messages
  nn::ModulePtr model;   // the whole model, built alike on every rank
  // The mesh's cp plan (cp > 1), then its tp plan (tp > 1), in place; mg::Error naming the
  // sizes the model cannot split by.
  std::function<void(const parallel::DeviceMesh&, bool sequence_parallel, parallel::ParallelizeOptions)> parallelize;
  std::function<parallel::ParallelPlan()> context_parallel_plan;  // cp alone, over any group
  // FSDP's units (fully_shard per block, then the root), over the dp group.
  std::function<std::shared_ptr<parallel::FSDPModule>(std::shared_ptr<parallel::ProcessGroup>, parallel::FSDPOptions)>
      fully_shard;
  // The pipeline cut by module name: stages x model chunks virtual stages, the ties.
  std::function<parallel::PipelineCut(int stages, int model_chunks)> pipeline_cut;
  std::function<void()> recompute;  // activation checkpointing on every block
  // logits [B, T, V], targets [B, T] -> the mean (or summed) token loss.
  std::function<Tensor(const Tensor& logits, const Tensor& targets, Reduction)> loss;
  // The single-device state dict from its parameters by name (what full_state_dict
  // gathers): the GPT adds its tied lm_head.weight; the Llama's is the same dict.
  std::function<nn::TensorDict(nn::TensorDict parameters)> state_dict_of;
};

SplitSpec gpt_split_spec(const std::shared_ptr<GPT>& gpt);      // models/gpt_plan.h's
SplitSpec llama_split_spec(const std::shared_ptr<Llama>& llama);  // models/llama_plan.h's

}  // namespace mg::models
