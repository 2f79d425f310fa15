// The Llama's arithmetic for the planner (models/llama.h, split as models/llama_plan.h
// splits it): HF's LlamaForCausalLM blocks -- RMSNorm, q/k/v/o without biases (k and v of
// num_key_value_heads), SwiGLU (gate, up, down), an untied lm_head. C = hidden_size,
// I = intermediate_size, a = heads, k = key-value heads, d = C / a, t = tp.
//
//   a layer's parameters   (2C² + 2 C k d + 3 C I)/t + 2C (the two RMSNorms, replicated)
//   the first stage        + embed_tokens V C/t;  the last: norm C + lm_head V C/t
//   FLOPs a token          6 (L (2C² + 2Ckd + 3CI) + V C) + 12 L C T
//   activations a token    4C + 2 (the RMSNorms' inputs, outputs and rstd) + 5C/t (q and
//                          k turned, v, repeated to a heads as attention keeps them: 3C/t;
//                          its output and the copy o_proj takes) + a/t (log-sum-exps) +
//                          4I/t (gate's and up's outputs, SiLU's, their product); the head
//                          2C + 1 + V/t and 2V/t more in backward. DERIVED from the ops'
//                          saved tensors, NOT measured by a bench (the GPT's are).
//   collectives            the GPT's, with k v hops of 2 b (T/cp) k d/t and no tied group
#pragma once

#include <minigrad/models/llama.h>
#include <minigrad/plan/model_arithmetic.h>

namespace mg::plan {

class LlamaArithmetic final : public ModelArithmetic {
 public:
  explicit LlamaArithmetic(models::LlamaConfig config);
  std::string describe() const override;
  int64_t layers() const override { return config_.num_hidden_layers; }
  int64_t hidden_size() const override { return config_.hidden_size; }
  int64_t max_positions() const override { return config_.max_position_embeddings; }
  void check_tp(int tp) const override;
  double parameter_count() const override;
  double flops_per_token(int64_t T) const override;
  double stage_param_elements(int tp, int pp, int stage) const override;
  double block_param_elements(int tp) const override;
  double stage_tensors(int pp, int stage) const override;
  double stage_vector_elements(int tp, int pp, int stage) const override;
  double activation_peak_floats(const MeshShape& mesh, int stage, bool recompute) const override;
  std::map<std::string, CollectiveBytes> collective_bytes(const MeshShape& mesh, int stage, double act_bytes,
                                                          double grad_bytes) const override;

 private:
  models::LlamaConfig config_;
  double C_, I_, V_, kd_;  // hidden, intermediate, vocabulary, k d (the k and v widths)
};

}  // namespace mg::plan
