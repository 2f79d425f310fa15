#include "language_model.h"

#include <fmt/format.h>

#include <minigrad/nn/serialize.h>
#include <minigrad/plan/model_arithmetic.h>
#include <minigrad/plan/llama_formulas.h>

#include "command_line.h"

namespace mg::samples {
namespace {

models::GPTConfig gpt_config(const ModelFlags& f, int64_t vocab_size) {
  models::GPTConfig c;
  c.block_size = f.block_size;
  c.vocab_size = vocab_size;
  c.n_layer = f.n_layer;
  c.n_head = f.n_head;
  c.n_embd = f.n_embd;
  c.dropout = f.dropout;
  return c;
}

models::LlamaConfig llama_config(const ModelFlags& f, int64_t vocab_size) {
  if (f.dropout != 0.0)
    throw OptionError(fmt::format("--model llama has no dropout (Llama's blocks have none); got --dropout {}", f.dropout));
  const int64_t kv = f.n_kv_head > 0 ? f.n_kv_head : f.n_head % 2 == 0 ? f.n_head / 2 : f.n_head;
  if (f.n_head % kv != 0)
    throw OptionError(fmt::format("--n-kv-head {} does not divide --n-head {}: each kv head serves a whole group of "
                                  "query heads (grouped-query attention)", kv, f.n_head));
  models::LlamaConfig c;
  c.vocab_size = vocab_size;
  c.hidden_size = f.n_embd;
  // Llama's SwiGLU width: 2/3 of the GPT's 4 C (three matrices in place of two), rounded up.
  c.intermediate_size = f.intermediate_size > 0 ? f.intermediate_size : (8 * f.n_embd / 3 + 31) / 32 * 32;
  c.num_hidden_layers = f.n_layer;
  c.num_attention_heads = f.n_head;
  c.num_key_value_heads = kv;
  c.max_position_embeddings = f.block_size;
  return c;
}

}  // namespace

std::vector<std::string> model_names() { return {"gpt", "llama"}; }

LanguageModel::LanguageModel(const ModelFlags& flags, int64_t vocab_size) : kind_(flags.model) {
  if (kind_ == "gpt") {
    gpt_ = std::make_shared<models::GPT>(gpt_config(flags, vocab_size));
  } else if (kind_ == "llama") {
    const models::LlamaConfig config = llama_config(flags, vocab_size);
    try {
      config.validate();
    } catch (const Error& e) {  // in the flags' words
      throw OptionError(fmt::format("--model llama with --n-head {} and --n-embd {}: {}", flags.n_head, flags.n_embd, e.what()));
    }
    llama_ = std::make_shared<models::Llama>(config);
  } else {
    throw OptionError(fmt::format("--model {}: not a model; the models are gpt and llama", kind_));
  }
}

nn::ModulePtr LanguageModel::module() const { return gpt_ ? nn::ModulePtr(gpt_) : nn::ModulePtr(llama_); }

models::SplitSpec LanguageModel::split_spec() const {
  return gpt_ ? models::gpt_split_spec(gpt_) : models::llama_split_spec(llama_);
}

std::string LanguageModel::str() const {
  return gpt_ ? "GPT: " + gpt_->config().str() : "Llama: " + llama_->config().str();
}

int64_t LanguageModel::num_parameters() const { return gpt_ ? gpt_->num_parameters() : llama_->num_parameters(); }

std::string LanguageModel::config_key() const { return gpt_ ? "gpt_config" : "llama_config"; }

std::string LanguageModel::config_json() const {
  if (gpt_) {
    const models::GPTConfig& c = gpt_->config();
    return fmt::format("{{\"block_size\": {}, \"vocab_size\": {}, \"n_layer\": {}, \"n_head\": {}, "
                       "\"n_embd\": {}, \"dropout\": {}, \"bias\": {}}}",
                       c.block_size, c.vocab_size, c.n_layer, c.n_head, c.n_embd, c.dropout, c.bias ? "true" : "false");
  }
  const models::LlamaConfig& c = llama_->config();
  return fmt::format("{{\"vocab_size\": {}, \"hidden_size\": {}, \"intermediate_size\": {}, \"num_hidden_layers\": {}, "
                     "\"num_attention_heads\": {}, \"num_key_value_heads\": {}, \"max_position_embeddings\": {}, "
                     "\"rms_norm_eps\": {}, \"rope_theta\": {}, \"tie_word_embeddings\": false}}",
                     c.vocab_size, c.hidden_size, c.intermediate_size, c.num_hidden_layers, c.num_attention_heads,
                     c.num_key_value_heads, c.max_position_embeddings, c.rms_norm_eps, c.rope_theta);
}

nn::TensorDict LanguageModel::state_dict() const { return gpt_ ? gpt_->state_dict() : nn::state_dict(*llama_); }

void LanguageModel::check_state_dict(const nn::TensorDict& state, const std::string& source) const {
  if (gpt_) gpt_->check_state_dict(state, source);
  else nn::check_state_dict(*llama_, state, source);
}

void LanguageModel::load_state_dict(const nn::TensorDict& state, const std::string& source) {
  if (gpt_) gpt_->load_state_dict(state, source);
  else nn::load_state_dict(*llama_, state, source);
}

Tensor LanguageModel::loss(const Tensor& logits, const Tensor& targets) const {
  return gpt_ ? models::GPT::loss(logits, targets) : models::Llama::loss(logits, targets);
}

Tensor LanguageModel::generate(const Tensor& idx, int64_t max_new_tokens, double temperature, int64_t top_k,
                               Generator* generator) {
  if (gpt_) return gpt_->generate(idx, max_new_tokens, temperature, top_k, generator);
  // The cache holds max_position_embeddings positions: beyond them, the uncached window.
  const bool fits = idx.size(1) + max_new_tokens <= llama_->config().max_position_embeddings;
  return llama_->generate(idx, max_new_tokens, temperature, top_k, generator, fits);
}

double LanguageModel::flops_per_token(int64_t T) const {
  if (gpt_) return plan::GPTArithmetic(gpt_->config()).flops_per_token(T);
  return plan::LlamaArithmetic(llama_->config()).flops_per_token(T);
}

}  // namespace mg::samples
