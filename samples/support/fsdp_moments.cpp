#include "fsdp_moments.h"

#include <algorithm>
#include <cmath>

#include <fmt/format.h>

#include "memory_report.h"  // plan_split

namespace mg::samples {

// FSDP with recompute, 32-true over Gloo (fully_shard.cpp, sharded_grad_reducer.cpp,
// process_group_gloo.cpp; docs/planning.md, "Planner against the trainer"). models::GPT
// checkpoints each block, so the recomputed block k (0 the first, the last to go back) is
// the one whose activations are whole, with the inputs of blocks 0..k kept and the later
// blocks' freed. Its recompute's forward pre-hook gathers unit k and starts gathering unit
// k - 1 (backward prefetch; for block 0 the root's unit, gathered since forward). Its
// weights' gradients go, at their post-accumulate hooks, into the unit's flat gradient
// (ShardedGradReducer's filling); block k + 1's flat gradient is still held by its
// reduce-scatter in flight (kMaxInFlight 1: waited at block k's launch), as is that
// reduce-scatter's output shard; the blocks reduced before have their gradient shards in
// .grad. The root's unit stays gathered and its flat gradient is made at ln_f's hook, at
// the start of backward. Gloo's communication thread runs block k + 1's reduce-scatter
// while compute runs block k's backward: its `slices` scratch (the size of the flat
// gradient) is alive at block k's moment if the peer rank lags, gone if the exchange is
// over: the race. Nothing else of the thread's allocates in 32-true (the prefetch's gather
// writes into the unit's flat buffer, allocated by the caller).
TrainerMoments fsdp_recompute_moments(const plan::RankMemory& r, const plan::ModelArithmetic& model,
                                      const ModelSplit& split, int64_t batch, int64_t T) {
  const double dp = split.dp;
  const int64_t blocks = model.stage_blocks(1, 0);
  const double block_shard = std::ceil(model.block_param_elements(1) / dp);  // ceil(Psi_unit / N), padding in
  const double unit = 4 * block_shard * dp;  // a block's flat buffer: gathered, or its flat gradient
  const double shard = 4 * block_shard;
  const double root_elements = model.stage_param_elements(1, 1, 0) - static_cast<double>(blocks) * model.block_param_elements(1);
  const double root_unit = 4 * std::ceil(root_elements / dp) * dp;
  const double input = 4 * static_cast<double>(model.hidden_size()) * static_cast<double>(batch / split.dp) *
                       static_cast<double>(T);  // a block's kept input

  TrainerMoments m;
  m.always = memory_moment("always", {{"params", r.params}, {"optimizer", r.optimizer}});
  std::vector<MemoryMoment> all;
  for (int64_t k = blocks - 1; k >= 0; --k) {
    const double later = static_cast<double>(blocks - 1 - k);  // blocks gone back before it
    const bool in_flight = later > 0;                            // block k + 1's reduce-scatter
    MemoryMoment at = memory_moment(fmt::format("backward through block {}", k),
                             {{"activations", r.activations},
                              {"the later blocks' inputs, freed", -later * input},
                              {"the root's unit gathered", root_unit},
                              {fmt::format("block {}'s unit gathered", k), unit},
                              {fmt::format("block {}'s unit gathered ahead", k - 1), k > 0 ? unit : 0},
                              {"the root's flat gradient", root_unit},
                              {fmt::format("block {}'s flat gradient", k), unit},
                              {fmt::format("block {}'s flat gradient, its reduce-scatter in flight", k + 1),
                               in_flight ? unit : 0},
                              {"gradient shards of the blocks after it (one the reduce-scatter's output)",
                               later * shard}});
    if (in_flight)
      at.racing.push_back({fmt::format("the reduce-scatter's scratch (block {}'s, on Gloo's thread)", k + 1), unit});
    all.push_back(std::move(at));
  }
  // Only the moments that can be the peak of either bound: a moment whose most is below
  // another's least never is.
  double low = 0;
  for (const MemoryMoment& at : all) low = std::max(low, at.bytes());
  for (MemoryMoment& at : all)
    if (at.bytes() + at.racing_bytes() >= low) m.moments.push_back(std::move(at));
  return m;
}

// FSDP's MixedPrecisionPolicy (train_gpt --fsdp-mp-policy: torchtitan's), bf16-mixed or
// 16-mixed, on dp over Gloo, alone or beside tp (± SP), cp or both (fully_shard.cpp,
// flat_parameter.cpp, sharded_grad_reducer.cpp, process_group_gloo.cpp; docs/planning.md,
// "Planner against the trainer"). The shards and AdamW's state are float32 (the planner's
// params and optimizer at 4 bytes); each unit, a layer's tp shard under tp, is gathered in
// the 16-bit param_dtype and forward and backward run on it without autocast: a 16-bit
// model's compute, as bf16-true's (the model's precision_extra_bytes in bf16-true, at ZeRO 0:
// its head gradient without bf16-true's 16-bit root flat gradient), the activations at 2
// bytes. What differs from bf16-true's ZeRO-3: the gathered units are the planner's at 2
// bytes (its bf16-mixed units are float32), the flat gradients are float32 (reduce_dtype:
// sharded_grad_reducer.cpp copies each 16-bit gradient into it), no masters, and the
// gather's input is this rank's float32 shard rounded to 16 bits (flat_parameter.cpp).
// The last layer's float32 flat gradient is made at its first post-accumulate hook; the
// model says when that is against the backward's peak (flat_gradient_moment): after it (the
// GPT's c_fc, the Llama's gate and up, on dp and tp: two moments, the peak without it and
// the later one with it, less what has gone since) or before it (the GPT's c_proj bias
// under tp, ring attention's backward under cp: one moment, the peak with it). The race is
// bf16-true's: the unit gathered ahead (layer L - 2, prefetched at layer L - 1's
// pre-backward hook) travels widened on Gloo's thread, which frees each of its buffers (the
// rounded shard too: the work's closure holds it) when the gather ends.
std::optional<TrainerMoments> fsdp_mp_policy_moments(const plan::RankMemory& r, const plan::ModelArithmetic& model,
                                                     const ModelSplit& split, int64_t batch, int64_t T) {
  const plan::MeshShape shape = plan::mesh_shape(plan_split(split), plan::Workload{batch, T});
  // bf16-true's compute at ZeRO 0: its head gradient without the root's 16-bit flat gradient
  // (here float32, below).
  const std::optional<plan::PrecisionExtraBytes> priced =
      model.precision_extra_bytes(shape, 0, 0, false, plan::Precision::BF16True);
  const std::optional<plan::FlatGradientMoment> flat = model.flat_gradient_moment(shape);
  if (!priced || !flat) return std::nullopt;
  const plan::PrecisionExtraBytes compute = *priced;
  const double dp = split.dp;
  const double block_elements = model.block_param_elements(split.tp);  // the rank's tp shard of a layer
  const double block_shard = std::ceil(block_elements / dp);            // ceil(Psi_unit / N), padding in
  const double block = block_shard * dp;                                // a layer's flat buffer, padded
  const double root_elements =
      model.stage_param_elements(split.tp, 1, 0) - static_cast<double>(model.stage_blocks(1, 0)) * block_elements;
  const double root = std::ceil(root_elements / dp) * dp;

  TrainerMoments m;
  m.always = memory_moment("always", {{"params", r.params}, {"optimizer", r.optimizer}});
  const std::vector<MemoryTerm> peak = {
      {"activations", r.activations},
      {"bf16-true's float32 saved tensors", compute.float32_saved},
      {"float32 backward working set", compute.backward},
      {"the head's 16-bit gradient", compute.head_grad},
      {"the root's flat gradient, float32", 4 * root},
      {"ZeRO-3's gathered units in 16 bits (the root's, the last layer's, the one gathered ahead)",
       2 * (root + 2 * block)}};
  std::vector<MemoryTerm> made = peak;
  made.push_back({flat->before_peak ? "the weight gradients made, in it (not 16-bit .grad)" : "gone since the peak",
                  -flat->released});
  made.push_back({"the last layer's flat gradient, float32", 4 * block});
  const MemoryTerm gather = {"the unit gathered ahead, widened for Gloo: this rank's shard rounded to 16 bits, it "
                             "widened to float32, the float32 output and it rounded back (on Gloo's thread)",
                             2 * block_shard + 4 * block_shard + 4 * block + 2 * block};
  if (!flat->before_peak) {  // the peak without it, and the later moment with it
    MemoryMoment at_peak = memory_moment("backward (the last layer's peak)", peak);
    at_peak.racing.push_back(gather);
    m.moments.push_back(std::move(at_peak));
  }
  MemoryMoment at_made = memory_moment("backward (the last layer's, its flat gradient made)", made);
  at_made.racing.push_back(gather);
  m.moments.push_back(std::move(at_made));
  m.moments.push_back(memory_moment("gradients", {{"gradients", r.grads}}));
  return m;
}

}  // namespace mg::samples
