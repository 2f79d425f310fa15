#include "fsdp_moments.h"

#include <algorithm>
#include <cmath>

#include <fmt/format.h>

#include "memory_report.h"  // plan_split
#include "throughput.h"     // plan_precision

namespace mg::samples {

namespace {

// Only the moments that can be the peak of either bound: a moment whose most is below
// another's least never is.
std::vector<MemoryMoment> possible_peaks(std::vector<MemoryMoment> all) {
  double low = 0;
  for (const MemoryMoment& at : all) low = std::max(low, at.bytes());
  std::vector<MemoryMoment> kept;
  for (MemoryMoment& at : all)
    if (at.bytes() + at.racing_bytes() >= low) kept.push_back(std::move(at));
  return kept;
}

// What Gloo's thread allocates for a collective of a block of `elements` (its flat buffer,
// padded; `shard_elements` a rank's) whose units are `pb` bytes an element and flat gradients
// `gb` (process_group_gloo.cpp): the reduce-scatter's `slices` (the flat gradient's elements
// in float32); a 16-bit one (Gloo has no 16-bit sum) also its float32 copy `wire`, the
// float32 shard it sums into and that rounded back; a 16-bit gather its float32 output and
// input and the output rounded back (a float32 gather writes into the unit, allocated by the
// caller: nothing on the thread). Under the policy the gather's input is this rank's float32
// shard rounded to 16 bits, made at its launch and held by the work until it ends
// (flat_parameter.cpp).
struct GlooCollectives {
  double reduce_scatter, gather;
};

GlooCollectives gloo_collectives(double elements, double shard_elements, double pb, double gb, bool fsdp_mp_policy) {
  const bool widened = gb == 2;
  return {widened ? 4 * elements + 4 * elements + 4 * shard_elements + gb * shard_elements : 4 * elements,
          pb == 2 ? (fsdp_mp_policy ? 2 * shard_elements : 0) + 4 * elements + 4 * shard_elements + pb * elements : 0};
}

// Gloo's thread runs one collective at a time, block k + 1's reduce-scatter (when in flight)
// and then block k - 1's gather ahead: the race at block k's moment is the larger of those
// queued.
void add_gloo_race(MemoryMoment& at, int64_t k, bool in_flight, const GlooCollectives& gloo, bool widened,
                   bool fsdp_mp_policy) {
  std::vector<MemoryTerm> queued;
  if (in_flight)
    queued.push_back({fmt::format(widened ? "the reduce-scatter's widened copy, scratch, float32 shard and it "
                                            "rounded back (block {}'s, on Gloo's thread)"
                                          : "the reduce-scatter's scratch (block {}'s, on Gloo's thread)",
                                  k + 1),
                      gloo.reduce_scatter});
  if (k > 0 && gloo.gather > 0)
    queued.push_back({fmt::format(fsdp_mp_policy ? "the gather ahead's input, this rank's shard rounded to 16 bits, "
                                                   "its float32 output and input and it rounded back (block {}'s, "
                                                   "on Gloo's thread)"
                                                 : "the gather ahead's float32 output, this rank's float32 shard "
                                                   "and it rounded back (block {}'s, on Gloo's thread)",
                                  k - 1),
                      gloo.gather});
  if (!queued.empty())
    at.racing.push_back(*std::max_element(queued.begin(), queued.end(), [](const MemoryTerm& x, const MemoryTerm& y) {
      return x.bytes < y.bytes;
    }));
}

// A rank's FSDP units (fully_shard per layer over dp, beside tp a layer's tp shard): a
// layer's flat buffer padded to dp shards, its shard, and the root's flat buffer padded.
struct UnitSizes {
  double shard_elements, elements, root_elements;
};

UnitSizes unit_sizes(const plan::ModelArithmetic& model, const ModelSplit& split) {
  const double dp = split.dp;
  const double block_elements = model.block_param_elements(split.tp);
  const double shard = std::ceil(block_elements / dp);  // ceil(Psi_unit / N), padding in
  const double root = model.stage_param_elements(split.tp, 1, 0) -
                      static_cast<double>(model.stage_blocks(1, 0)) * block_elements;
  return {shard, shard * dp, std::ceil(root / dp) * dp};
}

// FSDP's buffers at block k's moment of the backward, `later` blocks gone back before it:
// the root's unit gathered and its flat gradient (made at ln_f's hook, at the start of
// backward), unit k gathered and k - 1 gathered ahead, block k's flat gradient (where
// `flat_k_made`), block k + 1's held by its reduce-scatter in flight, and the gradient shards
// of the blocks after it. Units are `pb` bytes an element, flat gradients and shards `gb`.
std::vector<MemoryTerm> block_buffers(int64_t k, double later, const UnitSizes& u, double pb, double gb,
                                      bool flat_k_made) {
  const double flat_grad = gb * u.elements;
  return {{"the root's unit gathered", pb * u.root_elements},
          {fmt::format("block {}'s unit gathered", k), pb * u.elements},
          {fmt::format("block {}'s unit gathered ahead", k - 1), k > 0 ? pb * u.elements : 0},
          {"the root's flat gradient", gb * u.root_elements},
          {fmt::format("block {}'s flat gradient", k), flat_k_made ? flat_grad : 0},
          {fmt::format("block {}'s flat gradient, its reduce-scatter in flight", k + 1), later > 0 ? flat_grad : 0},
          {"gradient shards of the blocks after it (one the reduce-scatter's output)", later * gb * u.shard_elements}};
}

}  // namespace

// FSDP with recompute over Gloo (fully_shard.cpp, sharded_grad_reducer.cpp,
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
// In 16 bits (dp alone) the recomputed block's terms are the model's precision_extra_bytes
// (as trainer_moments' first block going back), and its peak is c_proj's backward GEMM, in
// float32, before c_proj's hooks make block k's flat gradient. bf16-true's units, flat
// gradients and shards are bfloat16, and Gloo's thread widens what it moves: block k + 1's
// reduce-scatter holds a float32 copy of the flat gradient, the scratch, a float32 shard
// and that rounded back, block k - 1's gather ahead its float32 output and input and the
// output rounded back; one collective at a time, so the race is the larger of those queued.
// Under the policy (--fsdp-mp-policy) the units and compute are 16-bit (bf16-true's terms),
// the flat gradients and shards float32, and the gather ahead, with its input (this rank's
// shard rounded to 16 bits, made at its launch) is the race; its c_fc moment, block k's
// float32 flat gradient made for 16-bit activations gone, is the larger (the GPT's,
// gpt_zero2_released_bytes). Over dp x cp (32-true) the shards are over dp and the moment
// ring attention's backward, after block k's MLP went back: its flat gradient made.
TrainerMoments fsdp_recompute_moments(const plan::RankMemory& r, const plan::ModelArithmetic& model,
                                      const ModelSplit& split, int64_t batch, int64_t T, Precision precision,
                                      bool fsdp_mp_policy) {
  // The policy's compute is a 16-bit model's (bf16-true's terms), its flat gradients and
  // shards float32; autocast's compute keeps the residual stream float32.
  const bool autocast = !fsdp_mp_policy && (precision == Precision::BF16Mixed || precision == Precision::F16Mixed);
  const Precision compute = fsdp_mp_policy ? Precision::BF16True : precision;
  const bool sixteen = precision != Precision::True32;
  const double pb = compute == Precision::BF16True ? 2 : 4;  // a gathered unit's bytes an element
  const double gb = precision == Precision::BF16True ? 2 : 4;  // a flat gradient's and a gradient shard's
  const int64_t blocks = model.stage_blocks(1, 0);
  const UnitSizes u = unit_sizes(model, split);
  // A block's kept input: the residual stream, float32 under autocast.
  const double input = (autocast ? 4 : pb) * static_cast<double>(model.hidden_size()) *
                       static_cast<double>(batch / split.dp) * static_cast<double>(T / split.cp);
  // The 16-bit precisions' terms beside the activations (precision_extra_bytes, the
  // recomputed block's: trainer_moments.cpp's), the root's flat gradient out of the head's:
  // it is a term here.
  plan::PrecisionExtraBytes extra;
  if (sixteen) {
    const plan::MeshShape shape = plan::mesh_shape(plan_split(split), plan::Workload{batch, T});
    extra = *model.precision_extra_bytes(shape, 0, 3, true, plan_precision(compute));
    extra.head_grad -= pb * u.root_elements;
  }
  const std::string kind = autocast ? "autocast's" : "bf16-true's";
  const GlooCollectives gloo = gloo_collectives(u.elements, u.shard_elements, pb, gb, fsdp_mp_policy);

  TrainerMoments m;
  m.always = memory_moment("always", {{"params", r.params}, {"masters", r.master / 2}, {"optimizer", r.optimizer}});
  double c_fc_released = 0;  // the GPT's own (gpt_zero2_released_bytes), over dp alone
  if (const auto* gpt = dynamic_cast<const plan::GPTArithmetic*>(&model); gpt != nullptr && sixteen && split.cp == 1)
    c_fc_released = plan::gpt_zero2_released_bytes(
        gpt->config(), plan::mesh_shape(plan_split(split), plan::Workload{batch, T}), 2, autocast);
  std::vector<MemoryMoment> all;
  for (int64_t k = blocks - 1; k >= 0; --k) {
    const double later = static_cast<double>(blocks - 1 - k);  // blocks gone back before it
    const bool in_flight = later > 0;                            // block k + 1's reduce-scatter
    std::vector<MemoryTerm> terms = {{"activations", r.activations},
                                     {kind + " float32 saved tensors", extra.float32_saved},
                                     {"16-bit weight casts", extra.weight_casts},
                                     {"float32 backward working set", extra.backward},
                                     {"head gradient", extra.head_grad},
                                     {"the later blocks' inputs, freed", -later * input}};
    // in 16 bits the peak is c_proj's backward GEMM, before its hook makes block k's flat gradient
    const std::vector<MemoryTerm> buffers = block_buffers(k, later, u, pb, gb, !sixteen);
    terms.insert(terms.end(), buffers.begin(), buffers.end());
    MemoryMoment at = memory_moment(fmt::format("backward through block {}", k), std::move(terms));
    add_gloo_race(at, k, in_flight, gloo, gb == 2, fsdp_mp_policy);
    // The GPT's c_fc backward, later in block k (fsdp_mp_policy_moments' second moment): c_proj's
    // gradients went into block k's flat gradient at their hooks, c_fc's and GELU's outputs
    // and the GEMM's float32 working set are gone; larger where that flat gradient is float32
    // and the activations 16-bit without autocast's casts (the policy).
    if (c_fc_released > 0) {
      MemoryMoment later_in_block = at;
      later_in_block.name = fmt::format("backward through block {}'s c_fc, its flat gradient made", k);
      later_in_block.terms.push_back({"gone after c_proj's backward", -c_fc_released});
      later_in_block.terms.push_back({fmt::format("block {}'s flat gradient", k), gb * u.elements});
      all.push_back(std::move(later_in_block));
    }
    all.push_back(std::move(at));
  }
  m.moments = possible_peaks(std::move(all));
  return m;
}

// FSDP over dp x cp over Gloo, no recompute (fully_shard.cpp, ring_attention.cpp,
// sharded_grad_reducer.cpp): the peak is ring attention's backward in some block k (the
// planner's activations are that moment's for the last block, k = L - 1). A block's
// attention goes back after its MLP and c_proj, so its flat gradient is made by then, and
// each block gone back before frees its activations whole. Otherwise the buffers are
// fsdp_recompute_moments': unit k gathered and k - 1 ahead, the root's unit and flat
// gradient, block k + 1's flat gradient held by its reduce-scatter in flight, the shards of
// the blocks after; the race, that reduce-scatter's scratch on Gloo's thread. At the default
// shape the last block's moment is the low and block L - 2's with the scratch the high.
// In 16 bits the last block's moment holds the model's ring terms (precision_extra_bytes:
// the ring's float32 tensors, autocast's float32 saved tensors and weight casts), and each
// block gone back frees its share of them too (ring_block_extra_bytes). bf16-true's units,
// flat gradients and shards are bfloat16 and Gloo's thread widens what it moves
// (fsdp_recompute_moments': the larger of the reduce-scatter and the gather ahead queued).
// With recompute (16 bits; 32-true is fsdp_recompute_moments') the recomputed block k peaks
// in its ring attention's backward too: the same moment, the earlier blocks' activations not
// recomputed yet, each keeping its input instead. Under the policy (with recompute: without,
// fsdp_mp_policy_moments) the units and compute are 16-bit (bf16-true's terms), the flat
// gradients and shards float32, and the race the larger of the reduce-scatter's scratch and
// the gather ahead widened with its rounded input. Beside tp (fully_shard over dp on the tp
// model) every unit, flat gradient and shard is the rank's tp shard of a layer, and the
// planner's activations and ring terms are the tp rank's (the mesh's tp, ± SP).
TrainerMoments fsdp_ring_moments(const plan::RankMemory& r, const plan::ModelArithmetic& model,
                                 const ModelSplit& split, int64_t batch, int64_t T, Precision precision,
                                 bool fsdp_mp_policy) {
  // The policy's compute is a 16-bit model's (bf16-true's terms) on 16-bit units, its flat
  // gradients and shards float32.
  const Precision compute = fsdp_mp_policy ? Precision::BF16True : precision;
  const bool sixteen = precision != Precision::True32;
  const bool autocast = compute == Precision::BF16Mixed || compute == Precision::F16Mixed;
  const double pb = compute == Precision::BF16True ? 2 : 4;    // a gathered unit's bytes an element
  const double gb = precision == Precision::BF16True ? 2 : 4;  // a flat gradient's and a shard's
  const int64_t blocks = model.stage_blocks(1, 0);
  const UnitSizes u = unit_sizes(model, split);  // under tp the rank's tp shard of a layer
  const plan::MeshShape shape = plan::mesh_shape(plan_split(split), plan::Workload{batch, T});
  const double act_bytes = sixteen ? 2 : 4;
  // The last block's ring moment without recompute (the planner's, whatever split.recompute
  // says: recompute's moment is that one with every other block's activations gone).
  const double activations = act_bytes * model.activation_peak_floats(shape, 0, false);
  // The ring moment's 16-bit terms, without ZeRO-3's root flat gradient (a term here), and a
  // whole block's share of them.
  const plan::PrecisionExtraBytes extra = *model.precision_extra_bytes(shape, 0, 0, false, plan_precision(compute));
  const double block_freed = act_bytes * model.block_activation_floats(shape) +
                             model.ring_block_extra_bytes(shape, plan_precision(compute))->total();
  const std::string kind = autocast ? "autocast's" : "bf16-true's";
  const GlooCollectives gloo = gloo_collectives(u.elements, u.shard_elements, pb, gb, fsdp_mp_policy);

  TrainerMoments m;
  m.always = memory_moment("always", {{"params", r.params}, {"masters", r.master / 2}, {"optimizer", r.optimizer}});
  std::vector<MemoryMoment> all;
  // Recomputed (models::GPT's per-block checkpoint), blocks 0..k - 1 keep only their input,
  // the residual stream (float32 under autocast).
  const double input = (autocast ? 4 : act_bytes) * static_cast<double>(model.hidden_size()) /
                       (split.sequence_parallel ? split.tp : 1) * static_cast<double>(batch / split.dp) *
                       static_cast<double>(T / split.cp);
  for (int64_t k = blocks - 1; k >= 0; --k) {
    const double later = static_cast<double>(blocks - 1 - k);  // blocks gone back before it
    const bool in_flight = later > 0;                            // block k + 1's reduce-scatter
    const double earlier = static_cast<double>(k);
    std::vector<MemoryTerm> terms = {
        {"activations", activations},
         {kind + " float32 saved tensors", extra.float32_saved},
         {"16-bit weight casts", extra.weight_casts},
         {"the ring's float32 tensors and the backward's", extra.backward},
         {"head gradient", extra.head_grad},
         {"the later blocks' activations, freed", -later * block_freed},
         {"the earlier blocks' activations, not recomputed yet", split.recompute ? -earlier * block_freed : 0},
         {"the earlier blocks' inputs, kept", split.recompute ? earlier * input : 0},
         // the weight gradients the planner's ring moment holds, at their .grad's bytes
         {"the weight gradients made, in the flat gradients instead", -pb * model.ring_weight_gradient_floats(shape, 0)}};
    // block k's MLP went back before its attention: its flat gradient is made
    const std::vector<MemoryTerm> buffers = block_buffers(k, later, u, pb, gb, true);
    terms.insert(terms.end(), buffers.begin(), buffers.end());
    MemoryMoment at = memory_moment(
        fmt::format(split.recompute ? "ring attention's backward in block {}, recomputed" : "ring attention's backward in block {}", k),
        std::move(terms));
    add_gloo_race(at, k, in_flight, gloo, gb == 2, fsdp_mp_policy);
    all.push_back(std::move(at));
  }
  // After backward the shards' gradients are summed over cp: a flat copy and the all-reduce's;
  // over Gloo in bf16-true its float32 copy and the sum rounded back.
  all.push_back(memory_moment("sum over cp", {{"gradients", r.grads},
                                              {"their flat copy and the all-reduce's", 2 * r.grads},
                                              {"over Gloo, its float32 copy and the sum rounded back",
                                               gb == 2 ? 3 * r.grads : 0}}));
  if (gb == 2)
    all.push_back(memory_moment("step", {{"gradients", r.grads}, {"the masters' float32 gradients", r.master / 2}}));
  m.moments = possible_peaks(std::move(all));
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
  const UnitSizes u = unit_sizes(model, split);  // the rank's tp shard of a layer
  const double block_shard = u.shard_elements, block = u.elements, root = u.root_elements;

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
