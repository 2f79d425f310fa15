// What the planner asks of a model: its bytes, activations, collectives and FLOPs under a
// split, as formulas. GPTArithmetic answers with gpt_formulas.h's (held exact by the
// benches); LlamaArithmetic (llama_formulas.h) with the Llama's.
#pragma once

#include <cstdint>
#include <map>
#include <string>

#include <minigrad/models/gpt.h>
#include <minigrad/plan/gpt_formulas.h>

namespace mg::plan {

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
  // Bytes an element: act_bytes a GEMM's output, grad_bytes a gradient, stream_bytes the
  // residual stream's (gpt_collective_bytes).
  virtual std::map<std::string, CollectiveBytes> collective_bytes(const MeshShape& mesh, int stage, double act_bytes,
                                                                  double grad_bytes, double stream_bytes) const = 0;
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
  std::map<std::string, CollectiveBytes> collective_bytes(const MeshShape& mesh, int stage, double act_bytes,
                                                          double grad_bytes, double stream_bytes) const override;

 private:
  models::GPTConfig config_;
};

}  // namespace mg::plan
