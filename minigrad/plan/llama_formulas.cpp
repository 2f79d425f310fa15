// LlamaArithmetic (llama_formulas.h): each term's origin is in the header.
#include <minigrad/plan/llama_formulas.h>

#include <algorithm>

#include <fmt/format.h>

#include <minigrad/core/error.h>

namespace mg::plan {

LlamaArithmetic::LlamaArithmetic(models::LlamaConfig config) : config_(config) {
  config_.validate();
  C_ = static_cast<double>(config_.hidden_size);
  I_ = static_cast<double>(config_.intermediate_size);
  V_ = static_cast<double>(config_.vocab_size);
  kd_ = static_cast<double>(config_.num_key_value_heads * config_.head_dim());
}

std::string LlamaArithmetic::describe() const {
  return fmt::format("{:.0f} M parameters (layers {}, heads {}, kv heads {}, hidden {}, intermediate {}, vocab {})",
                     parameter_count() / 1e6, config_.num_hidden_layers, config_.num_attention_heads,
                     config_.num_key_value_heads, config_.hidden_size, config_.intermediate_size, config_.vocab_size);
}

void LlamaArithmetic::check_tp(int tp) const {
  MG_CHECK(config_.num_key_value_heads % tp == 0, "plan: tp {} does not divide num_key_value_heads {}", tp,
           config_.num_key_value_heads);
  MG_CHECK(config_.num_attention_heads % tp == 0, "plan: tp {} does not divide num_attention_heads {}", tp,
           config_.num_attention_heads);
  MG_CHECK(config_.vocab_size % tp == 0, "plan: tp {} does not divide the vocabulary {}", tp, config_.vocab_size);
}

double LlamaArithmetic::block_param_elements(int tp) const {
  return (2 * C_ * C_ + 2 * C_ * kd_ + 3 * C_ * I_) / tp + 2 * C_;
}

double LlamaArithmetic::parameter_count() const {
  return static_cast<double>(config_.num_hidden_layers) * block_param_elements(1) + 2 * V_ * C_ + C_;
}

double LlamaArithmetic::flops_per_token(int64_t T) const {
  const double L = static_cast<double>(config_.num_hidden_layers);
  return 6 * (L * (block_param_elements(1) - 2 * C_) + V_ * C_) + 12 * L * C_ * static_cast<double>(T);
}

double LlamaArithmetic::stage_param_elements(int tp, int pp, int stage) const {
  const bool first = stage == 0, last = stage == pp - 1;
  return static_cast<double>(stage_blocks(pp, stage)) * block_param_elements(tp) + (first ? V_ * C_ / tp : 0) +
         (last ? C_ + V_ * C_ / tp : 0);
}

double LlamaArithmetic::stage_tensors(int pp, int stage) const {
  // 9 a layer (q k v o gate up down, two RMSNorms); embed_tokens first; norm, lm_head last.
  return 9.0 * static_cast<double>(stage_blocks(pp, stage)) + (stage == 0 ? 1 : 0) + (stage == pp - 1 ? 2 : 0);
}

double LlamaArithmetic::stage_vector_elements(int /*tp*/, int pp, int stage) const {
  // Two RMSNorm weights a layer, replicated (no biases); the final norm's last.
  return 2 * C_ * static_cast<double>(stage_blocks(pp, stage)) + (stage == pp - 1 ? C_ : 0);
}

double LlamaArithmetic::layer_floats(double t, bool sp) const {
  // The RMSNorms' inputs, outputs and rstd (with SP the inputs and rstd sharded, and each
  // column layer -- q, k, v, gate, up -- all-gathers the norm's output for itself and keeps
  // its own whole copy: 5C), q and k turned, k and v repeated to a heads, attention's output
  // and o_proj's contiguous copy (5C/t), the log-sum-exps (a/t), gate's, SiLU's and up's
  // outputs and their product (4I/t).
  const double a = static_cast<double>(config_.num_attention_heads);
  return (sp ? 2 * C_ / t + 5 * C_ + 2 / t : 4 * C_ + 2) + 5 * C_ / t + a / t + 4 * I_ / t;
}

double LlamaArithmetic::activation_peak_floats(const MeshShape& mesh, int stage, bool recompute) const {
  return activation_moments(mesh, stage, recompute).peak();
}

double LlamaArithmetic::attention_backward_weight_grads(double t) const {
  return 3 * C_ * I_ / t + C_ * C_ / t + C_;  // gate, up, down; o_proj; post_attention_layernorm
}

double LlamaArithmetic::ring_weight_gradient_floats(const MeshShape& mesh, int stage) const {
  if (mesh.cp == 1) return 0;
  const PipelinePeak peak = pipeline_peak(mesh, stage);
  // Held as .grad only in the stage's first backward (activation_moments' `made`).
  if (std::any_of(peak.gone_back.begin(), peak.gone_back.end(), [](bool b) { return b; })) return 0;
  const double t = mesh.tp;
  return attention_backward_weight_grads(t) + (stage == mesh.pp - 1 ? V_ * C_ / t + C_ : 0);
}

double LlamaArithmetic::block_activation_floats(const MeshShape& mesh) const {
  const double Tl = static_cast<double>(mesh.T / mesh.cp);
  const double mb = static_cast<double>(mesh.batch / mesh.dp) * Tl / micro_batches_of(mesh);
  // and RoPE's cos and sin tables, saved once a layer's forward ([T/cp, d/2] each)
  return layer_floats(mesh.tp, mesh.sequence_parallel) * mb + Tl * static_cast<double>(config_.head_dim());
}

ActivationMoments LlamaArithmetic::activation_moments(const MeshShape& mesh, int stage, bool recompute) const {
  check_tp(mesh.tp);
  const double t = mesh.tp, d = static_cast<double>(config_.head_dim());
  const double m = micro_batches_of(mesh);
  const bool sp = mesh.sequence_parallel, last = stage == mesh.pp - 1;
  const double Ls = static_cast<double>(stage_blocks(mesh.pp, stage));
  const double Tl = static_cast<double>(mesh.T / mesh.cp);
  const double N = static_cast<double>(mesh.batch / mesh.dp) * Tl;
  const double mb = N / m;
  const PipelinePeak peak = pipeline_peak(mesh, stage);
  const double in_flight = peak.in_flight;
  const double layer = layer_floats(t, sp);
  // And once a layer's forward, not a token: RoPE's cos and sin tables it saves ([T/cp, d/2] each).
  const double rope = Tl * d;
  // The layers alive whole and the kept inputs of the recomputed ones (alive_blocks: per
  // layer on one stage, the stage's micro-batch whole under --pp); the later moments of a
  // recomputed backward (the first layer going back, the pipeline's last backward) are
  // trainer_moments'.
  const AliveBlocks alive = alive_blocks(stage_blocks(mesh.pp, stage), mesh, stage, recompute);
  double floats = (alive.kept_inputs * (sp ? C_ / t : C_) + alive.whole * layer) * mb + alive.whole * rope;
  const double saved = floats;
  // A pipeline stage's messages, as the GPT's (held_messages).
  const double handed = sp ? C_ / t : C_;
  const HeldMessages held = held_messages(peak, handed, mb);
  const double sent = held.sent + held.headers, received = held.received;
  // The weight gradients made so far in the backward: in the step's first backward of the
  // stage each becomes .grad (AccumulateGrad keeps the buffer) and is held from then on;
  // in a later one (the pipeline's, once a backward has gone before: trainer_moments
  // counts .grad then) each is added into .grad in place and freed.
  const bool first_backward = std::none_of(peak.gone_back.begin(), peak.gone_back.end(), [](bool b) { return b; });
  const double made = first_backward ? 1 : 0;
  // The last layer's MLP backward, where a layer's backward peaks: in SwiGLU's product's
  // backward down_proj's input gradient and the two it makes (gate's and up's, 3I/t a token)
  // are alive while the product (I/t) is gone, and down_proj's weight gradient (C I/t).
  const double mlp_backward = 2 * I_ / t * mb + made * C_ * I_ / t;
  if (last) {
    // Two moments, the larger the peak: the loss's (the norm's input, output and rstd, the
    // logits the loss keeps and its working set: the fused cross-entropy's gradient, V a
    // token; under tp the vocab-parallel loss's shifted logits and their exp, 2V/t), and
    // the last layer's MLP backward with the gradient from the norm (C a token, C/t with
    // SP) and the head's weight gradients made (lm_head's V C/t, the norm's C). Beside them
    // each earlier micro-batch's loss (m floats).
    const double loss_working = (t > 1 ? 2 : 1) * V_ / t;
    const double head = mb * ((sp ? C_ / t + C_ + 1 / t : 2 * C_ + 1) + V_ / t + loss_working);
    const double block = handed * mb + mlp_backward + made * (V_ * C_ / t + C_);
    floats += sent + std::max(head, block) + m + (mesh.model_chunks > 1 ? received : 0);
  } else {
    floats += sent + received + mlp_backward;
  }
  if (sp)  // a moment of its own: the last layer's down_proj reduce-scattering in forward (its
            // partial sum, the T-first copy, Gloo's slices: 3C a token; the rank's sum, C/t)
    floats = std::max(floats, saved + sent + mb * (3 * C_ + C_ / t));
  if (mesh.cp > 1 && !recompute) {
    // Ring attention's backward is a moment of its own, as the GPT's
    // (gpt_activation_peak_floats): one layer fewer in full, the first layer going back
    // holding what its attention saved (input_layernorm's input, output and rstd -- with SP
    // q's, k's and v's own gathered copies --, q, k and v repeated to the a heads, the ring's
    // output, the log-sum-exps) with the ring's working set and the gradients flowing in,
    // 23C/t as the GPT's (the same ring_attention, k and v at the a heads' width); the
    // weight gradients made: that layer's MLP's, o_proj's and its second norm's (3CI/t +
    // C²/t + C) and, on the last stage, the head's.
    const double a = static_cast<double>(config_.num_attention_heads);
    const double attention_kept = (sp ? C_ / t + 3 * C_ + 1 / t : 2 * C_ + 1) + 4 * C_ / t + a / t;
    const double ring = (Ls * in_flight - 1) * layer + attention_kept + 23 * C_ / t;
    const double gradients = ring_weight_gradient_floats(mesh, stage);
    const double messages = sent + (last ? m : received);
    return {floats, ring * mb + Ls * in_flight * rope + gradients + messages};
  }
  if (mesh.cp > 1)  // recompute: k, v arriving and dk, dv travelling (the a heads' width), on top
    floats += N * 4 * C_ / t;
  return {floats, 0};
}

std::map<std::string, CollectiveBytes> LlamaArithmetic::collective_bytes(const MeshShape& mesh, int stage,
                                                                         double act_bytes, double grad_bytes,
                                                                         double stream_bytes) const {
  check_tp(mesh.tp);
  const int tp = mesh.tp, cp = mesh.cp, pp = mesh.pp;
  const bool sp = mesh.sequence_parallel, first = stage == 0, last = stage == pp - 1;
  const double S = act_bytes, G = grad_bytes, R = stream_bytes > 0 ? stream_bytes : act_bytes;
  const double Ls = static_cast<double>(stage_blocks(pp, stage));
  const double P = stage_param_elements(tp, pp, stage);
  const double b = static_cast<double>(mesh.batch / mesh.dp), Tl = static_cast<double>(mesh.T / cp);
  const double N = b * Tl, m = micro_batches_of(mesh);
  std::map<std::string, CollectiveBytes> f;
  if (tp > 1) {
    CollectiveBytes& c = f["tp"];
    // Each column layer (q, k, v, gate, up) takes the stream on its own: in backward each
    // sums its input's gradient (with SP, each all-gathers its input in forward and
    // reduce-scatters that gradient), beside o_proj's and down_proj's sums in forward: 7
    // a layer where the GPT's fused c_attn makes 4.
    // The row layers' (o_proj, down_proj) outputs and their gradients are a GEMM's (S); the
    // column layers' inputs, the RMSNorms' outputs, the embedding's and the head's the
    // stream's (R).
    const double NC = N * C_ * (2 * Ls * S + (5 * Ls + first + last) * R);
    // The loss's row maxima and two sums a token (vocab_parallel_cross_entropy) are in the
    // logits' dtype, the stream's (float32 under autocast, bfloat16 in bf16-true).
    if (!sp) {
      c.all_reduce = NC + (last ? 2 * N * R : 0);
      c.all_gather = last ? N * R : 0;
    } else {
      c.all_gather = NC / tp + (last ? N * R : 0);
      c.reduce_scatter = NC;
      c.all_reduce = (last ? 2 * N * R : 0) + (Ls * 2 * C_ + (last ? C_ : 0)) * G;  // the RMSNorms' weights
    }
  }
  if (cp > 1) {
    CollectiveBytes& c = f["cp"];
    // k and v travel repeated to the a heads (ring attention takes them after repeat_kv).
    c.send = c.recv = Ls * (3 * cp - 2) * 2 * b * Tl * C_ * 4 / tp;  // float32 (ring_attention.cpp)
    c.all_reduce = P * G + (last ? m * R : 0);
  }
  if (mesh.dp > 1) f["dp"].all_reduce = P * G + (pp > 1 ? R : 4);  // the loss: as the GPT's
  if (pp > 1) {
    const double act = N * C_ * R / (sp ? tp : 1), header = m * 12 * 8;  // the residual stream
    // Each of the rank's v chunks (1 under 1F1B) hands on but the last rank's last, and
    // sends back but the first rank's first (interleaved: v pp - 1 chunk boundaries a way).
    const double v = mesh.model_chunks, forwards = v - (last ? 1 : 0), backs = v - (first ? 1 : 0);
    f["pp"].send = forwards * (act + header) + backs * act;
    f["pp"].recv = backs * (act + header) + forwards * act;
    f["pp"].broadcast = 8 + R;
  }
  return f;
}

// Read off train_gpt --model llama --dp 2 --zero 3 --fsdp-mp-policy's live blocks. The flat
// gradient is made at down_proj's weight's hook (no biases), after its GEMMs, the 16-bit
// peak; the moment it is alive is the last layer's gate's and up's backward, at a weight
// gradient's GEMM: gone are down_proj's input (the product), the product's saved SiLU and
// up outputs and SiLU's saved gate output (4 I/t a token), made are up's and gate's output
// gradients (2 I/t) and that layer's input gradient (C, a partial sum under tp); its weight
// gradient and GEMM working set are down_proj's size again. At 2 bytes: 4 I n/t - 2 C n.
// Under cp ring attention's backward, the peak, comes after the MLP's and o_proj's: the flat
// gradient is alive at it, and the weight gradients made, which activation_peak_floats
// prices as 16-bit .grad there (3CI/t + C^2/t + C), are in it, freed at their hooks.
std::optional<FlatGradientMoment> LlamaArithmetic::flat_gradient_moment(const MeshShape& mesh) const {
  check_tp(mesh.tp);
  if (mesh.pp > 1) return std::nullopt;
  const double t = mesh.tp;
  const ActivationMoments moments = activation_moments(mesh, 0, false);
  if (mesh.cp > 1) {
    if (moments.ring > 0 && moments.ring >= moments.backward)
      return FlatGradientMoment{true, 2 * attention_backward_weight_grads(t)};
    return std::nullopt;
  }
  const double n = static_cast<double>(mesh.batch / mesh.dp) * static_cast<double>(mesh.T);
  return FlatGradientMoment{false, 4 * I_ * n / t - 2 * C_ * n};
}

std::optional<PrecisionExtraBytes> LlamaArithmetic::ring_block_extra_bytes(const MeshShape& mesh,
                                                                           Precision precision) const {
  if (precision == Precision::True32) return PrecisionExtraBytes{};
  const bool autocast = precision != Precision::BF16True;
  const double t = mesh.tp, sp = mesh.sequence_parallel ? t : 1;
  const double a = static_cast<double>(config_.num_attention_heads);
  const double n = static_cast<double>(mesh.batch / mesh.dp) * static_cast<double>(mesh.T / mesh.cp) / micro_batches_of(mesh);
  PrecisionExtraBytes e;
  // The whole layers' float32 saved tensors (precision_extra_bytes's below), the ring's float32
  // q, k, v and output (2 bytes a float more, 4C/t a token) and under autocast the weights' casts.
  e.float32_saved = ((autocast ? 4 * C_ / sp + (mesh.sequence_parallel ? 0 : 6 * C_) : 0) + 4 / sp + 2 * a / t) * n;
  e.backward = 2 * 4 * C_ / t * n;
  e.weight_casts = autocast ? 2 * (block_param_elements(mesh.tp) - 2 * C_) : 0;
  return e;
}

std::optional<PrecisionExtraBytes> LlamaArithmetic::precision_extra_bytes(const MeshShape& mesh, int stage, int zero,
                                                                          bool recompute, Precision precision) const {
  check_tp(mesh.tp);
  if (precision == Precision::True32) return PrecisionExtraBytes{};
  const bool autocast = precision != Precision::BF16True;
  const double t = mesh.tp, sp = mesh.sequence_parallel ? t : 1;  // SP shards the RMSNorms' tokens
  const double a = static_cast<double>(config_.num_attention_heads);
  const bool last = stage == mesh.pp - 1;
  const PipelinePeak peak = pipeline_peak(mesh, stage);
  const double n = static_cast<double>(mesh.batch / mesh.dp) * static_cast<double>(mesh.T / mesh.cp) / micro_batches_of(mesh);
  const double blocks = static_cast<double>(stage_blocks(mesh.pp, stage));
  const AliveBlocks alive = alive_blocks(stage_blocks(mesh.pp, stage), mesh, stage, recompute);
  const bool first_backward = std::none_of(peak.gone_back.begin(), peak.gone_back.end(), [](bool b) { return b; });
  PrecisionExtraBytes e;
  // The pipeline's messages: the float32 residual stream under autocast (2 bytes a float
  // over activation_peak_floats's), what it holds sent and posted at the peak.
  if (autocast && mesh.pp > 1) {
    const HeldMessages held = held_messages(peak, C_ / sp, n);
    const bool receives = !last || mesh.model_chunks > 1;
    e.messages = 2 * (held.sent + (receives ? held.received : 0));
  }
  // The head's weight gradients made in the step's first backward (lm_head's V C/t, the
  // norm's C): float32 .grad under autocast (2 bytes a float over activation_peak_floats's);
  // bfloat16 in bf16-true, as priced.
  e.head_grad = autocast && last && first_backward ? 2 * (V_ * C_ / t + C_) : 0;
  const double kd = kd_;
  const ActivationMoments moments = activation_moments(mesh, stage, recompute);
  if (moments.ring > 0 && moments.ring >= moments.backward) {
    // Ring attention's backward is the peak (cp): the ring runs in float32 whatever the
    // 16-bit dtype (ring_attention.cpp, as the GPT's), so its saved q, k and v (repeated to
    // the a heads) and output, 4C/t a token a layer, and its working set with the gradients
    // flowing in, 23C/t, hold 2 bytes a float more. The whole layers save as below; the
    // layer going back what its attention saved: input_layernorm's float32 rstd (2/sp) and
    // the log-sum-exps (2a/t), under autocast also the norm's float32 input (2C/sp) and, in
    // place of its output, q's, k's and v's own casts (3 x 2C - 2C; with SP priced already),
    // the float32 gradient flowing into the residual stream (2C/sp), q's, k's and v's weight
    // casts (2 (C^2 + 2Ckd)/t) and the weight gradients made so far as float32 .grad (the
    // layer's MLP's, o_proj's and post_attention_layernorm's: 2 (3CI/t + C^2/t + C) bytes).
    const double whole = blocks * peak.in_flight - 1;
    const PrecisionExtraBytes layer = *ring_block_extra_bytes(mesh, precision);
    const double going_back = (autocast ? 2 * C_ / sp + (mesh.sequence_parallel ? 0 : 4 * C_) : 0) + 2 / sp + 2 * a / t;
    e.float32_saved = layer.float32_saved * whole + going_back * n;
    e.backward = layer.backward * whole + 2 * (4 * C_ / t + 23 * C_ / t) * n;
    if (autocast) {
      e.weight_casts = layer.weight_casts * whole + 2 * (C_ * C_ + 2 * C_ * kd) / t;
      e.backward += 2 * C_ / sp * n + (first_backward ? 2 * attention_backward_weight_grads(t) : 0);
    }
    return e;
  }
  // Saved in float32 where activation_peak_floats prices 2 bytes, a token a whole layer: the
  // two RMSNorms' rstd (rms_norm keeps it in float32 whatever x's dtype: 2 x 2 bytes) and
  // attention's log-sum-exps (2a/t); under autocast also the RMSNorms' inputs, the float32
  // residual stream (2 x 2C), and in place of the norms' two outputs (float32, freed once
  // cast) each column layer's own 16-bit cast of its input, q k v of input_layernorm's,
  // gate and up of post_attention_layernorm's: 5 x 2C - 2 x 2C (with SP already five
  // gathered copies in activation_peak_floats: none). A kept input (recompute) is the
  // float32 residual stream too: 2C/sp.
  const double saved = (autocast ? 4 * C_ / sp + (mesh.sequence_parallel ? 0 : 6 * C_) : 0) + 4 / sp + 2 * a / t;
  e.float32_saved = (saved * alive.whole + (autocast ? 2 * C_ / sp * alive.kept_inputs : 0)) * n;
  // Under autocast each whole layer saved its weights' 16-bit casts (q o k v gate up down:
  // 2 (2C^2 + 2Ckd + 3CI)/t bytes); the pipeline runs its micro-batches without the cast
  // cache (each one's casts its own), the plain model's forward with it (once).
  if (autocast)
    e.weight_casts = 2 * (block_param_elements(mesh.tp) - 2 * C_) * (mesh.pp > 1 ? alive.whole : std::min(alive.whole, blocks));
  // The peak moves from SwiGLU's product's backward to down_proj's backward GEMMs, which on
  // the CPU compute in float32: their float32 operands and result (the gradient flowing in
  // C n, the weight's shard C I/t, the input gradient's I n/t) while the product's backward's
  // second I/t a token is not made yet (2 I n/t fewer); under autocast the gradient flowing
  // in is float32 (+2C n/sp) and down_proj casts it to 16 bits (+2C n/sp).
  e.backward = 4 * (C_ * n + C_ * I_ / t + I_ * n / t) - 2 * I_ * n / t + (autocast ? 4 * C_ / sp * n : 0);
  (void)zero;
  return e;
}

}  // namespace mg::plan
