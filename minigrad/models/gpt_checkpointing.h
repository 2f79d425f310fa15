// Activation checkpointing of a GPT's blocks (nn/checkpoint.h): each block keeps only its
// input in forward and runs again in backward, dropout masks included, so the step's
// numbers stay the same for one more forward of the blocks. docs/gpt-fsdp.md counts it.
#pragma once

#include <minigrad/models/gpt.h>

namespace mg::models {

// nn::set_checkpointing on each of transformer.h.<i> (off again with on = false).
void set_block_checkpointing(GPT& gpt, bool on = true);

}  // namespace mg::models
