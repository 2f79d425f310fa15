// The planner's terms taken at the moments train_gpt holds them. The planner sums every term
// at its largest; the trainer's peak is what it always holds plus the largest of a few
// moments, each a handful of named terms read off its live blocks (train_gpt
// --memory-blocks; docs/planning.md, "Planner against the trainer"):
//   always     parameters, masters, optimizer state, and under --pp the model the pipeline
//              was cut from (kept for checkpoints)
//   backward   the activations at their peak, what the 16-bit precisions keep beside them,
//              the gradients of the pipeline's backwards before it, FSDP's gathered units
//              and flat gradients (the root's; the last layer's where the model makes it
//              before the peak: the GPT's c_proj bias under tp) (no gradient otherwise:
//              zero_grad sets them to none, and the engine adds each weight's into .grad at
//              the end of backward)
//   recompute  models::GPT's per-block checkpoint: the first block going back, the later
//              blocks' inputs freed and their gradients in .grad; the pipeline's (the whole
//              stage redone per micro-batch): its last backward, every earlier one's
//              gradients in .grad and every message of the step held
//   ZeRO-2's   later in backward: its flat gradients made, part of the activations gone
//   sum        the gradients with the dp/cp sum's flat copy and the all-reduce's (or
//              ZeRO-2's reduce-scatter's), after backward, when the activations are gone
//   step       bf16-true: the masters' float32 gradients beside the bfloat16 ones
//   FSDP with  backward through block k (each k): block k recomputed, its unit, the one
//   recompute  gathered ahead and the root's, the flat gradients of k (in 16 bits not yet:
//              the peak is c_proj's GEMM), of k + 1 (its reduce-scatter in flight) and the
//              root's, the gradient shards reduced; under the policy also block k's c_fc
//              backward, its float32 flat gradient made; over dp x cp in 16 bits ring
//              attention's backward in the recomputed block k (as FSDP over cp's)
//   FSDP over  ring attention's backward in block k (each k): the blocks after it gone back,
//   cp         their activations and 16-bit terms freed, with FSDP with recompute's buffers
//              (beside tp the rank's tp shards; under the policy with recompute its 16-bit
//              units and float32 flat gradients, in the recomputed block k)
//   FSDP's     (--fsdp-mp-policy: float32 shards, 16-bit units and compute, float32 flat
//   mixed      gradients) the backward's peak, and the moment the last layer's float32 flat
//   precision  gradient is made if that is later (the GPT's c_fc, the Llama's gate and up;
//   policy     over tp the GPT's c_proj bias and under cp ring attention hold it at the peak)
// and two racing terms, which make the peak a range: FSDP with recompute's Gloo scratch for
// block k + 1's reduce-scatter (in bf16-true widened), and under bf16-true ZeRO-3 and FSDP's
// MixedPrecisionPolicy over Gloo the backward's unit gathered ahead, widened to float32 on
// the communication thread (under the policy with its input, this rank's float32 shard
// rounded to 16 bits; with recompute too, where it is the larger).
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
  // What another thread may still hold at this moment, or may have freed already: Gloo's
  // communication thread's scratch for a collective in flight. Alive only in some runs.
  std::vector<MemoryTerm> racing;
  double bytes() const;         // the terms alone: the communication thread done
  double racing_bytes() const;  // what its work in flight adds
  std::string describe() const;  // "backward 13.99 MiB (activations 13.99 MiB, ...)"
};

// The peak is what the rank always holds plus the largest moment. Where a moment has racing
// terms the peak is a range: `low()`, every collective finished before compute reached its
// moments (the largest moment's terms alone), to `high()`, the largest of the moments with
// their racing terms alive; where both are one moment, high() - low() is its racing terms.
struct TrainerMoments {
  MemoryMoment always;
  std::vector<MemoryMoment> moments;  // the peak falls at the largest
  double peak() const;  // low(): the single figure of a split with no race
  double low() const { return peak(); }
  double high() const;
  bool is_range() const { return high() > low(); }
  const MemoryMoment& low_moment() const;
  const MemoryMoment& high_moment() const;
  std::string describe() const;  // "always 4.67 MiB (...); the largest of: backward ..., sum ..."
  // "always ...; the low: the largest of: ...; the high adds: <its racing terms> at <moment>
  // (a race with Gloo's communication thread)"
  std::string describe_range() const;
};

// A moment of these terms, those at zero left out.
MemoryMoment memory_moment(std::string name, std::vector<MemoryTerm> terms);

// `r`: the planner's bytes for this rank's stage; `gloo`: the dp and cp groups are Gloo's (no 16-bit
// sums: they travel as float32). FSDP with recompute and FSDP's MixedPrecisionPolicy
// (`fsdp_mp_policy`) and FSDP over dp x cp (beside tp too) are ranges of their own
// (fsdp_moments.h). Empty where not priced so yet: FSDP over NCCL (no Gloo thread's race;
// not measurable here), FSDP with recompute beside tp (train_gpt refuses --recompute with
// --tp but without --pp, and ZeRO-3 with --pp), and in 16 bits a model whose
// precision_extra_bytes (flat_gradient_moment under the policy, ring_block_extra_bytes over
// cp) does not price them (the GPT's and the Llama's do).
std::optional<TrainerMoments> trainer_moments(const plan::RankMemory& r, const plan::ModelArithmetic& model,
                                              const ModelSplit& split, int stage, int64_t batch, int64_t T,
                                              Precision precision, bool fsdp_mp_policy, bool gloo);

}  // namespace mg::samples
