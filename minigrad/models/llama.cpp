#include <minigrad/models/llama.h>

#include <cmath>

#include <minigrad/autograd/functions.h>
#include <minigrad/autograd/grad_mode.h>
#include <minigrad/core/ops.h>
#include <minigrad/models/sampling.h>
#include <minigrad/nn/init.h>

namespace mg::models {

void LlamaConfig::validate() const {
  MG_CHECK(vocab_size > 0 && hidden_size > 0 && intermediate_size > 0 && num_hidden_layers > 0 &&
               num_attention_heads > 0 && num_key_value_heads > 0 && max_position_embeddings > 0,
           "LlamaConfig: every size must be positive, got {}", str());
  MG_CHECK(hidden_size % num_attention_heads == 0 && head_dim() % 2 == 0,
           "LlamaConfig: hidden_size {} must divide into num_attention_heads {} heads of an even size (RoPE turns "
           "pairs of features), got {}", hidden_size, num_attention_heads, str());
  MG_CHECK(num_attention_heads % num_key_value_heads == 0,
           "LlamaConfig: num_key_value_heads {} must divide num_attention_heads {} (each kv head serves a group of "
           "query heads), got {}", num_key_value_heads, num_attention_heads, str());
  MG_CHECK(std::isfinite(rms_norm_eps) && rms_norm_eps >= 0.0 && std::isfinite(rope_theta) && rope_theta > 1.0,
           "LlamaConfig: rms_norm_eps must be >= 0 and rope_theta > 1, got {}", str());
}

std::string LlamaConfig::str() const {
  return fmt::format("num_hidden_layers={}, num_attention_heads={}, num_key_value_heads={}, hidden_size={}, "
                     "intermediate_size={}, vocab_size={}, max_position_embeddings={}, rms_norm_eps={}, rope_theta={}",
                     num_hidden_layers, num_attention_heads, num_key_value_heads, hidden_size, intermediate_size,
                     vocab_size, max_position_embeddings, rms_norm_eps, rope_theta);
}

// ---------------------------------------------------------------- RoPE's tables

RotaryEmbedding::RotaryEmbedding(int64_t head_dim, double theta)
    : nn::Cloneable<RotaryEmbedding>("LlamaRotaryEmbedding"), head_dim_(head_dim), theta_(theta) {}

Tensor RotaryEmbedding::forward(const Tensor& positions) {
  MG_CHECK(positions.dim() == 1 && positions.dtype() == DType::Int64,
           "LlamaRotaryEmbedding: expected positions int64 [T], got {} ({})", positions.shape(), positions.dtype());
  const std::vector<int64_t> pos = ops::copy_to(positions, Device::cpu()).to_vector<int64_t>();
  const int64_t half = head_dim_ / 2;
  std::vector<double> table;
  table.reserve(pos.size() * static_cast<size_t>(head_dim_));
  for (const int64_t t : pos) {
    // Angle t w_i, w_i = theta^(-2i/d): pair i turns once every 2 pi / w_i positions.
    for (int64_t i = 0; i < half; ++i)
      table.push_back(std::cos(static_cast<double>(t) * std::pow(theta_, -2.0 * i / static_cast<double>(head_dim_))));
    for (int64_t i = 0; i < half; ++i)
      table.push_back(std::sin(static_cast<double>(t) * std::pow(theta_, -2.0 * i / static_cast<double>(head_dim_))));
  }
  return from_vector(table, Shape{static_cast<int64_t>(pos.size()), head_dim_});
}

std::string RotaryEmbedding::extra_repr() const { return fmt::format("head_dim={}, theta={}", head_dim_, theta_); }

// ---------------------------------------------------------------- attention

LlamaAttention::LlamaAttention(const LlamaConfig& c)
    : nn::Cloneable<LlamaAttention>("LlamaAttention"), head_dim_(c.head_dim()) {
  const int64_t C = c.hidden_size, d = c.head_dim();
  register_module("q_proj", std::make_shared<nn::Linear>(C, c.num_attention_heads * d, false));
  register_module("k_proj", std::make_shared<nn::Linear>(C, c.num_key_value_heads * d, false));
  register_module("v_proj", std::make_shared<nn::Linear>(C, c.num_key_value_heads * d, false));
  register_module("o_proj", std::make_shared<nn::Linear>(c.num_attention_heads * d, C, false));
  register_module("rotary_emb", std::make_shared<RotaryEmbedding>(d, c.rope_theta));
}

Tensor LlamaAttention::forward(const Tensor& x) { return attend(x, Tensor()); }

Tensor LlamaAttention::forward_args(const nn::TensorList& inputs) {
  MG_CHECK(inputs.size() == 2, "LlamaAttention: forward takes x or {{x, positions}}, got {} inputs", inputs.size());
  return attend(inputs[0], inputs[1]);
}

Tensor LlamaAttention::attend(const Tensor& x, const Tensor& given_positions) {
  MG_CHECK(x.dim() == 3, "LlamaAttention: expected input [B, T, C], got {}", x.shape());
  // The projections' widths say how many heads this module holds (all, or a tensor-parallel
  // rank's); T is theirs too (with sequence parallelism x holds a rank's positions, q all).
  const Tensor q = (*child("q_proj"))(x), k = (*child("k_proj"))(x), v = (*child("v_proj"))(x);
  const int64_t B = q.size(0), T = q.size(1), d = head_dim_, heads = q.size(2) / d, kv_heads = k.size(2) / d;
  MG_CHECK(q.size(2) % d == 0 && k.size(2) % d == 0 && kv_heads > 0 && heads % kv_heads == 0,
           "LlamaAttention: q_proj gives {} and k_proj {} features: not whole heads of {} with the kv heads dividing "
           "the query heads", q.size(2), k.size(2), d);
  // RoPE at the given positions, or at 0 .. T-1 (after the cached ones); a plan's hook on
  // rotary_emb may give others (context parallelism's). In q's dtype on q's device.
  const int64_t offset = cache_on_ ? cache_length_ : 0;
  MG_CHECK(offset == 0 || T == 1, "LlamaAttention: with a KV cache of {} positions, forward takes one new token "
           "at a time, got {}", offset, T);
  Tensor positions = given_positions;
  if (!positions.defined()) {
    std::vector<int64_t> at(static_cast<size_t>(T));
    for (int64_t t = 0; t < T; ++t) at[static_cast<size_t>(t)] = offset + t;
    positions = from_vector(at, Shape{T});
  }
  MG_CHECK(positions.dim() == 1 && positions.size(0) == T, "LlamaAttention: positions {} for {} tokens",
           positions.shape(), T);
  const Tensor table = (*child("rotary_emb"))(positions);
  const auto half = [&](int64_t start) {
    return ops::copy_to(ops::to_dtype(contiguous(narrow(table, 1, start, d / 2)), q.dtype()), q.device());
  };
  const Tensor cos = half(0), sin = half(d / 2);
  // [B, T, heads, d] turned, then [B, heads, T, d]: each head attends over the T positions.
  const Tensor qh = transpose(rotary_embedding(reshape(q, {B, T, heads, d}), cos, sin), 1, 2);
  Tensor kh = transpose(rotary_embedding(reshape(k, {B, T, kv_heads, d}), cos, sin), 1, 2);
  Tensor vh = transpose(reshape(v, {B, T, kv_heads, d}), 1, 2);
  if (cache_on_) {  // the cached positions' k and v, then this forward's
    MG_CHECK(!GradMode::is_enabled(), "LlamaAttention: the KV cache is for generation, under NoGradGuard");
    if (offset > 0) {
      kh = cat({k_cache_, kh}, 2);
      vh = cat({v_cache_, vh}, 2);
    }
    k_cache_ = kh;
    v_cache_ = vh;
    cache_length_ = kh.size(2);
  }
  const int64_t S = kh.size(2);
  // Grouped-query attention: kv head j serves query heads j g .. j g + g - 1 (HF's repeat_kv);
  // backward sums the group's gradients into it.
  const int64_t g = heads / kv_heads;
  if (g > 1) {
    const auto repeat = [&](const Tensor& t) {
      return reshape(expand(reshape(t, {B, kv_heads, 1, S, d}), {B, kv_heads, g, S, d}), {B, heads, S, d});
    };
    kh = repeat(kh);
    vh = repeat(vh);
  }
  // A token after the cache sees every cached position: no mask (the causal mask of a [1, S]
  // score row would be torch's tril, aligned at the top-left: only position 0).
  const Tensor y = attention_ ? attention_(qh, kh, vh, 0.0)
                              : scaled_dot_product_attention(qh, kh, vh, /*is_causal=*/offset == 0);
  return (*child("o_proj"))(reshape(contiguous(transpose(y, 1, 2)), {B, T, heads * d}));
}

void LlamaAttention::set_kv_cache(bool on) {
  cache_on_ = on;
  cache_length_ = 0;
  k_cache_ = v_cache_ = Tensor();
}

// ---------------------------------------------------------------- MLP, block

LlamaMLP::LlamaMLP(const LlamaConfig& c) : nn::Cloneable<LlamaMLP>("LlamaMLP") {
  register_module("gate_proj", std::make_shared<nn::Linear>(c.hidden_size, c.intermediate_size, false));
  register_module("up_proj", std::make_shared<nn::Linear>(c.hidden_size, c.intermediate_size, false));
  register_module("down_proj", std::make_shared<nn::Linear>(c.intermediate_size, c.hidden_size, false));
  register_module("act_fn", std::make_shared<nn::SiLU>());
}

Tensor LlamaMLP::forward(const Tensor& x) {
  // The gate, through SiLU, scales the up projection feature by feature (SwiGLU).
  const Tensor gate = (*child("act_fn"))((*child("gate_proj"))(x));
  return (*child("down_proj"))(gate * (*child("up_proj"))(x));
}

LlamaDecoderLayer::LlamaDecoderLayer(const LlamaConfig& c) : nn::Cloneable<LlamaDecoderLayer>("LlamaDecoderLayer") {
  register_module("self_attn", std::make_shared<LlamaAttention>(c));
  register_module("mlp", std::make_shared<LlamaMLP>(c));
  register_module("input_layernorm", std::make_shared<nn::RMSNorm>(c.hidden_size, c.rms_norm_eps));
  register_module("post_attention_layernorm", std::make_shared<nn::RMSNorm>(c.hidden_size, c.rms_norm_eps));
}

Tensor LlamaDecoderLayer::forward(const Tensor& x) { return forward_args({x}); }

Tensor LlamaDecoderLayer::forward_args(const nn::TensorList& inputs) {
  MG_CHECK(inputs.size() == 1 || inputs.size() == 2, "LlamaDecoderLayer: forward takes x or {{x, positions}}, got "
           "{} inputs", inputs.size());
  const Tensor& x = inputs[0];
  nn::TensorList attention_inputs{(*child("input_layernorm"))(x)};
  if (inputs.size() == 2) attention_inputs.push_back(inputs[1]);
  const Tensor h = x + (*child("self_attn"))(attention_inputs);
  return h + (*child("mlp"))((*child("post_attention_layernorm"))(h));
}

// ---------------------------------------------------------------- the model

LlamaModel::LlamaModel(const LlamaConfig& c)
    : nn::Cloneable<LlamaModel>("LlamaModel"), max_positions_(c.max_position_embeddings) {
  register_module("embed_tokens", std::make_shared<nn::Embedding>(c.vocab_size, c.hidden_size));
  auto layers = std::make_shared<nn::Sequential>();  // ModuleList: layers.0, layers.1, ...
  for (int64_t i = 0; i < c.num_hidden_layers; ++i) layers->push_back(std::make_shared<LlamaDecoderLayer>(c));
  register_module("layers", layers);
  register_module("norm", std::make_shared<nn::RMSNorm>(c.hidden_size, c.rms_norm_eps));
}

Tensor LlamaModel::forward(const Tensor& input) { return forward_args({input}); }

Tensor LlamaModel::forward_args(const nn::TensorList& inputs) {
  MG_CHECK(inputs.size() == 1 || inputs.size() == 2, "Llama: forward takes idx or {{idx, position_ids}}, got {} "
           "inputs", inputs.size());
  const Tensor& input = inputs[0];
  Tensor x = input;
  if (inputs.size() == 2) {  // HF's position_ids, shared by the batch
    const Tensor& positions = inputs[1];
    MG_CHECK(positions.dim() == 1 && positions.dtype() == DType::Int64 && positions.size(0) == input.size(1),
             "Llama: expected position_ids int64 [{}] for {} tokens, got {} ({})", input.size(1), input.size(1),
             positions.shape(), positions.dtype());
    for (const int64_t p : ops::copy_to(positions, Device::cpu()).to_vector<int64_t>())
      MG_CHECK(p >= 0 && p < max_positions_, "Llama: position {} is outside [0, max_position_embeddings {})", p,
               max_positions_);
  }
  if (has_child("embed_tokens")) {
    MG_CHECK(input.dim() == 2 && input.dtype() == DType::Int64,
             "Llama: expected token indices int64 [B, T], got {} ({})", input.shape(), input.dtype());
    MG_CHECK(input.size(1) <= max_positions_, "Llama: cannot forward a sequence of length {}, "
             "max_position_embeddings is only {}", input.size(1), max_positions_);
    x = (*child("embed_tokens"))(input);  // [B, T, C]: positions enter through RoPE, in attention
  }
  if (inputs.size() == 1) {
    x = (*child("layers"))(x);
  } else {  // each layer given the positions too
    for (const nn::ModulePtr& layer : child("layers")->children()) x = (*layer)({x, inputs[1]});
  }
  return has_child("norm") ? (*child("norm"))(x) : x;
}

Llama::Llama(LlamaConfig config) : nn::Cloneable<Llama>("LlamaForCausalLM"), config_(config) {
  config_.validate();
  register_module("model", std::make_shared<LlamaModel>(config_));
  register_module("lm_head", std::make_shared<nn::Linear>(config_.hidden_size, config_.vocab_size, false));
  // HF's _init_weights (initializer_range 0.02); the norms keep their ones.
  for (auto& [name, p] : named_parameters())
    if (name.find("layernorm") == std::string::npos && name.find("norm.weight") == std::string::npos) {
      Tensor t = p;
      nn::init::normal_(t, 0.0, 0.02);
    }
}

Tensor Llama::forward(const Tensor& idx) { return forward_args({idx}); }

Tensor Llama::forward_args(const nn::TensorList& inputs) {
  const Tensor x = (*child("model"))(inputs);
  return has_child("lm_head") ? (*child("lm_head"))(x) : x;
}

Tensor Llama::loss(const Tensor& logits, const Tensor& targets, Reduction reduction) {
  MG_CHECK(logits.dim() == 3 && targets.dim() == 2 && targets.size(0) == logits.size(0) &&
               targets.size(1) == logits.size(1),
           "Llama::loss: expected logits [B, T, V] and targets [B, T], got {} and {}", logits.shape(), targets.shape());
  const int64_t rows = logits.size(0) * logits.size(1);
  return cross_entropy(reshape(logits, {rows, logits.size(2)}), reshape(targets, {rows}),
                       CrossEntropyOptions().ignore_index(-1).reduction(reduction));
}

Tensor Llama::generate(const Tensor& idx, int64_t max_new_tokens, double temperature, int64_t top_k,
                       Generator* generator, bool use_cache) {
  check_generate_arguments("Llama::generate", idx, max_new_tokens, temperature, top_k);
  const int64_t B = idx.size(0), T0 = idx.size(1), V = config_.vocab_size, limit = config_.max_position_embeddings;
  MG_CHECK(!use_cache || T0 + max_new_tokens <= limit,
           "Llama::generate: with the KV cache the prompt ({}) and the new tokens ({}) must fit "
           "max_position_embeddings {} (without it, the context is cropped to its last {} tokens)",
           T0, max_new_tokens, limit, limit);
  if (B == 0) return empty(Shape{0, T0 + max_new_tokens}, DType::Int64, idx.device());
  NoGradGuard no_grad;
  Generator& gen = generator != nullptr ? *generator : default_generator();
  std::vector<std::shared_ptr<LlamaAttention>> attentions;
  for (const nn::ModulePtr& layer : child("model")->child("layers")->children())
    attentions.push_back(std::dynamic_pointer_cast<LlamaAttention>(layer->child("self_attn")));
  // The caches on for this call only, and emptied whatever happens.
  struct Caches {
    std::vector<std::shared_ptr<LlamaAttention>>& all;
    Caches(std::vector<std::shared_ptr<LlamaAttention>>& a, bool on) : all(a) {
      for (auto& x : all) x->set_kv_cache(on);
    }
    ~Caches() {
      for (auto& x : all) x->set_kv_cache(false);
    }
  } caches(attentions, use_cache);
  std::vector<int64_t> tokens = idx.to_vector<int64_t>();  // [B, len] row-major, len growing
  int64_t len = T0;
  std::vector<int64_t> fresh;  // the tokens drawn last step, one per sequence
  for (int64_t n = 0; n < max_new_tokens; ++n) {
    Tensor input;
    if (use_cache && n > 0) {
      input = from_vector(fresh, Shape{B, 1});  // the cache holds everything before
    } else {
      const int64_t T = std::min(len, limit);  // prefill, or the uncached context
      std::vector<int64_t> context;
      for (int64_t b = 0; b < B; ++b)
        context.insert(context.end(), tokens.begin() + b * len + (len - T), tokens.begin() + (b + 1) * len);
      input = from_vector(context, Shape{B, T});
    }
    const std::vector<double> last = last_logits(forward(ops::copy_to(input, idx.device())));
    fresh.clear();
    for (int64_t b = 0; b < B; ++b)
      fresh.push_back(sample_token(last.data() + b * V, V, temperature, top_k, gen, "Llama::generate", n + 1,
                                   max_new_tokens, b));
    std::vector<int64_t> grown;
    for (int64_t b = 0; b < B; ++b) {
      grown.insert(grown.end(), tokens.begin() + b * len, tokens.begin() + (b + 1) * len);
      grown.push_back(fresh[static_cast<size_t>(b)]);
    }
    tokens.swap(grown);
    ++len;
  }
  return ops::copy_to(from_vector(tokens, Shape{B, len}), idx.device());
}

int64_t Llama::num_parameters() const {
  int64_t n = 0;
  for (const Tensor& p : parameters()) n += p.numel();
  return n;
}

}  // namespace mg::models
