#include <minigrad/models/gpt.h>

#include <algorithm>
#include <cmath>

#include <minigrad/autograd/functions.h>
#include <minigrad/autograd/grad_mode.h>
#include <minigrad/core/ops.h>
#include <minigrad/models/sampling.h>
#include <minigrad/nn/init.h>

namespace mg::models {

namespace {

bool ends_with(const std::string& s, const std::string& suffix) {
  return s.size() >= suffix.size() && s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}

}  // namespace

void GPTConfig::validate() const {
  MG_CHECK(block_size > 0 && vocab_size > 0 && n_layer > 0 && n_head > 0 && n_embd > 0,
           "GPTConfig: every size must be positive, got {}", str());
  MG_CHECK(n_embd % n_head == 0,
           "GPTConfig: n_embd {} does not divide into n_head {} heads of equal size", n_embd,
           n_head);
  MG_CHECK(std::isfinite(dropout) && dropout >= 0.0 && dropout < 1.0,
           "GPTConfig: dropout must be in [0, 1), got {}", dropout);
}

std::string GPTConfig::str() const {
  return fmt::format("n_layer={}, n_head={}, n_embd={}, block_size={}, vocab_size={}, "
                     "dropout={}, bias={}",
                     n_layer, n_head, n_embd, block_size, vocab_size, dropout, bias);
}

// ---------------------------------------------------------------- attention

CausalSelfAttention::CausalSelfAttention(const GPTConfig& config)
    : nn::Cloneable<CausalSelfAttention>("CausalSelfAttention"),
      head_size_(config.n_embd / config.n_head),
      dropout_(config.dropout) {
  register_module("c_attn", std::make_shared<nn::Linear>(config.n_embd, 3 * config.n_embd, config.bias));
  register_module("c_proj", std::make_shared<nn::Linear>(config.n_embd, config.n_embd, config.bias));
  register_module("attn_dropout", std::make_shared<nn::Dropout>(config.dropout));
  register_module("resid_dropout", std::make_shared<nn::Dropout>(config.dropout));
}

Tensor CausalSelfAttention::forward(const Tensor& x) {
  MG_CHECK(x.dim() == 3, "CausalSelfAttention: expected input [B, T, C], got {}", x.shape());
  // q, k, v for all heads at once: one [B, T, 3 C'] product, cut in three along C'. C' is
  // C, or this rank's heads' share of it when c_attn is split by heads (a plan's
  // ColwiseParallel with stride 3): the head count is read from the projection, never
  // from the config (torchtitan's "-1 instead of n_heads").
  const Tensor qkv = (*child("c_attn"))(x);
  const int64_t B = qkv.size(0), T = qkv.size(1), width = qkv.size(2) / 3, hs = head_size_;
  MG_CHECK(qkv.size(2) % 3 == 0 && width % hs == 0,
           "CausalSelfAttention: c_attn gives {} features, not 3 x a whole number of heads of {}", qkv.size(2), hs);
  const int64_t heads = width / hs;
  const std::vector<Tensor> parts = split(qkv, width, 2);
  // [B, T, C'] -> [B, nh, T, hs]: each head attends over the T positions on its own.
  const auto split_heads = [&](const Tensor& t) { return transpose(reshape(t, {B, T, heads, hs}), 1, 2); };
  // softmax(q k^T / sqrt(hs), causal) v: [B, nh, T, hs]. The [B, nh, T, T] attention
  // matrix exists only in the composed path; the fused kernel never stores it. The
  // attention dropout acts on that matrix, so it is the op's dropout_p, drawn from
  // attn_dropout's generator (attn_dropout stands for it, as in nanoGPT's flash path).
  const double dropout_p = is_training() ? dropout_ : 0.0;
  const Tensor q = split_heads(parts[0]);
  Tensor k = split_heads(parts[1]), v = split_heads(parts[2]);
  const int64_t cached = cache_on_ ? cache_length_ : 0;
  if (cache_on_) {  // the cached positions' k and v, then this forward's
    MG_CHECK(!GradMode::is_enabled(), "CausalSelfAttention: the KV cache is for generation, under NoGradGuard");
    MG_CHECK(cached == 0 || T == 1, "CausalSelfAttention: with a KV cache of {} positions, forward takes one new "
             "token at a time, got {}", cached, T);
    if (cached > 0) {
      k = cat({k_cache_, k}, 2);
      v = cat({v_cache_, v}, 2);
    }
    k_cache_ = k;
    v_cache_ = v;
    cache_length_ = k.size(2);
  }
  // A token after the cache sees every cached position: no mask (a [1, S] causal mask is
  // aligned at the top-left and would see position 0 alone).
  const Tensor y =
      attention_ ? attention_(q, k, v, dropout_p)
                 : scaled_dot_product_attention(q, k, v, /*is_causal=*/cached == 0, dropout_p,
                                                static_cast<const nn::Dropout&>(*child("attn_dropout")).generator());
  // The heads side by side again: [B, T, C'].
  const Tensor merged = reshape(contiguous(transpose(y, 1, 2)), {B, T, width});
  return (*child("resid_dropout"))((*child("c_proj"))(merged));
}

void CausalSelfAttention::set_kv_cache(bool on) {
  cache_on_ = on;
  cache_length_ = 0;
  k_cache_ = v_cache_ = Tensor();
}

// ---------------------------------------------------------------- MLP, Block

MLP::MLP(const GPTConfig& config) : nn::Cloneable<MLP>("MLP") {
  register_module("c_fc", std::make_shared<nn::Linear>(config.n_embd, 4 * config.n_embd, config.bias));
  register_module("gelu", std::make_shared<nn::GELU>("none"));
  register_module("c_proj", std::make_shared<nn::Linear>(4 * config.n_embd, config.n_embd, config.bias));
  register_module("dropout", std::make_shared<nn::Dropout>(config.dropout));
}

Tensor MLP::forward(const Tensor& x) {
  Tensor h = (*child("c_fc"))(x);  // [B, T, 4C]
  h = (*child("gelu"))(h);
  return (*child("dropout"))((*child("c_proj"))(h));  // [B, T, C]
}

Block::Block(const GPTConfig& config) : nn::Cloneable<Block>("Block") {
  register_module("ln_1", std::make_shared<nn::LayerNorm>(config.n_embd, 1e-5, true, config.bias));
  register_module("attn", std::make_shared<CausalSelfAttention>(config));
  register_module("ln_2", std::make_shared<nn::LayerNorm>(config.n_embd, 1e-5, true, config.bias));
  register_module("mlp", std::make_shared<MLP>(config));
}

Tensor Block::forward(const Tensor& x) {
  // Pre-LayerNorm residual blocks: each branch reads a normalised copy of the stream and
  // adds its output back.
  const Tensor x1 = x + (*child("attn"))((*child("ln_1"))(x));
  return x1 + (*child("mlp"))((*child("ln_2"))(x1));
}

// ---------------------------------------------------------------- the transformer

GPTTransformer::GPTTransformer(const GPTConfig& config)
    : nn::Cloneable<GPTTransformer>("ModuleDict") {
  register_module("wte", std::make_shared<nn::Embedding>(config.vocab_size, config.n_embd));
  register_module("wpe", std::make_shared<nn::Embedding>(config.block_size, config.n_embd));
  register_module("drop", std::make_shared<nn::Dropout>(config.dropout));
  auto h = std::make_shared<nn::Sequential>();  // ModuleList: h.0, h.1, ...
  for (int64_t i = 0; i < config.n_layer; ++i) h->push_back(std::make_shared<Block>(config));
  register_module("h", h);
  register_module("ln_f", std::make_shared<nn::LayerNorm>(config.n_embd, 1e-5, true, config.bias));
}

Tensor GPTTransformer::forward(const Tensor& input) {
  // Children are called with their hooks (operator()), as PyTorch calls them: a plan's
  // styles, FSDP's units and activation checkpointing act there. A child that is absent
  // (a pipeline stage holds only its part: parallel/pipeline/split_module.h) is passed
  // through: without wte the input is the previous stage's activations [B, T, C].
  Tensor x = input;
  if (has_child("wte")) {
    MG_CHECK(input.dim() == 2 && input.dtype() == DType::Int64,
             "GPT: expected token indices int64 [B, T], got {} ({})", input.shape(), input.dtype());
    const int64_t T = input.size(1), block_size = static_cast<const nn::Embedding&>(*child("wpe")).num_embeddings();
    // The positions 0 .. T-1, or after the KV cache's (a plan's hook on wpe may take
    // others: context parallelism's).
    const auto& blocks = child("h")->children();
    const int64_t start =
        blocks.empty() ? 0 : static_cast<const CausalSelfAttention&>(*blocks.front()->child("attn")).kv_cache_length();
    MG_CHECK(start + T <= block_size, "GPT: cannot forward a sequence of length {}, block_size is only {}", start + T,
             block_size);
    const Tensor pos = arange(static_cast<double>(start), static_cast<double>(start + T), 1.0, DType::Int64,
                              input.device());  // [T]
    const Tensor tok_emb = (*child("wte"))(input);                                      // [B, T, C]
    const Tensor pos_emb = (*child("wpe"))(pos);                                        // [T, C]
    x = (*child("drop"))(tok_emb + pos_emb);  // broadcast over B
  }
  x = (*child("h"))(x);  // the blocks (this stage's)
  return has_child("ln_f") ? (*child("ln_f"))(x) : x;
}

// ---------------------------------------------------------------- GPT

GPT::GPT(GPTConfig config) : nn::Cloneable<GPT>("GPT"), config_(config) {
  config_.validate();
  register_module("transformer", std::make_shared<GPTTransformer>(config_));
  // The head, tied to the token embedding: one tensor in two modules (nanoGPT's
  // `transformer.wte.weight = lm_head.weight`), listed once by named_parameters.
  auto head = std::make_shared<nn::Linear>(config_.n_embd, config_.vocab_size, /*bias=*/false);
  head->set_parameter("weight", parameter("transformer.wte.weight"));
  register_module("lm_head", head);
  // GPT-2's initialisation (nanoGPT's _init_weights and the c_proj rule).
  const double proj_std = 0.02 / std::sqrt(2.0 * static_cast<double>(config_.n_layer));
  for (auto& [name, p] : named_parameters()) {
    Tensor t = p;
    if (ends_with(name, ".bias")) {
      nn::init::zeros_(t);
    } else if (name.find(".ln_") != std::string::npos) {
      // LayerNorm's scale stays 1.
    } else if (ends_with(name, "c_proj.weight")) {
      nn::init::normal_(t, 0.0, proj_std);
    } else {
      nn::init::normal_(t, 0.0, 0.02);
    }
  }
}

Tensor& GPT::wte_weight() { return parameter("transformer.wte.weight"); }

Tensor GPT::forward(const Tensor& idx) {
  const Tensor x = (*child("transformer"))(idx);  // [B, T, C]
  // logits = x wte^T, [B, T, V]: the head is the token embedding. Without it (a pipeline
  // stage before the last), the activations go on.
  return has_child("lm_head") ? (*child("lm_head"))(x) : x;
}

Tensor GPT::loss(const Tensor& logits, const Tensor& targets, Reduction reduction) {
  MG_CHECK(logits.dim() == 3 && targets.dim() == 2 && targets.size(0) == logits.size(0) &&
               targets.size(1) == logits.size(1),
           "GPT::loss: expected logits [B, T, V] and targets [B, T], got {} and {}",
           logits.shape(), targets.shape());
  const int64_t rows = logits.size(0) * logits.size(1);
  return cross_entropy(reshape(logits, {rows, logits.size(2)}), reshape(targets, {rows}),
                       CrossEntropyOptions().ignore_index(-1).reduction(reduction));
}

Tensor GPT::generate(const Tensor& idx, int64_t max_new_tokens, double temperature,
                     int64_t top_k, Generator* generator, bool use_cache) {
  check_generate_arguments("GPT::generate", idx, max_new_tokens, temperature, top_k);
  const int64_t B = idx.size(0), V = config_.vocab_size;
  // No sequences: nothing to sample, an empty [0, T + max_new_tokens] (as torch's).
  if (B == 0) return empty(Shape{0, idx.size(1) + max_new_tokens}, DType::Int64, idx.device());
  NoGradGuard no_grad;
  Generator& gen = generator != nullptr ? *generator : default_generator();
  std::vector<std::vector<int64_t>> seqs(static_cast<size_t>(B));
  const std::vector<int64_t> given = idx.to_vector<int64_t>();
  for (int64_t b = 0; b < B; ++b)
    seqs[static_cast<size_t>(b)].assign(given.begin() + b * idx.size(1),
                                        given.begin() + (b + 1) * idx.size(1));
  std::vector<std::shared_ptr<CausalSelfAttention>> attentions;
  for (const nn::ModulePtr& block : child("transformer")->child("h")->children())
    attentions.push_back(std::dynamic_pointer_cast<CausalSelfAttention>(block->child("attn")));
  // The caches on for this call only, and emptied whatever happens.
  struct Caches {
    std::vector<std::shared_ptr<CausalSelfAttention>>& all;
    void set(bool on) {
      for (auto& a : all) a->set_kv_cache(on);
    }
    ~Caches() { set(false); }
  } caches{attentions};
  caches.set(use_cache);
  bool cached = false;  // the caches hold every token of each sequence but the last one drawn
  for (int64_t n = 0; n < max_new_tokens; ++n) {
    const auto len = static_cast<int64_t>(seqs[0].size());  // they all have the same length
    std::vector<int64_t> context;
    int64_t T = 1;
    if (cached && len <= config_.block_size) {  // the token drawn last, at position len - 1
      for (const auto& s : seqs) context.push_back(s.back());
    } else {  // the prompt, or past block_size: the last block_size tokens, uncached from now on
      if (cached) caches.set(false);
      use_cache = use_cache && !cached;
      cached = use_cache;  // this forward fills the caches with the context
      T = std::min(len, config_.block_size);
      for (const auto& s : seqs) context.insert(context.end(), s.end() - T, s.end());
    }
    const Tensor ctx = ops::copy_to(from_vector(context, Shape{B, T}), idx.device());
    // Only the last position's logits are used.
    const std::vector<double> last = last_logits(forward(ctx));
    for (int64_t b = 0; b < B; ++b)
      seqs[static_cast<size_t>(b)].push_back(
          sample_token(last.data() + b * V, V, temperature, top_k, gen, "GPT::generate", n + 1, max_new_tokens, b));
  }
  std::vector<int64_t> out;
  for (const auto& s : seqs) out.insert(out.end(), s.begin(), s.end());
  return ops::copy_to(from_vector(out, Shape{B, idx.size(1) + max_new_tokens}), idx.device());
}

int64_t GPT::num_parameters(bool non_embedding) const {
  int64_t n = 0;
  for (const Tensor& p : parameters()) n += p.numel();
  if (non_embedding) n -= parameter("transformer.wpe.weight").numel();
  return n;
}

// ---------------------------------------------------------------- checkpoints

nn::TensorDict GPT::state_dict() const { return state_dict_of(nn::state_dict(*this)); }

nn::TensorDict GPT::state_dict_of(nn::TensorDict parameters) {
  const auto wte = parameters.find("transformer.wte.weight");
  MG_CHECK(wte != parameters.end(), "GPT::state_dict_of: the parameters have no 'transformer.wte.weight'");
  parameters.emplace("lm_head.weight", wte->second);
  return parameters;
}

namespace {

const char* kHead = "lm_head.weight";
const char* kWte = "transformer.wte.weight";

}  // namespace

void GPT::check_state_dict(const nn::TensorDict& tensors, const std::string& source) const {
  nn::TensorDict rest = tensors;
  const auto head = rest.find(kHead);
  MG_CHECK(head != rest.end(),
           "GPT::load_state_dict: {} has no '{}' (the head, tied to '{}': nanoGPT's state_dict "
           "names it too)", source, kHead, kWte);
  const Tensor head_weight = head->second;
  rest.erase(head);
  nn::check_state_dict(*this, rest, source);
  const Tensor& wte = rest.at(kWte);
  MG_CHECK(head_weight.defined() && head_weight.shape() == wte.shape() &&
               head_weight.dtype() == wte.dtype() &&
               ops::to_dtype(ops::copy_to(head_weight, Device::cpu()), DType::Float32).to_vector<float>() ==
                   ops::to_dtype(ops::copy_to(wte, Device::cpu()), DType::Float32).to_vector<float>(),
           "GPT::load_state_dict: in {}, '{}' differs from '{}'; this GPT ties its head to the "
           "token embedding, so they must be the same tensor", source, kHead, kWte);
}

void GPT::load_state_dict(const nn::TensorDict& tensors, const std::string& source) {
  check_state_dict(tensors, source);
  nn::TensorDict rest = tensors;
  rest.erase(kHead);
  nn::load_state_dict(*this, rest, source);
}

}  // namespace mg::models
