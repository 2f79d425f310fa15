#include "trainer_moments.h"

#include <algorithm>
#include <cmath>

#include <fmt/format.h>

#include "fsdp_moments.h"
#include "memory_report.h"  // plan_split, mib
#include "throughput.h"     // plan_precision

namespace mg::samples {

namespace {

// The share of a pipeline stage's parameters whose chunks ran a backward before the stage's
// peak (plan::pipeline_peak; each interleaved chunk is a virtual stage of a pp x v cut).
double gone_back_share(const plan::ModelArithmetic& model, const plan::Split& s, const plan::MeshShape& mesh,
                       int stage) {
  const plan::PipelinePeak peak = plan::pipeline_peak(mesh, stage);
  const int v = mesh.model_chunks;
  double gone = 0, all = 0;
  for (int c = 0; c < v; ++c) {
    const double chunk = model.stage_param_elements(s.tp, s.pp * v, c * s.pp + stage);
    all += chunk;
    if (peak.gone_back[static_cast<size_t>(c)]) gone += chunk;
  }
  return gone / all;
}


}  // namespace

MemoryMoment memory_moment(std::string name, std::vector<MemoryTerm> terms) {
  terms.erase(std::remove_if(terms.begin(), terms.end(), [](const MemoryTerm& t) { return t.bytes == 0; }),
              terms.end());
  return {std::move(name), std::move(terms), {}};
}

double MemoryMoment::bytes() const {
  double sum = 0;
  for (const MemoryTerm& t : terms) sum += t.bytes;
  return sum;
}

double MemoryMoment::racing_bytes() const {
  double sum = 0;
  for (const MemoryTerm& t : racing) sum += t.bytes;
  return sum;
}

std::string MemoryMoment::describe() const {
  std::string parts;
  for (const MemoryTerm& t : terms) parts += (parts.empty() ? "" : ", ") + t.name + " " + mib(t.bytes);
  return fmt::format("{} {} ({})", name, mib(bytes()), parts);
}

double TrainerMoments::peak() const {
  double most = 0;
  for (const MemoryMoment& m : moments) most = std::max(most, m.bytes());
  return always.bytes() + most;
}

double TrainerMoments::high() const {
  double most = 0;
  for (const MemoryMoment& m : moments) most = std::max(most, m.bytes() + m.racing_bytes());
  return always.bytes() + most;
}

const MemoryMoment& TrainerMoments::low_moment() const {
  return *std::max_element(moments.begin(), moments.end(),
                           [](const MemoryMoment& a, const MemoryMoment& b) { return a.bytes() < b.bytes(); });
}

const MemoryMoment& TrainerMoments::high_moment() const {
  return *std::max_element(moments.begin(), moments.end(), [](const MemoryMoment& a, const MemoryMoment& b) {
    return a.bytes() + a.racing_bytes() < b.bytes() + b.racing_bytes();
  });
}

std::string TrainerMoments::describe() const {
  std::string largest;
  for (const MemoryMoment& m : moments) largest += (largest.empty() ? "" : ", ") + m.describe();
  return fmt::format("{}; the largest of: {}", always.describe(), largest);
}

std::string TrainerMoments::describe_range() const {
  const MemoryMoment& high = high_moment();
  std::string adds;
  for (const MemoryTerm& t : high.racing) adds += (adds.empty() ? "" : ", ") + t.name + " " + mib(t.bytes);
  return fmt::format("{}; the low: {} {}; the high adds: {} at {} (a race with Gloo's communication thread)",
                     describe(), low_moment().name, mib(low()), adds, high.name);
}

std::optional<TrainerMoments> trainer_moments(const plan::RankMemory& r, const plan::ModelArithmetic& model,
                                              const ModelSplit& split, int stage, int64_t batch, int64_t T,
                                              Precision precision, bool fsdp_mp_policy, bool gloo) {
  if (split.zero == 3 && split.recompute) {  // a range of its own, under the policy too (fsdp_recompute_moments)
    const Precision compute = fsdp_mp_policy ? Precision::BF16True : precision;
    // Under cp in 16 bits the recomputed block peaks in ring attention's float32 backward,
    // which the planner prices under recompute as c_proj's moment with a ring term on top
    // (gpt_activation_moments), its 16-bit terms c_proj's: fsdp_ring_moments prices the ring's
    // moment itself, from the planner's without recompute (under the policy too: its
    // 16-bit compute's terms, bf16-true's).
    if (!gloo || split.tp > 1 || split.pp > 1) return std::nullopt;
    if (split.cp > 1 && compute != Precision::True32) {
      if (!model.ring_block_extra_bytes(plan::mesh_shape(plan_split(split), plan::Workload{batch, T}),
                                        plan_precision(compute)))
        return std::nullopt;
      return fsdp_ring_moments(r, model, split, batch, T, precision, fsdp_mp_policy);
    }
    if (compute != Precision::True32 &&
        !model.precision_extra_bytes(plan::mesh_shape(plan_split(split), plan::Workload{batch, T}), 0, 3, true,
                                     plan_precision(compute)))
      return std::nullopt;
    return fsdp_recompute_moments(r, model, split, batch, T, precision, fsdp_mp_policy);
  }
  if (fsdp_mp_policy) {  // FSDP's MixedPrecisionPolicy: ZeRO-3 over Gloo on dp (x tp, x cp), no recompute
    if ((precision != Precision::BF16Mixed && precision != Precision::F16Mixed) || split.zero != 3 ||
        split.dp < 2 || !gloo || split.pp > 1)
      return std::nullopt;
    return fsdp_mp_policy_moments(r, model, split, batch, T);
  }
  if (split.zero == 3 && split.cp > 1) {  // ring attention's moments (fsdp_ring_moments)
    // In 16 bits each block gone back also frees its own float32 and cast tensors: the
    // model's ring_block_extra_bytes.
    if (!gloo ||
        !model.ring_block_extra_bytes(plan::mesh_shape(plan_split(split), plan::Workload{batch, T}),
                                      plan_precision(precision)))
      return std::nullopt;
    return fsdp_ring_moments(r, model, split, batch, T, precision, false);
  }
  const bool mixed = precision == Precision::BF16Mixed || precision == Precision::F16Mixed;
  const bool bf16_true = precision == Precision::BF16True;
  const double pb = bf16_true ? 2 : 4;  // a parameter's bytes

  // What the 16-bit precisions keep beside the activations at 2 bytes a float (the model's
  // precision_extra_bytes: plan::gpt_bf16_mixed_extra_bytes, gpt_bf16_true_extra_bytes,
  // the Llama's), and what ZeRO-2's later moment no longer holds (gpt_zero2_released_bytes,
  // the GPT's alone).
  const plan::Split planned = plan_split(split);
  const plan::MeshShape shape = plan::mesh_shape(planned, plan::Workload{batch, T});
  const std::optional<plan::PrecisionExtraBytes> priced =
      model.precision_extra_bytes(shape, stage, split.zero, split.recompute, plan_precision(precision));
  if (!priced) return std::nullopt;
  const plan::PrecisionExtraBytes extra = *priced;
  double zero2_released = 0;
  if (const auto* gpt = dynamic_cast<const plan::GPTArithmetic*>(&model); gpt != nullptr)
    if (split.zero == 2 && split.tp == 1)  // the activations' bytes: 2 in both 16-bit precisions
      zero2_released = plan::gpt_zero2_released_bytes(gpt->config(), shape, precision == Precision::True32 ? 4 : 2, mixed);
  const std::string kind = mixed ? "autocast's" : "bf16-true's";
  const std::vector<MemoryTerm> extras = {{kind + " float32 saved tensors", extra.float32_saved},
                                          {"16-bit weight casts", extra.weight_casts},
                                          {"float32 backward working set", extra.backward},
                                          {"float32 pipeline messages", extra.messages},
                                          {"head gradient", extra.head_grad}};

  // Gloo has no 16-bit reduction: a 16-bit tensor is summed as a float32 copy (`wire` times
  // its bytes) and rounded back into its dtype on arrival.
  const bool widened = pb == 2 && (split.dp > 1 || split.cp > 1) && gloo;
  const double wire = widened ? 4 / pb : 1;
  const double flat = split.zero == 2 ? r.buffers / 2 : 0;  // ZeRO-2's buckets' flat gradients
  const double masters = r.master / 2;  // bf16-true's float32 masters; their gradients as much again
  const double unit = pb * model.block_param_elements(split.tp);
  // The residual stream of the rank's tokens (float32 under autocast), in bytes: what a
  // recomputed block or stage keeps of each micro-batch, and what a pipeline message carries.
  const double stream = static_cast<double>(model.hidden_size()) / (split.sequence_parallel ? split.tp : 1) *
                        static_cast<double>(batch / split.dp) * static_cast<double>(T / split.cp) * (mixed ? 4 : pb);

  TrainerMoments m;
  m.always = memory_moment("always", {{"params", r.params},
                               {"masters", bf16_true ? masters : r.master},
                               {"optimizer", r.optimizer},
                               // the one the pipeline was cut from: under tp, this rank's shard
                               {"the model kept under --pp", split.pp > 1 ? pb * model.stage_param_elements(split.tp, 1, 0) : 0}});

  std::vector<MemoryTerm> backward = {{"activations", r.activations}};
  backward.insert(backward.end(), extras.begin(), extras.end());
  // Under cp the GPT's peak is ring attention's backward, by which a block's MLP and c_proj
  // have made their weight gradients: in the step's first backward they are .grad already
  // (the planner's activations leave them out; the Llama's count them). In 32-true: in the
  // 16-bit precisions the same term over-prices cp 2 by 1.3 % (0.987; 1.000 to 1.029
  // without it), not yet read off their blocks.
  if (const auto* gpt = dynamic_cast<const plan::GPTArithmetic*>(&model);
      gpt != nullptr && precision == Precision::True32 && split.cp > 1 && !split.recompute && split.zero <= 1 &&
      plan::gpt_activation_moments(gpt->config(), shape, stage).ring >=
          plan::gpt_activation_moments(gpt->config(), shape, stage).backward)
    backward.push_back({"weight gradients made before ring attention's backward",
                        pb * plan::gpt_ring_weight_grad_elements(gpt->config(), shape, stage)});
  // Under --pp a stage's activation peak is a backward late in its schedule; the chunks that
  // ran a backward before it (1F1B: when m > pp - stage) have their gradients in .grad.
  backward.push_back({"gradients of the backwards before",
                      split.pp > 1 ? r.grads * gone_back_share(model, planned, shape, stage) : 0});
  const std::vector<MemoryTerm> before_gradients = backward;
  // FSDP's gathered units; over Gloo in 16 bits the unit gathered ahead also travels as
  // float32 (its float32 output and this rank's shard widened, then it rounded back), made
  // and freed by the communication thread while compute runs the last block's backward:
  // some runs' peaks hold all of it, some part, some none (a race: the backward's racing
  // terms; the rest of the moment is the low).
  backward.push_back({"ZeRO-3's gathered units", split.zero == 3 ? r.buffers : 0});
  if (split.zero == 3) {
    // FSDP's flat gradients (fully_shard.cpp, sharded_grad_reducer.cpp): the root's is made
    // at the start of backward (in 16 bits the model's head_grad holds it); the last layer's
    // at its first post-accumulate hook, alive at the peak where the model says it comes
    // before it (the GPT's c_proj bias under tp: flat_gradient_moment), less the weight
    // gradients that peak prices as .grad (`released`, at 2 bytes an element).
    const double layer = std::ceil(model.block_param_elements(split.tp) / split.dp) * split.dp;
    const double root = std::ceil((model.stage_param_elements(split.tp, 1, 0) -
                                   static_cast<double>(model.stage_blocks(1, 0)) * model.block_param_elements(split.tp)) /
                                  split.dp) * split.dp;
    backward.push_back({"the root's flat gradient", precision == Precision::True32 ? 4 * root : 0});
    const std::optional<plan::FlatGradientMoment> made_at = model.flat_gradient_moment(shape);
    if (made_at && made_at->before_peak && split.pp == 1) {
      backward.push_back({"the last layer's flat gradient", pb * layer});
      backward.push_back({"its weight gradients, in it (not .grad)", -made_at->released * pb / 2});
    }
  }
  MemoryMoment backward_moment = memory_moment("backward", backward);
  if (split.zero == 3 && widened)
    backward_moment.racing.push_back({"the unit gathered ahead, widened for Gloo: its float32 output, this rank's "
                                      "float32 shard and it rounded back (on Gloo's thread)",
                                      (wire * (1 + 1.0 / split.dp) + 1) * unit});
  m.moments.push_back(std::move(backward_moment));

  // Recomputed per block (one stage: models::GPT's checkpoint), each block's backward runs
  // one of its own and adds its weights' gradients into .grad at once, and a block's kept
  // input is freed once it has gone back: so the first block going back holds the fewest
  // inputs and the most gradients, a moment that can be larger than the last block's.
  if (split.recompute && split.pp == 1 && model.stage_blocks(1, 0) > 1) {
    const double later_blocks = static_cast<double>(model.stage_blocks(1, 0) - 1);
    std::vector<MemoryTerm> first = backward;
    first.push_back({"the later blocks' inputs, freed", -later_blocks * stream});
    first.push_back({"their gradients", later_blocks * pb * model.block_param_elements(split.tp)});
    m.moments.push_back(memory_moment("backward through the first block", first));
  }

  // The pipeline's recompute (the whole stage's forward per micro-batch) keeps about as much
  // at each backward, so its last one, with every earlier backward's gradients in .grad and
  // every message of the step held, can be the larger moment.
  if (split.recompute && split.pp > 1 && shape.model_chunks == 1 && plan::micro_batches_of(shape) > 1 &&
      gone_back_share(model, planned, shape, stage) < 1) {
    const plan::PipelinePeak peak = plan::pipeline_peak(shape, stage);
    const double m_count = plan::micro_batches_of(shape);
    const double message = stream / m_count;
    const plan::AliveBlocks alive = plan::alive_blocks(model.stage_blocks(split.pp, stage), shape, stage, true);
    const bool receives = stage != split.pp - 1;
    std::vector<MemoryTerm> last = before_gradients;
    last.push_back({"the other micro-batches' inputs, freed", -alive.kept_inputs * message});
    last.push_back({"the messages sent since",
                    (m_count - static_cast<double>(peak.forwards_sent) + m_count - 1 -
                     static_cast<double>(peak.gradients_sent) - (receives ? std::min(peak.in_flight, 2.0) - 1 : 0)) *
                        message});
    last.push_back({"gradients", r.grads});
    m.moments.push_back(memory_moment("the last backward", last));
  }

  if (split.zero == 2) {  // its flat gradients, made once the last block's c_proj has gone back
    std::vector<MemoryTerm> later = {{"activations", r.activations}};
    later.insert(later.end(), extras.begin(), extras.end());
    later.push_back({"gone after c_proj's backward", -zero2_released});
    later.push_back({"ZeRO-2's flat gradients", flat});
    m.moments.push_back(memory_moment("ZeRO-2's flat gradients made", later));
  }

  if ((split.dp > 1 || split.cp > 1) && split.zero <= 1)
    m.moments.push_back(memory_moment("sum", {{"gradients", r.grads},
                                       {"their flat copy and the all-reduce's", 2 * r.grads},
                                       {"over Gloo, its float32 copy and the sum rounded back",
                                        widened ? (wire + 1) * r.grads : 0}}));
  else if (split.zero == 2)
    m.moments.push_back(memory_moment("reduce-scatter", {{"gradient shards", r.grads},
                                                  {"flat gradients", flat},
                                                  {"the reduce-scatter's scratch", wire * flat},
                                                  {"over Gloo, the widened copy, the float32 shard and it rounded back",
                                                   widened ? wire * flat + (wire + 1) * r.grads : 0}}));
  else
    m.moments.push_back(memory_moment("gradients", {{"gradients", r.grads}}));

  if (bf16_true)
    m.moments.push_back(memory_moment("step", {{"gradients", r.grads}, {"the masters' float32 gradients", masters}}));
  return m;
}

}  // namespace mg::samples
