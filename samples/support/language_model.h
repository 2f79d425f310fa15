// train_gpt --model gpt|llama: the model flags, the model they build, and what the trainer
// asks of that model beyond its split spec (models/split_spec.h): its config in the
// checkpoint's metadata, checking and loading a checkpoint's weights, and a sample.
//
//   gpt    models::GPT, nanoGPT's: learned positions, LayerNorm, GELU, a head tied to wte
//   llama  models::Llama (docs/llama.md): RoPE, RMSNorm, SwiGLU, grouped-query attention
//          (--n-kv-head), an untied head, no biases and no dropout
//
// The same flags size both: --n-layer blocks, --n-head heads of --n-embd / --n-head, a
// context of --block-size; the Llama's SwiGLU width is Llama's 8/3 n_embd rounded up to a
// multiple of 32 unless --intermediate-size says otherwise.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include <minigrad/core/generator.h>
#include <minigrad/core/tensor.h>
#include <minigrad/models/gpt.h>
#include <minigrad/models/llama.h>
#include <minigrad/models/split_spec.h>

namespace mg::samples {

struct ModelFlags {
  std::string model = "gpt";  // gpt | llama
  int64_t n_layer = 4, n_head = 4, n_embd = 128, block_size = 64;
  int64_t n_kv_head = 0;          // llama: 0 is n_head / 2 (n_head when that is odd)
  int64_t intermediate_size = 0;  // llama: 0 is 8/3 n_embd, rounded up to a multiple of 32
  double dropout = 0.0;           // gpt only
};

class LanguageModel {
 public:
  // Built from the default generator (the caller seeds it), in float32 on the CPU; mg::Error
  // for sizes the model refuses (OptionError's words: the flags' names).
  LanguageModel(const ModelFlags& flags, int64_t vocab_size);

  const std::string& kind() const { return kind_; }  // "gpt" | "llama"
  nn::ModulePtr module() const;
  models::SplitSpec split_spec() const;
  // "GPT: n_layer=4, ..." for the log.
  std::string str() const;
  // nanoGPT's count for the GPT (without wpe), every parameter for the Llama.
  int64_t num_parameters() const;

  // The metadata a checkpoint keeps: the key ("gpt_config", "llama_config") and the config
  // as JSON in its reference's spelling (gpt_reference.py's, HF's LlamaConfig's).
  std::string config_key() const;
  std::string config_json() const;

  // The single-device state dict (the GPT's with lm_head.weight), checked against this model
  // (mg::Error naming `source`, nothing changed) and loaded.
  nn::TensorDict state_dict() const;
  void check_state_dict(const nn::TensorDict& state, const std::string& source) const;
  void load_state_dict(const nn::TensorDict& state, const std::string& source);

  // The mean token loss of logits [B, T, V] against targets [B, T] (the model's own loss).
  Tensor loss(const Tensor& logits, const Tensor& targets) const;
  // The model's generate (the Llama's through its KV cache).
  Tensor generate(const Tensor& idx, int64_t max_new_tokens, double temperature, int64_t top_k, Generator* generator);
  // Training FLOPs a token of a row of `T` tokens: 6 N_matmul + 12 L C T (plan/planner.h).
  double flops_per_token(int64_t T) const;

 private:
  std::string kind_;
  std::shared_ptr<models::GPT> gpt_;      // --model gpt
  std::shared_ptr<models::Llama> llama_;  // --model llama
};

// The names --model takes.
std::vector<std::string> model_names();

}  // namespace mg::samples
