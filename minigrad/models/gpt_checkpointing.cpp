// Block checkpointing for the GPT (models/gpt_checkpointing.h).
#include <minigrad/models/gpt_checkpointing.h>

#include <minigrad/nn/checkpoint.h>

namespace mg::models {

void set_block_checkpointing(GPT& gpt, bool on) {
  for (const nn::ModulePtr& block : gpt.child("transformer")->child("h")->children())
    nn::set_checkpointing(block, on);
}

}  // namespace mg::models
