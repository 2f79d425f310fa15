// FSDP's moments that are ranges (trainer_moments.h): a race with Gloo's communication thread
// makes their peak a low and a high.
#pragma once

#include <optional>

#include <minigrad/plan/model_arithmetic.h>
#include <minigrad/plan/planner.h>

#include "split_model.h"
#include "trainer_moments.h"

namespace mg::samples {

// FSDP with recompute (ZeRO-3, one stage, over Gloo: dp in every precision and under
// `fsdp_mp_policy`, dp x cp in 32-true: in 16 bits fsdp_ring_moments) is a range: its peak is a "backward through block
// k" (the recomputed block k going back, block k - 1 gathered ahead, block k + 1's
// reduce-scatter in flight: its flat gradient and its output shard, and the shards of the
// blocks reduced before), and whether Gloo's communication thread still holds a collective's
// buffers at it is a race: the reduce-scatter's scratch (`slices`, a flat gradient's size),
// in bf16-true widened (its float32 copy, scratch, shard and that rounded back), under the
// policy the gather ahead, widened; the low is the largest moment without them, the high the
// largest with them.
TrainerMoments fsdp_recompute_moments(const plan::RankMemory& r, const plan::ModelArithmetic& model,
                                      const ModelSplit& split, int64_t batch, int64_t T, Precision precision,
                                      bool fsdp_mp_policy);

// FSDP over dp x cp, beside tp (± SP) too (over Gloo; in 16 bits a model whose
// ring_block_extra_bytes prices them) is a range likewise: its peak is ring attention's
// backward in some block k, with the buffers of fsdp_recompute_moments' block k (beside tp
// the rank's tp shards of them), each block gone back having freed its activations and its
// 16-bit terms; with recompute (16 bits, or `fsdp_mp_policy`: its 16-bit units and compute,
// float32 flat gradients and shards, the gather ahead widened) block k is the recomputed
// one, the blocks before it holding their inputs alone.
TrainerMoments fsdp_ring_moments(const plan::RankMemory& r, const plan::ModelArithmetic& model,
                                 const ModelSplit& split, int64_t batch, int64_t T, Precision precision,
                                 bool fsdp_mp_policy);

// FSDP's MixedPrecisionPolicy (train_gpt --fsdp-mp-policy), bf16-mixed or 16-mixed, ZeRO-3
// over Gloo on dp, alone or beside tp (± SP), cp or both, without recompute: its 16-bit units and
// compute, float32 shards and flat gradients; the race is the unit gathered ahead, widened
// to float32 on Gloo's thread. std::nullopt where the model does not price its 16-bit
// compute or when its last layer's flat gradient is made (ModelArithmetic::flat_gradient_moment).
std::optional<TrainerMoments> fsdp_mp_policy_moments(const plan::RankMemory& r, const plan::ModelArithmetic& model,
                                                     const ModelSplit& split, int64_t batch, int64_t T);

}  // namespace mg::samples
