// models::Llama: a Llama-family decoder (Llama 2 and 3's blocks), layer for layer and name
// for name as HF transformers' LlamaForCausalLM (modeling_llama.py, the versions whose
// attention holds its own rotary_emb, e.g. 4.36), so that its state_dict loads into that
// model with strict=True and every number can be checked against PyTorch from the same
// weights (tests/models/reference/llama_reference.py is such a model, written out).
//
//   idx [B, T] int64
//   x = embed_tokens(idx)                                       [B, T, C]   (no position table)
//   num_hidden_layers times:  x = x + self_attn(input_layernorm(x))          RMSNorm, not LayerNorm
//                             x = x + mlp(post_attention_layernorm(x))
//   logits = lm_head(norm(x))                                    [B, T, V], the head its own weight
//
// self_attn is causal grouped-query attention: q_proj makes n_heads heads of d = C / n_heads,
// k_proj and v_proj only n_kv_heads (each serves n_heads / n_kv_heads query heads: 1 is
// multi-query, n_heads is plain multi-head); q and k are turned by the rotary embedding of
// their positions (RoPE, rotate_half layout: rotary_emb's tables); the kv heads are repeated
// to the query heads (HF's repeat_kv) and scaled_dot_product_attention mixes the positions;
// o_proj brings the heads back to C. mlp is SwiGLU: down_proj(silu(gate_proj(x)) * up_proj(x)),
// C -> intermediate_size -> C. No Linear has a bias. Initialisation is HF's: N(0, 0.02) for every
// Linear and Embedding weight, ones for the norms. docs/llama.md.
//
// Parameter names are HF's: model.embed_tokens.weight, model.layers.<i>.input_layernorm.weight,
// model.layers.<i>.self_attn.{q,k,v,o}_proj.weight, model.layers.<i>.post_attention_layernorm.weight,
// model.layers.<i>.mlp.{gate,up,down}_proj.weight, model.norm.weight, lm_head.weight. Children are
// called through operator() and absent ones passed through (embed_tokens, norm, lm_head), as the
// GPT's, so a plan's styles act inside the blocks and a pipeline stage is the model without the
// other stages' parts. Head counts are read from the projections' widths, never from the config
// (a tensor-parallel rank holds n_heads / tp query heads and n_kv_heads / tp kv heads).
#pragma once

#include <cstdint>
#include <string>

#include <minigrad/core/generator.h>
#include <minigrad/nn/layers.h>
#include <minigrad/nn/transformer_layers.h>

namespace mg::models {

// HF's LlamaConfig names (defaults: a small model, not Llama 2 7B's).
struct LlamaConfig {
  int64_t vocab_size = 32000;
  int64_t hidden_size = 512;
  int64_t intermediate_size = 1376;  // the SwiGLU width (Llama: about 8/3 hidden_size)
  int64_t num_hidden_layers = 8;
  int64_t num_attention_heads = 8;
  int64_t num_key_value_heads = 4;  // grouped-query attention; = num_attention_heads: multi-head
  int64_t max_position_embeddings = 2048;  // the longest sequence forward accepts
  double rms_norm_eps = 1e-5;
  double rope_theta = 10000.0;

  int64_t head_dim() const { return hidden_size / num_attention_heads; }
  // mg::Error unless every size is positive, hidden_size divides into num_attention_heads heads of
  // an even size (RoPE turns pairs), and num_key_value_heads divides num_attention_heads.
  void validate() const;
  std::string str() const;
};

// RoPE's tables: positions int64 [T] (any positions: a context-parallel rank's are two chunks,
// ContextParallelPositions' hook gives them) -> float64 [T, head_dim] on the host, cos(t w_i) in
// columns i < head_dim / 2 and sin(t w_i) in the rest, w_i = rope_theta^(-2 i / head_dim). No
// parameters and no buffer (HF's inv_freq is not in its state_dict either): computed in double.
class RotaryEmbedding : public nn::Cloneable<RotaryEmbedding> {
 public:
  RotaryEmbedding(int64_t head_dim, double theta);
  Tensor forward(const Tensor& positions) override;
  std::string extra_repr() const override;

 private:
  int64_t head_dim_;
  double theta_;
};

// Grouped-query causal self-attention with RoPE: [B, T, C] -> [B, T, C].
class LlamaAttention : public nn::Cloneable<LlamaAttention>, public nn::AttentionHost {
 public:
  explicit LlamaAttention(const LlamaConfig& config);
  // x [B, T, C] at positions 0 .. T-1 (after the cached ones); forward_args({x, positions}):
  // at the given positions, int64 [T] (HF's position_ids).
  Tensor forward(const Tensor& x) override;
  Tensor forward_args(const nn::TensorList& inputs) override;
  // q [B, heads, T, d] and k, v repeated to as many heads -> [B, heads, T, d]. Unset: causal
  // scaled_dot_product_attention; context parallelism sets ring attention here.
  void set_attention_function(AttentionFunction attention) override { attention_ = std::move(attention); }

  // Generation's KV cache (Llama::generate): on, each forward continues the sequence where the
  // cache ends -- its positions follow the cached ones, its k and v (turned by RoPE, before
  // repeat_kv) are appended, and it attends over all of them; the first (the prompt) causally,
  // then one token at a time. Off (the default, and what turning it on or off again leaves):
  // empty. Runs without gradients.
  void set_kv_cache(bool on);
  int64_t kv_cache_length() const { return cache_length_; }

 private:
  Tensor attend(const Tensor& x, const Tensor& positions);

  int64_t head_dim_;
  AttentionFunction attention_;
  bool cache_on_ = false;
  int64_t cache_length_ = 0;
  Tensor k_cache_, v_cache_;  // [B, kv heads, cache_length_, d]
};

// SwiGLU: [B, T, C] -> [B, T, C] through intermediate_size.
class LlamaMLP : public nn::Cloneable<LlamaMLP> {
 public:
  explicit LlamaMLP(const LlamaConfig& config);
  Tensor forward(const Tensor& x) override;
};

// One pre-RMSNorm block.
class LlamaDecoderLayer : public nn::Cloneable<LlamaDecoderLayer> {
 public:
  explicit LlamaDecoderLayer(const LlamaConfig& config);
  Tensor forward(const Tensor& x) override;
  Tensor forward_args(const nn::TensorList& inputs) override;  // {x, positions}: to self_attn
};

// HF's LlamaModel: embed_tokens, layers, norm. [B, T] int64 -> [B, T, C]; absent children passed
// through (without embed_tokens the input is activations [B, T, C]).
class LlamaModel : public nn::Cloneable<LlamaModel> {
 public:
  explicit LlamaModel(const LlamaConfig& config);
  Tensor forward(const Tensor& idx) override;
  Tensor forward_args(const nn::TensorList& inputs) override;  // {idx, positions}

 private:
  int64_t max_positions_;
};

class Llama : public nn::Cloneable<Llama> {
 public:
  explicit Llama(LlamaConfig config);
  // idx [B, T] int64, T <= max_position_embeddings -> logits [B, T, vocab_size].
  Tensor forward(const Tensor& idx) override;
  // model({idx, position_ids}): the tokens at the given positions, int64 [T] each below
  // max_position_embeddings (HF's position_ids, shared by the batch: a sequence continued
  // after a prefix, packed sequences restarting at 0). RoPE makes attention depend on the
  // positions' differences alone, so arange(k, k + T) gives forward(idx)'s logits. On one
  // device or split by the tp and cp plans or FSDP; a pipeline's stages pass activations alone.
  Tensor forward_args(const nn::TensorList& inputs) override;
  // Mean cross-entropy of logits [B, T, V] against targets [B, T] (-1 ignored, as the GPT's and
  // the split losses'); Reduction::Sum: the targets' summed losses.
  static Tensor loss(const Tensor& logits, const Tensor& targets, Reduction reduction = Reduction::Mean);
  const LlamaConfig& config() const { return config_; }
  int64_t num_parameters() const;

  // Appends max_new_tokens tokens to idx [B, T] (int64), each drawn from the last position's
  // logits as GPT::generate draws (models/sampling.h: temperature, top_k, the generator; 0 is
  // the argmax). use_cache: the prompt once (prefill), then one token per step through each
  // attention's KV cache; T + max_new_tokens must then fit max_position_embeddings (mg::Error
  // otherwise). Without it, the whole context (its last max_position_embeddings tokens) every
  // step. The two give the same tokens. Runs without gradients; train/eval mode as it is.
  Tensor generate(const Tensor& idx, int64_t max_new_tokens, double temperature = 1.0, int64_t top_k = 0,
                  Generator* generator = nullptr, bool use_cache = true);

 private:
  LlamaConfig config_;
};

}  // namespace mg::models
