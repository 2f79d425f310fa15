// What the planner asks of a model: its bytes, activations, collectives and FLOPs under a
// split, as formulas. GPTArithmetic answers with gpt_formulas.h's (held exact by the
// benches); LlamaArithmetic (llama_formulas.h) with the Llama's.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <string>

#include <minigrad/models/gpt.h>
#include <minigrad/plan/devices.h>
#include <minigrad/plan/gpt_formulas.h>

namespace mg::plan {

// When a layer's flat gradient is alive against the backward's peak (flat_gradient_moment).
struct FlatGradientMoment {
  bool before_peak = false;  // made before the peak: alive at it
  // After the peak: what the peak holds that the moment it is made no longer holds. Before:
  // what the peak prices as 16-bit .grad that FSDP's hooks took into it and freed. Bytes.
  double released = 0;
};

class ModelArithmetic {
 public:
  virtual ~ModelArithmetic() = default;
  virtual std::string describe() const = 0;  // "124 M parameters (n_layer 12, ...)"
  virtual int64_t layers() const = 0;
  virtual int64_t hidden_size() const = 0;  // the residual stream's width: what a recomputed block keeps a token
  virtual int64_t max_positions() const = 0;
  // mg::Error naming the bad value when tp cannot split the model (heads, vocabulary).
  virtual void check_tp(int tp) const = 0;
  virtual double parameter_count() const = 0;
  // Training FLOPs a token for rows of T tokens: 6 a matmul parameter + attention's 12 L C T.
  virtual double flops_per_token(int64_t T) const = 0;
  virtual double stage_param_elements(int tp, int pp, int stage) const = 0;
  virtual double block_param_elements(int tp) const = 0;  // one layer's (an FSDP unit)
  virtual double stage_tensors(int pp, int stage) const = 0;
  // The stage's elements in 1-D parameters (biases, norm gains): nanoGPT's undecayed group,
  // which train_gpt's ZeRO-1/2 lays in flat buffers of its own (split_model.h).
  virtual double stage_vector_elements(int tp, int pp, int stage) const = 0;
  virtual double activation_peak_floats(const MeshShape& mesh, int stage, bool recompute) const = 0;
  // One block's saved activations for a micro-batch of the rank's tokens, in floats: what a
  // block that has gone back no longer holds (FSDP's moments over cp, trainer_moments).
  virtual double block_activation_floats(const MeshShape& mesh) const = 0;
  // The weight gradients activation_peak_floats's ring moment (cp) counts as made in the
  // backward before it (the Llama's: its last layer's MLP's, o_proj's, and the head's); under
  // FSDP each is in its unit's flat gradient instead. None for the GPT.
  virtual double ring_weight_gradient_floats(const MeshShape& /*mesh*/, int /*stage*/) const { return 0; }
  // Bytes an element: act_bytes a GEMM's output, grad_bytes a gradient, stream_bytes the
  // residual stream's (gpt_collective_bytes).
  virtual std::map<std::string, CollectiveBytes> collective_bytes(const MeshShape& mesh, int stage, double act_bytes,
                                                                  double grad_bytes, double stream_bytes) const = 0;
  // What `precision` holds at the backward's peak beyond activation_peak_floats at its
  // activations' bytes (2 a float in the 16-bit precisions; gpt_formulas.h's
  // PrecisionExtraBytes), over dp with ZeRO `zero` (0 to 3), tp, pp and cp, ± recompute:
  // zero in 32-true; std::nullopt where the model does not price it (the default in 16 bits).
  virtual std::optional<PrecisionExtraBytes> precision_extra_bytes(const MeshShape& mesh, int stage, int zero,
                                                                   bool recompute, Precision precision) const;
  // In a 16-bit compute without autocast (FSDP's MixedPrecisionPolicy: bf16-true's terms),
  // the last layer's flat gradient (FSDP's, float32) is made at the first post-accumulate
  // hook of its parameters; std::nullopt where the model does not price when (the default).
  virtual std::optional<FlatGradientMoment> flat_gradient_moment(const MeshShape& mesh) const;
  // One whole block's share of precision_extra_bytes's ring moment (cp, no recompute): what it
  // keeps in `precision` beyond block_activation_floats at 2 bytes a float, and so frees too
  // once it has gone back (FSDP's moments over cp). Zero in 32-true; std::nullopt where the
  // model does not price it (the default in 16 bits).
  virtual std::optional<PrecisionExtraBytes> ring_block_extra_bytes(const MeshShape& mesh, Precision precision) const;
  // The dp rank's real micro-batches and layers of a stage (parallel::even_balance).
  int64_t stage_blocks(int pp, int stage) const;
};

class GPTArithmetic final : public ModelArithmetic {
 public:
  explicit GPTArithmetic(models::GPTConfig config) : config_(config) {}
  const models::GPTConfig& config() const { return config_; }
  std::string describe() const override;
  int64_t layers() const override { return config_.n_layer; }
  int64_t hidden_size() const override { return config_.n_embd; }
  int64_t max_positions() const override { return config_.block_size; }
  void check_tp(int tp) const override;
  double parameter_count() const override;
  double flops_per_token(int64_t T) const override;
  double stage_param_elements(int tp, int pp, int stage) const override;
  double block_param_elements(int tp) const override;
  double stage_tensors(int pp, int stage) const override;
  double stage_vector_elements(int tp, int pp, int stage) const override;
  double activation_peak_floats(const MeshShape& mesh, int stage, bool recompute) const override;
  double block_activation_floats(const MeshShape& mesh) const override;
  std::map<std::string, CollectiveBytes> collective_bytes(const MeshShape& mesh, int stage, double act_bytes,
                                                          double grad_bytes, double stream_bytes) const override;
  // gpt_bf16_mixed_extra_bytes (bf16-mixed, 16-mixed) and gpt_bf16_true_extra_bytes.
  std::optional<PrecisionExtraBytes> precision_extra_bytes(const MeshShape& mesh, int stage, int zero, bool recompute,
                                                           Precision precision) const override;
  // After the peak on dp (gpt_zero2_released_bytes's c_fc moment); before it over tp (c_proj's
  // bias) and cp (ring attention).
  std::optional<FlatGradientMoment> flat_gradient_moment(const MeshShape& mesh) const override;
  // gpt_ring_block_extra_bytes.
  std::optional<PrecisionExtraBytes> ring_block_extra_bytes(const MeshShape& mesh, Precision precision) const override;

 private:
  models::GPTConfig config_;
};

}  // namespace mg::plan
