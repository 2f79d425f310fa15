#include "trainer_moments.h"

#include <algorithm>

#include <fmt/format.h>

#include "memory_report.h"  // plan_split

namespace mg::samples {

namespace {

std::string mib(double bytes) { return fmt::format("{:.2f} MiB", bytes / (1024.0 * 1024.0)); }

MemoryMoment moment(std::string name, std::vector<MemoryTerm> terms) {
  terms.erase(std::remove_if(terms.begin(), terms.end(), [](const MemoryTerm& t) { return t.bytes == 0; }),
              terms.end());
  return {std::move(name), std::move(terms)};
}

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

double MemoryMoment::bytes() const {
  double sum = 0;
  for (const MemoryTerm& t : terms) sum += t.bytes;
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

std::string TrainerMoments::describe() const {
  std::string largest;
  for (const MemoryMoment& m : moments) largest += (largest.empty() ? "" : ", ") + m.describe();
  return fmt::format("{}; the largest of: {}", always.describe(), largest);
}

std::optional<TrainerMoments> trainer_moments(const plan::RankMemory& r, const plan::ModelArithmetic& model,
                                              const ModelSplit& split, int stage, int64_t batch, int64_t T,
                                              Precision precision, bool fsdp_mp_policy, bool gloo) {
  const bool mixed = precision == Precision::BF16Mixed || precision == Precision::F16Mixed;
  const bool bf16_true = precision == Precision::BF16True;
  const double pb = bf16_true ? 2 : 4;  // a parameter's bytes

  // What the 16-bit precisions keep beside the activations at 2 bytes a float (the model's
  // precision_extra_bytes: plan::gpt_bf16_mixed_extra_bytes, gpt_bf16_true_extra_bytes,
  // the Llama's), and what ZeRO-2's later moment no longer holds (gpt_zero2_released_bytes,
  // the GPT's alone).
  if (split.zero == 3 && split.recompute) return std::nullopt;
  if (precision != Precision::True32 && fsdp_mp_policy) return std::nullopt;
  const plan::Split planned = plan_split(split);
  const plan::MeshShape shape = plan::mesh_shape(planned, plan::Workload{batch, T});
  const plan::Precision planned_precision = mixed       ? (precision == Precision::F16Mixed ? plan::Precision::F16Mixed
                                                                                              : plan::Precision::BF16Mixed)
                                            : bf16_true ? plan::Precision::BF16True
                                                        : plan::Precision::True32;
  const std::optional<plan::PrecisionExtraBytes> priced =
      model.precision_extra_bytes(shape, stage, split.zero, split.recompute, planned_precision);
  if (!priced) return std::nullopt;
  const plan::PrecisionExtraBytes extra = *priced;
  double zero2_released = 0;
  if (const auto* gpt = dynamic_cast<const plan::GPTArithmetic*>(&model); gpt != nullptr && !fsdp_mp_policy)
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

  TrainerMoments m;
  m.always = moment("always", {{"params", r.params},
                               {"masters", bf16_true ? masters : r.master},
                               {"optimizer", r.optimizer},
                               // the one the pipeline was cut from: under tp, this rank's shard
                               {"the model kept under --pp", split.pp > 1 ? pb * model.stage_param_elements(split.tp, 1, 0) : 0}});

  std::vector<MemoryTerm> backward = {{"activations", r.activations}};
  backward.insert(backward.end(), extras.begin(), extras.end());
  // Under --pp a stage's activation peak is a backward late in its schedule; the chunks that
  // ran a backward before it (1F1B: when m > pp - stage) have their gradients in .grad.
  backward.push_back({"gradients of the backwards before",
                      split.pp > 1 ? r.grads * gone_back_share(model, planned, shape, stage) : 0});
  const std::vector<MemoryTerm> before_gradients = backward;
  // FSDP's gathered units; over Gloo in 16 bits also the unit gathered ahead as float32 (the
  // unit and this rank's shard of it, widened) and rounded back, which the communication
  // thread makes at a moment of its own: some runs' peaks hold it, some not; this is the most.
  backward.push_back({"ZeRO-3's gathered units",
                      split.zero == 3 ? r.buffers + (widened ? (wire * (1 + 1.0 / split.dp) + 1) * unit : 0) : 0});
  m.moments.push_back(moment("backward", backward));

  // Recomputed per block (one stage: models::GPT's checkpoint), each block's backward runs
  // one of its own and adds its weights' gradients into .grad at once, and a block's kept
  // input is freed once it has gone back: so the first block going back holds the fewest
  // inputs and the most gradients, a moment that can be larger than the last block's.
  if (split.recompute && split.pp == 1 && model.stage_blocks(1, 0) > 1) {
    const double later_blocks = static_cast<double>(model.stage_blocks(1, 0) - 1);
    const double hidden = static_cast<double>(model.hidden_size()) / (split.sequence_parallel ? split.tp : 1);
    const double tokens = static_cast<double>(batch / split.dp) * static_cast<double>(T / split.cp);
    const double kept = mixed ? 4 : pb;  // the residual stream is float32 under autocast
    std::vector<MemoryTerm> first = backward;
    first.push_back({"the later blocks' inputs, freed", -later_blocks * hidden * tokens * kept});
    first.push_back({"their gradients", later_blocks * pb * model.block_param_elements(split.tp)});
    m.moments.push_back(moment("backward through the first block", first));
  }

  // The pipeline's recompute (the whole stage's forward per micro-batch) keeps about as much
  // at each backward, so its last one, with every earlier backward's gradients in .grad and
  // every message of the step held, can be the larger moment.
  if (split.recompute && split.pp > 1 && shape.model_chunks == 1 && plan::micro_batches_of(shape) > 1 &&
      gone_back_share(model, planned, shape, stage) < 1) {
    const plan::PipelinePeak peak = plan::pipeline_peak(shape, stage);
    const double m_count = plan::micro_batches_of(shape);
    const double message = static_cast<double>(model.hidden_size()) / (split.sequence_parallel ? split.tp : 1) *
                           static_cast<double>(batch / split.dp) * static_cast<double>(T / split.cp) / m_count *
                           (mixed ? 4 : pb);
    const plan::AliveBlocks alive = plan::alive_blocks(model.stage_blocks(split.pp, stage), shape, stage, true);
    const bool receives = stage != split.pp - 1;
    std::vector<MemoryTerm> last = before_gradients;
    last.push_back({"the other micro-batches' inputs, freed", -alive.kept_inputs * message});
    last.push_back({"the messages sent since",
                    (m_count - static_cast<double>(peak.forwards_sent) + m_count - 1 -
                     static_cast<double>(peak.gradients_sent) - (receives ? std::min(peak.in_flight, 2.0) - 1 : 0)) *
                        message});
    last.push_back({"gradients", r.grads});
    m.moments.push_back(moment("the last backward", last));
  }

  if (split.zero == 2) {  // its flat gradients, made once the last block's c_proj has gone back
    std::vector<MemoryTerm> later = {{"activations", r.activations}};
    later.insert(later.end(), extras.begin(), extras.end());
    later.push_back({"gone after c_proj's backward", -zero2_released});
    later.push_back({"ZeRO-2's flat gradients", flat});
    m.moments.push_back(moment("ZeRO-2's flat gradients made", later));
  }

  if ((split.dp > 1 || split.cp > 1) && split.zero <= 1)
    m.moments.push_back(moment("sum", {{"gradients", r.grads},
                                       {"their flat copy and the all-reduce's", 2 * r.grads},
                                       {"over Gloo, its float32 copy and the sum rounded back",
                                        widened ? (wire + 1) * r.grads : 0}}));
  else if (split.zero == 2)
    m.moments.push_back(moment("reduce-scatter", {{"gradient shards", r.grads},
                                                  {"flat gradients", flat},
                                                  {"the reduce-scatter's scratch", wire * flat},
                                                  {"over Gloo, the widened copy, the float32 shard and it rounded back",
                                                   widened ? wire * flat + (wire + 1) * r.grads : 0}}));
  else
    m.moments.push_back(moment("gradients", {{"gradients", r.grads}}));

  if (bf16_true)
    m.moments.push_back(moment("step", {{"gradients", r.grads}, {"the masters' float32 gradients", masters}}));
  return m;
}

}  // namespace mg::samples
