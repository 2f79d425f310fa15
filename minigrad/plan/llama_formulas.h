// The Llama's arithmetic for the planner (models/llama.h, split as models/llama_plan.h
// splits it): HF's LlamaForCausalLM blocks -- RMSNorm, q/k/v/o without biases (k and v of
// num_key_value_heads), SwiGLU (gate, up, down), an untied lm_head. C = hidden_size,
// I = intermediate_size, a = heads, k = key-value heads, d = C / a, t = tp.
//
//   a layer's parameters   (2C² + 2 C k d + 3 C I)/t + 2C (the two RMSNorms, replicated)
//   the first stage        + embed_tokens V C/t;  the last: norm C + lm_head V C/t
//   FLOPs a token          6 (L (2C² + 2Ckd + 3CI) + V C) + 12 L C T
//   activations a token    a layer: 4C + 2 (the RMSNorms' inputs, outputs and rstd; with SP
//                          2C/t + 2/t and 5C, each column layer's own all-gathered input) +
//                          5C/t (q and k turned, k and v repeated to a heads as attention
//                          keeps them, its output and o_proj's copy) + a/t (log-sum-exps) +
//                          4I/t (gate's, SiLU's and up's outputs, their product); RoPE's
//                          tables T d a layer's forward. At the peak, the larger of the loss's
//                          moment and the last layer's SwiGLU backward (2I/t a token more and
//                          in the step's first backward down_proj's weight gradient, C I/t,
//                          and the head's, V C/t + C, each .grad from then on), with
//                          the pipeline's messages as the GPT's; with SP down_proj's forward
//                          reduce-scatter (3C + C/t) a moment too; recomputed, alive_blocks's
//                          layers (recompute's later moments are trainer_moments'); cp: ring attention's
//                          backward a moment of its own, as the GPT's (its working set 23C/t,
//                          k and v at the a heads' width).
//   collectives            the GPT's, but 7 sums a layer over tp (q, k, v, gate and up each
//                          take the stream) where the GPT's fused c_attn makes 4, k v hops of
//                          2 b (T/cp) C/t (repeated to the a heads) and no tied group
//   16 bits               precision_extra_bytes: beyond the activations at 2 bytes a float,
//                          read off train_gpt --model llama --precision P --memory-blocks, n a
//                          micro-batch's tokens, sp = t under SP (else 1), each a token a whole
//                          layer unless said:
//     float32 saved        the RMSNorms' rstd (float32 whatever x's dtype) 4/sp and the
//                          log-sum-exps 2a/t; autocast (bf16-mixed, 16-mixed): the norms'
//                          float32 inputs 4C/sp and, for their two float32 outputs (freed once
//                          cast), the five column layers' own 16-bit casts of their inputs,
//                          5 x 2C - 2 x 2C (0 with SP: the gathered copies priced already);
//                          a recomputed layer's kept input 2C/sp (the float32 stream)
//     weight casts         autocast: 2 (2C² + 2Ckd + 3CI)/t a whole layer (once with the cast
//                          cache; under pp each micro-batch in flight its own)
//     backward             down_proj's backward GEMMs on the CPU in float32: 4 (C n + CI/t +
//                          I n/t) - 2 I n/t (the product's backward's second I/t, not made
//                          yet); autocast: the float32 gradient from the norm and its cast 4C n/sp
//     messages             autocast, pp: the float32 stream, 2 bytes a float of the held sends
//                          and posted receives (pipeline_peak)
//     head gradient        autocast: lm_head's and the norm's float32 .grad, 2 (V C/t + C), in
//                          the stage's first backward
//     cp                   at ring attention's backward (activation_moments): the float32 ring's
//                          saved q k v and output 2 x 4C/t a layer and working set 2 x 23C/t; the
//                          layer going back its rstd, log-sum-exps and, under autocast, its
//                          norm's input, q's k's v's casts (activation and weight), the float32
//                          gradient into the stream 2C/sp, the weight gradients made as float32
//                          .grad 2 (3CI/t + C²/t + C)
//                          ZeRO's stages change none (ZeRO-2's later moment is the GPT's alone).
//                          Priced at the MLP backward's moment: where the head's is the peak
//                          (V well above C) the figure is not held.
//
// Held: every collective byte exact against gpt-parallel-bench --model llama's counts (its
// ctests: tp 2 with SP, cp 2, pp 2 with 4 micro-batches, dp 2 x cp 2 with ZeRO-3); each
// rank's peak within 5 % of these terms at train_gpt's moments (samples/trainer_moments.h),
// 0.977 to 1.025 on 23 splits, in 32-true, and 0.979 to 1.020 on 26 splits in bf16-mixed,
// 16-mixed and bf16-true (the ctest `train_gpt --model llama: each rank's peak within 5 %
// ...`, a dozen of them; bench/RESULTS.md has the tables).
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
  double block_activation_floats(const MeshShape& mesh) const override;
  double ring_weight_gradient_floats(const MeshShape& mesh, int stage) const override;
  std::map<std::string, CollectiveBytes> collective_bytes(const MeshShape& mesh, int stage, double act_bytes,
                                                          double grad_bytes, double stream_bytes) const override;
  // The 16-bit precisions' terms (this header's top).
  std::optional<PrecisionExtraBytes> precision_extra_bytes(const MeshShape& mesh, int stage, int zero, bool recompute,
                                                           Precision precision) const override;
  // After the peak on dp and tp (SwiGLU's gate's and up's backward); before it under cp.
  std::optional<FlatGradientMoment> flat_gradient_moment(const MeshShape& mesh) const override;
  // A whole layer's share of precision_extra_bytes's ring moment.
  std::optional<PrecisionExtraBytes> ring_block_extra_bytes(const MeshShape& mesh, Precision precision) const override;

 private:
  models::LlamaConfig config_;
  double C_, I_, V_, kd_;  // hidden, intermediate, vocabulary, k d (the k and v widths)
  // activation_peak_floats's two moments: the backward's and, under cp without recompute,
  // ring attention's backward (0 otherwise); the peak is the larger.
  ActivationMoments activation_moments(const MeshShape& mesh, int stage, bool recompute) const;
  // A layer's saved floats a token (activation_peak_floats has each term).
  double layer_floats(double t, bool sp) const;
  // The weight gradients a layer has made when its attention goes back (its MLP's, o_proj's
  // and its second norm's: 3CI/t + C²/t + C), in elements.
  double attention_backward_weight_grads(double t) const;
};

}  // namespace mg::plan
