// The GPT's arithmetic (gpt_formulas.h): each term's origin is in the header.
#include <minigrad/plan/gpt_formulas.h>

#include <algorithm>
#include <cmath>

#include <minigrad/core/error.h>
#include <minigrad/parallel/pipeline/balance.h>
#include <minigrad/parallel/pipeline/schedule.h>

namespace mg::plan {

double gpt_block_param_elements(double C, double t) { return 12 * C * C / t + 7 * C / t + 6 * C; }

int64_t gpt_stage_blocks(const models::GPTConfig& config, int pp, int stage) {
  MG_CHECK(pp >= 1 && pp <= config.n_layer, "gpt_stage_blocks: pp {} must be in [1, n_layer {}]", pp,
           config.n_layer);
  MG_CHECK(stage >= 0 && stage < pp, "gpt_stage_blocks: stage {} outside [0, pp {})", stage, pp);
  return parallel::even_balance(config.n_layer, pp)[static_cast<size_t>(stage)];
}

double gpt_stage_param_elements(const models::GPTConfig& config, int tp, int pp, int stage) {
  const double C = static_cast<double>(config.n_embd), V = static_cast<double>(config.vocab_size);
  const bool first = stage == 0, last = stage == pp - 1;
  return static_cast<double>(gpt_stage_blocks(config, pp, stage)) * gpt_block_param_elements(C, tp) +
         (first ? V * C / tp + static_cast<double>(config.block_size) * C : 0) +
         (last ? 2 * C + (pp > 1 ? V * C / tp : 0) : 0);
}

std::vector<int64_t> gpt_fsdp_unit_numels(const models::GPTConfig& config) {
  const int64_t C = config.n_embd;
  std::vector<int64_t> units{config.vocab_size * C + config.block_size * C + 2 * C};  // wte, wpe, ln_f
  units.insert(units.end(), static_cast<size_t>(config.n_layer), 12 * C * C + 13 * C);
  return units;
}

double gpt_block_activation_floats(double C, double a, double t, bool sp) {
  return (sp ? 2 * C / t + 2 * C + 4 / t : 4 * C + 4) + 13 * C / t + a / t;
}

double gpt_head_activation_floats(double C, double V, double t, bool sp) {
  return (sp ? 2 * C / t + C + 2 / t : 2 * C + 2) + V / t;
}

double gpt_kept_activation_bytes(const models::GPTConfig& config, int64_t rows, int64_t T, bool recompute) {
  const double C = static_cast<double>(config.n_embd), V = static_cast<double>(config.vocab_size);
  const double n = static_cast<double>(rows * T);
  const double f_block = gpt_block_activation_floats(C, static_cast<double>(config.n_head));
  return 4.0 * n * ((recompute ? C : f_block) * static_cast<double>(config.n_layer) + gpt_head_activation_floats(C, V)) +
         8.0 * static_cast<double>(T) + 4.0;
}

namespace {

void check_mesh(const models::GPTConfig& config, const MeshShape& m, int stage, const char* what) {
  MG_CHECK(m.dp >= 1 && m.tp >= 1 && m.pp >= 1 && m.cp >= 1, "{}: dp {} tp {} pp {} cp {} must be >= 1", what,
           m.dp, m.tp, m.pp, m.cp);
  MG_CHECK(stage >= 0 && stage < m.pp, "{}: stage {} outside [0, pp {})", what, stage, m.pp);
  MG_CHECK(m.batch % m.dp == 0, "{}: batch {} does not divide by dp {}", what, m.batch, m.dp);
  MG_CHECK(m.T % m.cp == 0, "{}: T {} does not divide by cp {}", what, m.T, m.cp);
  MG_CHECK(m.micro_batches >= 1, "{}: micro_batches {} must be >= 1", what, m.micro_batches);
  MG_CHECK(config.n_head % m.tp == 0, "{}: tp {} does not divide n_head {}", what, m.tp, config.n_head);
}

}  // namespace

double micro_batches_of(const MeshShape& m) {
  const int64_t rows = m.batch / m.dp;
  const int64_t per = (rows + m.micro_batches - 1) / m.micro_batches;
  return static_cast<double>((rows + per - 1) / per);
}

PipelinePeak pipeline_peak(const MeshShape& mesh, int stage) {
  const auto m = static_cast<int64_t>(micro_batches_of(mesh));
  const int v = mesh.model_chunks, p = mesh.pp;
  const auto schedule = v > 1 ? parallel::Schedule::Interleaved1F1B : parallel::Schedule::OneFOneB;
  int64_t alive = 0, most = -1, forwards_sent = 0, gradients_sent = 0;
  std::vector<bool> gone_back(static_cast<size_t>(v), false);
  PipelinePeak peak;
  for (const parallel::Action& a : parallel::rank_actions(schedule, stage, p, v, m)) {
    const int k = a.chunk * p + stage;  // the virtual stage
    if (a.pass == parallel::Pass::Forward) {
      ++alive;
      if (k != v * p - 1) ++forwards_sent;
      continue;
    }
    if (alive >= most) {
      most = alive;
      peak = {static_cast<double>(alive) / v, forwards_sent, gradients_sent, gone_back};
    }
    --alive;
    gone_back[static_cast<size_t>(a.chunk)] = true;
    if (k != 0) ++gradients_sent;
  }
  return peak;
}

HeldMessages held_messages(const PipelinePeak& peak, double handed, double mb_tokens) {
  return {static_cast<double>(peak.forwards_sent + peak.gradients_sent) * handed * mb_tokens,
          static_cast<double>(peak.forwards_sent) * 24, std::min(peak.in_flight, 2.0) * handed * mb_tokens};
}

AliveBlocks alive_blocks(int64_t stage_blocks, const MeshShape& mesh, int stage, bool recompute) {
  const double Ls = static_cast<double>(stage_blocks);
  const double in_flight = pipeline_peak(mesh, stage).in_flight;
  if (!recompute) return {Ls * in_flight, 0};
  if (mesh.pp == 1) return {1, Ls};  // checkpoint per block (models::GPT's recompute)
  // The pipeline checkpoints a stage's whole forward per micro-batch (Checkpoint::Always):
  // the others in flight keep the stage's input alone (the first stage's is token ids).
  return {Ls, stage == 0 ? 0 : in_flight - 1};
}

ActivationMoments gpt_activation_moments(const models::GPTConfig& config, const MeshShape& mesh, int stage,
                                         bool recompute) {
  check_mesh(config, mesh, stage, "gpt_activation_peak_floats");
  const double C = static_cast<double>(config.n_embd), V = static_cast<double>(config.vocab_size);
  const double t = mesh.tp, a = static_cast<double>(config.n_head), m = micro_batches_of(mesh);
  const bool sp = mesh.sequence_parallel, last = stage == mesh.pp - 1;
  const double Ls = static_cast<double>(gpt_stage_blocks(config, mesh.pp, stage));
  const double N = static_cast<double>(mesh.batch / mesh.dp) * static_cast<double>(mesh.T / mesh.cp);
  const double mb_tokens = N / m;
  const PipelinePeak peak = pipeline_peak(mesh, stage);
  const double in_flight = peak.in_flight;
  const double per_block = gpt_block_activation_floats(C, a, t, sp);
  const AliveBlocks alive = alive_blocks(gpt_stage_blocks(config, mesh.pp, stage), mesh, stage, recompute);
  double floats = (alive.kept_inputs * (sp ? C / t : C) + alive.whole * per_block) * mb_tokens;
  // What a pipeline stage holds beside the blocks' saved tensors at the peak (pipeline_peak:
  // under 1F1B the first backward after the last forward): its messages (held_messages).
  const double handed = sp ? C / t : C;
  const HeldMessages held = held_messages(peak, handed, mb_tokens);
  const double sent = held.sent + held.headers, received = held.received;
  if (stage == 0)  // wpe's int64 positions (T/cp of them, 2 floats' bytes each) per micro-batch in flight
    floats += in_flight * 2 * static_cast<double>(mesh.T / mesh.cp);
  // c_proj's backward, where a block's backward peaks: its input gradient (4C/t a token)
  // and its weight and bias gradients (4C²/t + C, made before they are added into .grad:
  // per micro-batch, not per token, so they weigh at small micro-batches and wide C).
  const double c_proj_backward = 4 * C / t * mb_tokens + 4 * C * C / t + C;
  if (last) {
    // Under 1F1B one micro-batch in flight (W = 1). Two moments: the loss's (ln_f's input
    // and output and the logits the loss keeps, with the loss's working set: the fused
    // cross-entropy's backward makes the logits' gradient, V a token; under tp,
    // vocab_parallel_cross_entropy's forward holds the shifted logits and their exp at
    // once, 2V/t), then, once the head's backward is over, the last block's c_proj backward
    // with the gradient flowing in from ln_f (C a token, C/t with SP). The peak is the
    // larger, beside each earlier micro-batch's loss (m floats, summed at the step's end).
    // Interleaved, the last rank's other chunks also hand on and wait for gradients.
    const double loss_working = (t > 1 ? 2 : 1) * V / t;
    const double head = mb_tokens * (gpt_head_activation_floats(C, V, t, sp) + loss_working);
    const double block = handed * mb_tokens + c_proj_backward;
    floats += sent + std::max(head, block) + m + (mesh.model_chunks > 1 ? received : 0);
  } else {
    floats += sent + received + c_proj_backward;
  }
  if (mesh.cp > 1 && !recompute) {
    // Ring attention's backward is a moment of its own, not a term on top of the head's
    // (whose backward is over by then): the first block to go back still holds what its
    // attention saved -- ln_1's input, output and statistics, q k v, the ring's output,
    // the log-sum-exp -- while the ring's working set is alive: dq, the dk dv accumulating
    // and the pair travelling, the k v pair arriving, each message's flat copy and one
    // block's three gradients (20C/t at its peak, read off the allocator's live blocks
    // on dp2 x cp2), beside 3C/t of gradients flowing into the block and, on the last
    // stage, the logits the loss keeps of one chunk (V/2t). The peak is the larger moment.
    const double attention_kept = (sp ? C / t + C + 2 / t : 2 * C + 2) + 4 * C / t + a / t;
    const double ring = (Ls * in_flight - 1) * per_block + attention_kept + 20 * C / t + 3 * C / t +
                        (last ? V / (2 * t) : 0);
    // Under pp the stage's messages are held at that moment too (sent, received ahead, and
    // stage 0's positions).
    const double messages = sent + (last ? 0 : received) + (stage == 0 ? in_flight * 2 * static_cast<double>(mesh.T / mesh.cp) : 0);
    return {floats, ring * mb_tokens + messages};
  }
  if (mesh.cp > 1) floats += N * 4 * C / t;  // recompute: k, v arriving and dk, dv travelling, on top
  return {floats, 0};
}

double gpt_activation_peak_floats(const models::GPTConfig& config, const MeshShape& mesh, int stage,
                                  bool recompute) {
  return gpt_activation_moments(config, mesh, stage, recompute).peak();
}

namespace {

void check_dp_only(const models::GPTConfig& config, const MeshShape& mesh, const char* what) {
  check_mesh(config, mesh, 0, what);
  MG_CHECK(mesh.tp == 1 && mesh.pp == 1 && mesh.cp == 1,
           "{}: priced on one device or over dp only, got tp {} pp {} cp {}", what, mesh.tp, mesh.pp, mesh.cp);
}

// The CPU 16-bit GEMM's float32 operands and result in c_proj's backward (row-parallel
// under tp: its input and weight are the rank's shard, the gradient flowing in is whole).
double gemm_float32_scratch(double C, double n, double t) { return 4 * (C * n + 4 * C * C / t + 4 * C * n / t); }

// Where the stage's activations peak: its blocks, the micro-batches alive then and their
// tokens (pipeline_peak; one micro-batch of every token without a pipeline).
struct StagePeak {
  double blocks, in_flight, mb_tokens, messages;  // messages: the floats handed on and sent back, held
};

StagePeak stage_peak(const models::GPTConfig& config, const MeshShape& mesh, int stage) {
  const PipelinePeak peak = pipeline_peak(mesh, stage);
  const double mb_tokens = static_cast<double>(mesh.batch / mesh.dp) * static_cast<double>(mesh.T / mesh.cp) / micro_batches_of(mesh);
  const double C = static_cast<double>(config.n_embd);
  const HeldMessages held = held_messages(peak, mesh.sequence_parallel ? C / mesh.tp : C, mb_tokens);
  const bool receives = stage != mesh.pp - 1 || mesh.model_chunks > 1;
  const double messages = held.sent + (receives && mesh.pp > 1 ? held.received : 0);
  return {static_cast<double>(gpt_stage_blocks(config, mesh.pp, stage)), peak.in_flight, mb_tokens, messages};
}

// At ring attention's backward (cp, when that moment is the stage's peak): the ring runs
// in float32 whatever the 16-bit dtype (ring_attention.cpp), so its saved q k v and output
// (4C/t a token a block) and its working set and the gradients flowing in (23C/t) hold 2
// bytes a float more; `whole` blocks keep everything, the one going back what its attention
// saved (ln_1's input and statistics, the log-sum-exp: `first_kept` bytes over 16 bits).
// `whole` is -1 where the ring is not the peak; `going_back` the ring's float32 terms of the
// block going back: its q k v and output, the working set and the gradients flowing in.
struct RingAt {
  double whole, going_back;
};

RingAt ring_at(const models::GPTConfig& config, const MeshShape& mesh, int stage, bool recompute) {
  const ActivationMoments moments = gpt_activation_moments(config, mesh, stage, recompute);
  if (moments.ring == 0 || moments.ring < moments.backward) return {-1, 0};
  const double C = static_cast<double>(config.n_embd), t = mesh.tp;
  const double whole = static_cast<double>(gpt_stage_blocks(config, mesh.pp, stage)) * pipeline_peak(mesh, stage).in_flight - 1;
  return {whole, 2 * (4 * C / t + 23 * C / t)};
}

}  // namespace

PrecisionExtraBytes gpt_ring_block_extra_bytes(const models::GPTConfig& config, const MeshShape& mesh, bool autocast) {
  const double C = static_cast<double>(config.n_embd), a = static_cast<double>(config.n_head);
  const double t = mesh.tp, sp = mesh.sequence_parallel ? t : 1;
  const double n = static_cast<double>(mesh.batch / mesh.dp) * static_cast<double>(mesh.T / mesh.cp) / micro_batches_of(mesh);
  PrecisionExtraBytes e;
  e.float32_saved = ((autocast ? (4 * C + 8) / sp : 8 / sp) + 2 * a / t) * n;
  e.weight_casts = autocast ? 2 * 12 * C * C / t : 0;
  e.backward = 2 * 4 * C / t * n;  // the ring's float32 q k v and output
  return e;
}

PrecisionExtraBytes gpt_bf16_mixed_extra_bytes(const models::GPTConfig& config, const MeshShape& mesh, int zero,
                                               int stage, bool recompute) {
  check_mesh(config, mesh, stage, "gpt_bf16_mixed_extra_bytes");
  const double C = static_cast<double>(config.n_embd), V = static_cast<double>(config.vocab_size);
  const double a = static_cast<double>(config.n_head);
  const double t = mesh.tp, sp = mesh.sequence_parallel ? t : 1;  // SP shards the LayerNorms' tokens
  const StagePeak at = stage_peak(config, mesh, stage);
  const bool head = stage == mesh.pp - 1;
  PrecisionExtraBytes e;
  e.messages = 2 * at.messages;  // the residual stream is float32: its messages too
  e.head_grad = (head ? 4 * V * C / t : 0) +
                (zero == 3 ? 4 * static_cast<double>(gpt_fsdp_unit_numels(config).front()) : 0);
  const RingAt ring = ring_at(config, mesh, stage, recompute);
  if (ring.whole >= 0) {  // its c_attn's cast alive in the block going back; the residual's gradient float32
    const PrecisionExtraBytes block = gpt_ring_block_extra_bytes(config, mesh, true);
    e.float32_saved = block.float32_saved * ring.whole + ((2 * C + 4) / sp + 2 * a / t) * at.mb_tokens;
    e.weight_casts = block.weight_casts * ring.whole + 2 * 3 * C * C / t;
    e.backward = block.backward * ring.whole + (ring.going_back + 2 * C / sp) * at.mb_tokens;
    return e;
  }
  // A kept input is the float32 residual stream: 2C bytes a token over 16 bits.
  const AliveBlocks alive = alive_blocks(gpt_stage_blocks(config, mesh.pp, stage), mesh, stage, recompute);
  e.float32_saved = (((4 * C + 8) / sp + 2 * a / t) * alive.whole + 2 * C / sp * alive.kept_inputs) * at.mb_tokens;
  // Each whole block saved its 16-bit weights; the pipeline runs its micro-batches without
  // the cast cache (each one's casts its own), the plain model's forward with it (once).
  e.weight_casts = 2 * 12 * C * C / t * (mesh.pp > 1 ? alive.whole : std::min(alive.whole, at.blocks));
  e.backward = (2 * C + 2 * C) / sp * at.mb_tokens + gemm_float32_scratch(C, at.mb_tokens, t);
  return e;
}

PrecisionExtraBytes gpt_bf16_true_extra_bytes(const models::GPTConfig& config, const MeshShape& mesh, int zero,
                                              int stage, bool recompute) {
  check_mesh(config, mesh, stage, "gpt_bf16_true_extra_bytes");
  const double C = static_cast<double>(config.n_embd), V = static_cast<double>(config.vocab_size);
  const double a = static_cast<double>(config.n_head);
  const double t = mesh.tp, sp = mesh.sequence_parallel ? t : 1;
  const StagePeak at = stage_peak(config, mesh, stage);
  const bool head = stage == mesh.pp - 1;
  PrecisionExtraBytes e;
  e.head_grad = (head ? 2 * V * C / t : 0) +
                (zero == 3 ? 2 * static_cast<double>(gpt_fsdp_unit_numels(config).front()) : 0);
  const RingAt ring = ring_at(config, mesh, stage, recompute);
  if (ring.whole >= 0) {
    const PrecisionExtraBytes block = gpt_ring_block_extra_bytes(config, mesh, false);
    e.float32_saved = block.float32_saved * ring.whole + (4 / sp + 2 * a / t) * at.mb_tokens;
    e.backward = block.backward * ring.whole + ring.going_back * at.mb_tokens;
    return e;
  }
  e.float32_saved = (8 / sp + 2 * a / t) * alive_blocks(gpt_stage_blocks(config, mesh.pp, stage), mesh, stage, recompute).whole * at.mb_tokens;
  e.backward = gemm_float32_scratch(C, at.mb_tokens, t);
  return e;
}

double gpt_zero2_released_bytes(const models::GPTConfig& config, const MeshShape& mesh, double act_bytes,
                                bool autocast) {
  check_dp_only(config, mesh, "gpt_zero2_released_bytes");
  MG_CHECK(act_bytes == 2 || act_bytes == 4, "gpt_zero2_released_bytes: act_bytes {} must be 2 or 4", act_bytes);
  const double C = static_cast<double>(config.n_embd), Ab = act_bytes;
  const double n = static_cast<double>(mesh.batch / mesh.dp) * static_cast<double>(mesh.T);
  const double casts = autocast ? 2 * 4 * C * C + 2 * C * n : 0;  // c_proj's weight cast, ln_f's gradient's
  const double scratch = Ab == 2 ? 4 * (C * n + 4 * C * C + 4 * C * n) : 0;
  const double gelu_backward = Ab * (4 * C * C + C) + scratch + casts;
  const double c_fc_backward = Ab * (12 * C * n - 5 * C * n) + Ab * ((4 * C * C + C) - (4 * C * C + 4 * C)) + casts;
  return std::min(gelu_backward, c_fc_backward);
}

double gpt_ring_weight_grad_elements(const models::GPTConfig& config, const MeshShape& mesh, int stage) {
  check_mesh(config, mesh, stage, "gpt_ring_weight_grad_elements");
  if (mesh.cp == 1) return 0;
  const PipelinePeak peak = pipeline_peak(mesh, stage);
  if (std::any_of(peak.gone_back.begin(), peak.gone_back.end(), [](bool b) { return b; })) return 0;
  const double C = static_cast<double>(config.n_embd), V = static_cast<double>(config.vocab_size), t = mesh.tp;
  return 9 * C * C / t + 4 * C / t + 4 * C + (stage == mesh.pp - 1 ? V * C / t + 2 * C : 0);
}

double gpt_gradient_sum_peak_bytes(const models::GPTConfig& config, const MeshShape& mesh, int stage,
                                   double grad_bytes) {
  check_mesh(config, mesh, stage, "gpt_gradient_sum_peak_bytes");
  if (mesh.dp == 1 && mesh.cp == 1) return 0;
  return 2 * grad_bytes * gpt_stage_param_elements(config, mesh.tp, mesh.pp, stage) + 4;
}

std::map<std::string, CollectiveBytes> gpt_collective_bytes(const models::GPTConfig& config, const MeshShape& mesh,
                                                            int stage, double act_bytes, double grad_bytes,
                                                            double stream_bytes) {
  check_mesh(config, mesh, stage, "gpt_collective_bytes");
  const int tp = mesh.tp, cp = mesh.cp, pp = mesh.pp;
  const bool sp = mesh.sequence_parallel;
  const double S = act_bytes, G = grad_bytes, R = stream_bytes > 0 ? stream_bytes : act_bytes;
  const double C = static_cast<double>(config.n_embd), V = static_cast<double>(config.vocab_size);
  const bool first = stage == 0, last = stage == pp - 1;
  const double Ls = static_cast<double>(gpt_stage_blocks(config, pp, stage));
  const double stage_params = gpt_stage_param_elements(config, tp, pp, stage);
  const double b = static_cast<double>(mesh.batch / mesh.dp), Tl = static_cast<double>(mesh.T / cp);
  const double N = b * Tl;  // this rank's tokens per step
  // The tp group's sums (gathers and scatters with SP) a token: the two row layers' outputs in
  // forward and their gradients' in backward (a GEMM's: S), the stream's in the other
  // direction (the column layers' inputs, LayerNorms' outputs, and the embedding's and the
  // head's: R).
  const double NC = N * C * (2 * Ls * S + (2 * Ls + first + last) * R);
  const double m = micro_batches_of(mesh);
  std::map<std::string, CollectiveBytes> f;
  if (tp > 1) {
    CollectiveBytes& c = f["tp"];
    if (!sp) {
      c.all_reduce = NC + (last ? 2 * N * R : 0);
    } else {
      c.all_gather = NC / tp + (last ? N * R : 0);
      c.reduce_scatter = NC;
      const double replicated = Ls * 6 * C + (first ? static_cast<double>(config.block_size) * C : 0) +
                                (last ? 2 * C : 0);
      c.all_reduce = (last ? 2 * N * R : 0) + replicated * G;
    }
  }
  // The loss's row maxima (vocab_parallel_cross_entropy), and above its two sums a token, in
  // the logits' dtype, the stream's: float32 under autocast (its cross-entropy runs in
  // float32), bfloat16 in bf16-true. None on a tp group of one.
  if (!sp && tp > 1) f["tp"].all_gather = last ? N * R : 0;
  if (cp > 1) {
    CollectiveBytes& c = f["cp"];
    const double hop = 2 * b * Tl * C * 4 / tp;  // k and v of this rank's heads, float32
    c.send = c.recv = Ls * (3 * cp - 2) * hop;
    // + each micro-batch's loss (the last stage: summed over cp), in the logits' dtype.
    c.all_reduce = stage_params * G + (last ? m * R : 0);
  }
  // + the step's loss: train_gpt's in float32; the pipeline's summed by MeshPipeline in the
  // logits' dtype.
  if (mesh.dp > 1) f["dp"].all_reduce = stage_params * G + (pp > 1 ? R : 4);
  if (pp > 1) {
    // Forward: each micro-batch's activation behind a header of 12 int64 (pipeline_stage.cpp:
    // 4 + 8 dimensions); backward: its gradient alone.
    const double act = N * C * R / (sp ? tp : 1), header = m * 12 * 8;  // the residual stream
    // Each of the rank's v chunks (1 under 1F1B) hands on but the last rank's last, and
    // sends back but the first rank's first (interleaved: v pp - 1 chunk boundaries a way).
    const double v = mesh.model_chunks, forwards = v - (last ? 1 : 0), backs = v - (first ? 1 : 0);
    f["pp"].send = forwards * (act + header) + backs * act;
    f["pp"].recv = backs * (act + header) + forwards * act;
    // The loss from the last stage, behind its dtype (one int64: loss_on_every_rank), in the
    // logits' dtype.
    f["pp"].broadcast = 8 + R;
    f["emb"].all_reduce = V * C / tp * G;
  }
  return f;
}

double shard_elements(const std::vector<int64_t>& group_numels, int ranks) {
  double shards = 0;
  for (const int64_t g : group_numels) shards += std::ceil(static_cast<double>(g) / ranks);
  return shards;
}

ShardedState zero_state_bytes(int stage, double psi, double tensors, const std::vector<int64_t>& group_numels,
                              int ranks) {
  MG_CHECK(stage >= 0 && stage <= 3, "zero_state_bytes: stage {} must be 0, 1, 2 or 3", stage);
  MG_CHECK(ranks >= 1, "zero_state_bytes: ranks {} must be >= 1", ranks);
  MG_CHECK(stage == 0 || !group_numels.empty(), "zero_state_bytes: ZeRO-{} needs its flat groups", stage);
  const double N = ranks;
  const double shards = shard_elements(group_numels, ranks);
  const double groups = static_cast<double>(group_numels.size());
  ShardedState s;
  if (stage <= 1) s.buffers = 4.0 * psi;  // DDP's buckets: every gradient once
  s.params = 4.0 * (stage == 0 ? psi : stage == 3 ? shards : shards * N);
  s.grads = 4.0 * (stage <= 1 ? psi : shards);
  s.optimizer = stage == 0 ? 8.0 * psi + 8.0 * tensors : 8.0 * shards + 8.0 * groups;
  return s;
}

}  // namespace mg::plan
