// models::GPT: nanoGPT's model (Karpathy, github.com/karpathy/nanoGPT, model.py), layer
// for layer and name for name, so that a checkpoint of this model loads into nanoGPT's
// with strict=True and every number can be checked against PyTorch from the same weights.
//
//   idx [B, T] int64
//   x = drop(wte(idx) + wpe(arange(T)))                       [B, T, C]
//   n_layer times:  x = x + attn(ln_1(x))                     pre-LayerNorm blocks
//                   x = x + mlp(ln_2(x))
//   logits = ln_f(x) @ wte.weight^T                            [B, T, V], the head tied
//
// attn is causal self-attention over n_head heads of C / n_head: one Linear makes q, k
// and v (c_attn, [3C, C]), scaled_dot_product_attention mixes the positions (the fused
// kernel unless set_fused_attention_enabled(false): the composition q k^T / sqrt(d),
// causal mask, softmax, times v), c_proj brings the heads back to C. mlp is
// c_fc (C -> 4C), exact GELU, c_proj (4C -> C). Initialisation is GPT-2's: N(0, 0.02)
// for every Linear and Embedding weight, zero biases, and N(0, 0.02 / sqrt(2 n_layer)) for
// the two c_proj weights of each block, whose outputs add into the residual stream.
//
// Parameter names are nanoGPT's: transformer.wte.weight, transformer.wpe.weight,
// transformer.h.<i>.ln_1.weight, transformer.h.<i>.attn.c_attn.weight, ...,
// transformer.ln_f.weight. The head (lm_head, a Linear without bias) holds the token
// embedding's tensor itself, so named_parameters() lists it once (as torch's does, for the
// optimizer), while state_dict() also names it lm_head.weight, as torch's state_dict does.
// Children are called through operator(), so a plan's hooks and swapped modules act inside
// the blocks; the forward passes absent children through (wte, ln_f, lm_head), so a
// pipeline stage is the same model with the others' parts removed.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include <minigrad/core/generator.h>
#include <minigrad/nn/layers.h>
#include <minigrad/nn/serialize.h>
#include <minigrad/nn/transformer_layers.h>

namespace mg::models {

struct GPTConfig {
  int64_t block_size = 1024;  // the longest sequence (positions of wpe)
  int64_t vocab_size = 50304;
  int64_t n_layer = 12;
  int64_t n_head = 12;
  int64_t n_embd = 768;
  double dropout = 0.0;
  bool bias = true;  // biases in the Linears and LayerNorms (GPT-2 has them)

  // mg::Error unless every size is positive, n_embd divides into n_head heads and
  // dropout is in [0, 1).
  void validate() const;
  std::string str() const;  // "n_layer=4, n_head=4, n_embd=128, ..."
};

// Causal self-attention: [B, T, C] -> [B, T, C].
class CausalSelfAttention : public nn::Cloneable<CausalSelfAttention>, public nn::AttentionHost {
 public:
  explicit CausalSelfAttention(const GPTConfig& config);
  // x [B, T, C] -> [B, T, C]; the heads are as many as c_attn's output holds (all of
  // them, or a tensor-parallel rank's).
  Tensor forward(const Tensor& x) override;

  // How the heads attend: q, k, v [B, nh, T, hs] and the attention dropout -> [B, nh, T, hs].
  // Unset (the default): scaled_dot_product_attention, causal. Context parallelism sets
  // ring attention here (a plan's ContextParallel style: parallel/context_parallel/style.h).
  void set_attention_function(AttentionFunction attention) override { attention_ = std::move(attention); }

  // Generation's KV cache (GPT::generate): on, each forward continues the sequence where the
  // cache ends, one new token at a time after the first (the prompt's) forward; its k and v
  // are kept beside the cached ones. Off (and emptied) by default. Under NoGradGuard only.
  void set_kv_cache(bool on);
  int64_t kv_cache_length() const { return cache_length_; }

 private:
  int64_t head_size_;
  double dropout_;
  AttentionFunction attention_;
  bool cache_on_ = false;
  int64_t cache_length_ = 0;
  Tensor k_cache_, v_cache_;  // [B, heads, cache_length_, hs]
};

// The feed-forward part: [B, T, C] -> [B, T, C] through 4C.
class MLP : public nn::Cloneable<MLP> {
 public:
  explicit MLP(const GPTConfig& config);
  Tensor forward(const Tensor& x) override;
};

// One pre-LayerNorm transformer block.
class Block : public nn::Cloneable<Block> {
 public:
  explicit Block(const GPTConfig& config);
  Tensor forward(const Tensor& x) override;
};

// nanoGPT's `transformer` ModuleDict: wte, wpe, drop, h (the blocks), ln_f. Its forward is
// GPT's up to ln_f: [B, T] int64 -> [B, T, C]. Absent children are passed through (a
// pipeline stage's part: without wte the input is activations [B, T, C]; without ln_f the
// last block's output comes out).
class GPTTransformer : public nn::Cloneable<GPTTransformer> {
 public:
  explicit GPTTransformer(const GPTConfig& config);
  // idx [B, T] -> [B, T, C] at positions 0 .. T-1, or after the positions the first
  // block's KV cache holds.
  Tensor forward(const Tensor& idx) override;
};

class GPT : public nn::Cloneable<GPT> {
 public:
  explicit GPT(GPTConfig config);

  // idx [B, T] int64, T <= block_size -> logits [B, T, vocab_size].
  Tensor forward(const Tensor& idx) override;
  // Mean cross-entropy of logits [B, T, V] against targets [B, T] (int64; -1 is ignored,
  // as nanoGPT's ignore_index=-1); Reduction::Sum: the targets' summed losses (a split
  // step's share: its tokens' sum over the whole batch's count).
  static Tensor loss(const Tensor& logits, const Tensor& targets, Reduction reduction = Reduction::Mean);

  // Appends max_new_tokens tokens to idx [B, T] (int64), each sampled from the softmax of
  // the last position's logits / temperature, keeping only the top_k most likely (0: all),
  // with the context cropped to the last block_size tokens: nanoGPT's generate. Runs
  // without gradients, in the model's dtype (float32 or float64); returns
  // [B, T + max_new_tokens] ([0, T + max_new_tokens] for B = 0). The module's train/eval
  // mode is left as it is (call eval() first for no dropout). temperature 0 is its limit:
  // the most likely token every time (argmax's, the first of equal logits). Logits that make
  // no distribution (NaN, +inf, all -inf: a model with NaN weights) are an mg::Error naming
  // the step and the sequence, as torch.multinomial refuses them.
  // use_cache (models/llama.h's, for the GPT): the prompt once (prefill), then one token per
  // step through each attention's KV cache while the sequence fits block_size; past it, every
  // step forwards the last block_size tokens, as without the cache (a cache cannot slide:
  // its positions are fixed). The two give the same tokens.
  Tensor generate(const Tensor& idx, int64_t max_new_tokens, double temperature = 1.0,
                  int64_t top_k = 0, Generator* generator = nullptr, bool use_cache = true);

  const GPTConfig& config() const { return config_; }
  // The token embedding, which is also the head's weight.
  Tensor& wte_weight();
  // Parameters counted once; without the position embedding when non_embedding (nanoGPT's
  // get_num_params: the token embedding stays, it is the head too).
  int64_t num_parameters(bool non_embedding = true) const;

  // ---- checkpoints with nanoGPT's keys ----
  // nn::state_dict(*this) plus lm_head.weight (the same tensor as transformer.wte.weight).
  nn::TensorDict state_dict() const;
  // The same layout from a dict of the parameters under named_parameters()' names (what a
  // split's parallel::full_state_dict gathers): lm_head.weight added beside wte.
  static nn::TensorDict state_dict_of(nn::TensorDict parameters);
  // Checks `tensors` as nn::check_state_dict does, with lm_head.weight required and equal
  // to transformer.wte.weight (they are one tensor here); then loads. mg::Error naming
  // `source` and changing nothing otherwise.
  void check_state_dict(const nn::TensorDict& tensors, const std::string& source) const;
  void load_state_dict(const nn::TensorDict& tensors, const std::string& source);

 private:
  GPTConfig config_;
};

}  // namespace mg::models
