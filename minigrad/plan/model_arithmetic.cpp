// GPTArithmetic: the planner's questions answered by gpt_formulas.h.
#include <minigrad/plan/model_arithmetic.h>

#include <fmt/format.h>

#include <minigrad/core/error.h>
#include <minigrad/parallel/pipeline/balance.h>

namespace mg::plan {

int64_t ModelArithmetic::stage_blocks(int pp, int stage) const {
  MG_CHECK(pp >= 1 && pp <= layers(), "plan: pp {} must be in [1, layers {}]", pp, layers());
  MG_CHECK(stage >= 0 && stage < pp, "plan: stage {} outside [0, pp {})", stage, pp);
  return parallel::even_balance(layers(), pp)[static_cast<size_t>(stage)];
}

std::string GPTArithmetic::describe() const {
  return fmt::format("{:.0f} M parameters (n_layer {}, n_head {}, n_embd {}, vocab {}, block {})",
                     parameter_count() / 1e6, config_.n_layer, config_.n_head, config_.n_embd, config_.vocab_size,
                     config_.block_size);
}

void GPTArithmetic::check_tp(int tp) const {
  MG_CHECK(config_.n_head % tp == 0, "plan: tp {} does not divide n_head {}", tp, config_.n_head);
  MG_CHECK(config_.vocab_size % tp == 0, "plan: tp {} does not divide the vocabulary {}", tp, config_.vocab_size);
}

double GPTArithmetic::parameter_count() const {
  const double C = static_cast<double>(config_.n_embd);
  return static_cast<double>(config_.n_layer) * gpt_block_param_elements(C) +
         static_cast<double>(config_.vocab_size + config_.block_size) * C + 2 * C;
}

double GPTArithmetic::flops_per_token(int64_t T) const {
  const double C = static_cast<double>(config_.n_embd), L = static_cast<double>(config_.n_layer);
  const double matmul_params = L * 12 * C * C + static_cast<double>(config_.vocab_size) * C;
  return 6 * matmul_params + 12 * L * C * static_cast<double>(T);
}

double GPTArithmetic::stage_param_elements(int tp, int pp, int stage) const {
  return gpt_stage_param_elements(config_, tp, pp, stage);
}

double GPTArithmetic::block_param_elements(int tp) const {
  return gpt_block_param_elements(static_cast<double>(config_.n_embd), tp);
}

double GPTArithmetic::stage_tensors(int pp, int stage) const {
  // 12 a block (two LayerNorms' weight and bias, four Linears' weight and bias); wte and
  // wpe first; ln_f's two last, and the head's copy of wte when pp > 1.
  const bool first = stage == 0, last = stage == pp - 1;
  return 12.0 * static_cast<double>(stage_blocks(pp, stage)) + (first ? 2 : 0) + (last ? 2 + (pp > 1 ? 1 : 0) : 0);
}

double GPTArithmetic::stage_vector_elements(int tp, int pp, int stage) const {
  // A block's two LayerNorms (4C) and row biases (2C), replicated, and its column biases
  // (7C/tp: c_attn's 3C, c_fc's 4C); ln_f's 2C last.
  const double C = static_cast<double>(config_.n_embd);
  return static_cast<double>(stage_blocks(pp, stage)) * (6 * C + 7 * C / tp) + (stage == pp - 1 ? 2 * C : 0);
}

double GPTArithmetic::activation_peak_floats(const MeshShape& mesh, int stage, bool recompute) const {
  return gpt_activation_peak_floats(config_, mesh, stage, recompute);
}

double GPTArithmetic::block_activation_floats(const MeshShape& mesh) const {
  const double tokens = static_cast<double>(mesh.batch / mesh.dp) * static_cast<double>(mesh.T / mesh.cp);
  return gpt_block_activation_floats(static_cast<double>(config_.n_embd), static_cast<double>(config_.n_head), mesh.tp,
                                     mesh.sequence_parallel) *
         tokens / micro_batches_of(mesh);
}

std::map<std::string, CollectiveBytes> GPTArithmetic::collective_bytes(const MeshShape& mesh, int stage,
                                                                       double act_bytes, double grad_bytes,
                                                                       double stream_bytes) const {
  return gpt_collective_bytes(config_, mesh, stage, act_bytes, grad_bytes, stream_bytes);
}

std::optional<PrecisionExtraBytes> ModelArithmetic::precision_extra_bytes(const MeshShape& /*mesh*/, int /*stage*/,
                                                                          int /*zero*/, bool /*recompute*/,
                                                                          Precision precision) const {
  if (precision == Precision::True32) return PrecisionExtraBytes{};
  return std::nullopt;
}

std::optional<FlatGradientMoment> ModelArithmetic::flat_gradient_moment(const MeshShape& /*mesh*/) const {
  return std::nullopt;
}

// Read off train_gpt --zero 3 --fsdp-mp-policy's live blocks (docs/planning.md, "Planner
// against the trainer"). On dp the flat gradient is made at c_proj's weight's hook, after
// its GEMMs: the moment is c_fc's backward (gpt_zero2_released_bytes at 2 bytes). Under tp
// RowParallelLinear adds c_proj's bias after the sum (tensor_parallel/layers.cpp), so that
// bias's gradient comes first and its hook makes the flat gradient before c_proj's GEMMs;
// under cp ring attention's backward, the peak, comes after the MLP's: both hold it at the peak.
std::optional<FlatGradientMoment> GPTArithmetic::flat_gradient_moment(const MeshShape& mesh) const {
  if (mesh.pp > 1) return std::nullopt;
  if (mesh.cp > 1) {
    const ActivationMoments moments = gpt_activation_moments(config_, mesh, 0);
    if (moments.ring > 0 && moments.ring >= moments.backward) return FlatGradientMoment{true, 0};
    return std::nullopt;
  }
  if (mesh.tp > 1) return config_.bias ? std::optional<FlatGradientMoment>(FlatGradientMoment{true, 0}) : std::nullopt;
  return FlatGradientMoment{false, gpt_zero2_released_bytes(config_, mesh, 2, false)};
}

std::optional<PrecisionExtraBytes> ModelArithmetic::ring_block_extra_bytes(const MeshShape& /*mesh*/,
                                                                           Precision precision) const {
  if (precision == Precision::True32) return PrecisionExtraBytes{};
  return std::nullopt;
}

std::optional<PrecisionExtraBytes> GPTArithmetic::ring_block_extra_bytes(const MeshShape& mesh,
                                                                         Precision precision) const {
  if (precision == Precision::True32) return PrecisionExtraBytes{};
  return gpt_ring_block_extra_bytes(config_, mesh, precision != Precision::BF16True);
}

std::optional<PrecisionExtraBytes> GPTArithmetic::precision_extra_bytes(const MeshShape& mesh, int stage, int zero,
                                                                        bool recompute, Precision precision) const {
  switch (precision) {
    case Precision::True32: return PrecisionExtraBytes{};
    case Precision::BF16Mixed:
    case Precision::F16Mixed: return gpt_bf16_mixed_extra_bytes(config_, mesh, zero, stage, recompute);
    case Precision::BF16True: return gpt_bf16_true_extra_bytes(config_, mesh, zero, stage, recompute);
  }
  return std::nullopt;
}

}  // namespace mg::plan
