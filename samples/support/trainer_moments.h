// The planner's terms taken at the moments train_gpt holds them. The planner sums every term
// at its largest; the trainer's peak is what it always holds plus the largest of a few
// moments, each a handful of named terms read off its live blocks (train_gpt
// --memory-blocks; docs/planning.md, "Planner against the trainer"):
//   always     parameters, masters, optimizer state, and under --pp the model the pipeline
//              was cut from (kept for checkpoints)
//   backward   the activations at their peak, what the 16-bit precisions keep beside them,
//              the gradients of the pipeline's backwards before it, FSDP's gathered units
//              (no gradient otherwise: zero_grad sets them to none, and the engine adds each
//              weight's into .grad at the end of backward)
//   recompute  models::GPT's per-block checkpoint: the first block going back, the later
//              blocks' inputs freed and their gradients in .grad; the pipeline's (the whole
//              stage redone per micro-batch): its last backward, every earlier one's
//              gradients in .grad and every message of the step held
//   ZeRO-2's   later in backward: its flat gradients made, part of the activations gone
//   sum        the gradients with the dp/cp sum's flat copy and the all-reduce's (or
//              ZeRO-2's reduce-scatter's), after backward, when the activations are gone
//   step       bf16-true: the masters' float32 gradients beside the bfloat16 ones
#pragma once

#include <optional>
#include <string>
#include <vector>

#include <minigrad/plan/model_arithmetic.h>
#include <minigrad/plan/planner.h>

#include "precision.h"
#include "split_model.h"

namespace mg::samples {

struct MemoryTerm {
  std::string name;
  double bytes = 0;
};

struct MemoryMoment {
  std::string name;
  std::vector<MemoryTerm> terms;  // only those above zero are kept
  double bytes() const;
  std::string describe() const;  // "backward 13.99 MiB (activations 13.99 MiB, ...)"
};

struct TrainerMoments {
  MemoryMoment always;
  std::vector<MemoryMoment> moments;  // the peak falls at the largest
  double peak() const;
  std::string describe() const;  // "always 4.67 MiB (...); the largest of: backward ..., sum ..."
};

// `r`: the planner's bytes for this rank's stage; `gloo`: the dp and cp groups are Gloo's (no 16-bit
// sums: they travel as float32). Empty where not priced so yet: the 16-bit precisions under
// FSDP's MixedPrecisionPolicy, FSDP with recompute (its
// peak moves late into backward, where an in-flight reduce-scatter's copy makes it vary by a
// unit from run to run), and in 16 bits a model whose precision_extra_bytes does not price
// them (the GPT's and the Llama's do).
std::optional<TrainerMoments> trainer_moments(const plan::RankMemory& r, const plan::ModelArithmetic& model,
                                              const ModelSplit& split, int stage, int64_t batch, int64_t T,
                                              Precision precision, bool fsdp_mp_policy, bool gloo);

}  // namespace mg::samples
