// models::Llama against an independent PyTorch Llama (HF's LlamaForCausalLM written out:
// tests/models/reference/llama_reference.py) from the same initial weights: logits, loss,
// every gradient and the parameters after 3 AdamW steps, for num_key_value_heads 1, 2 and
// n_heads; in float64 to rounding, and in float32 from the same weights rounded, within a
// bound derived below. And the model's names, shapes, hooks, pass-through and errors.
#include "catch_compat.h"

#include <algorithm>
#include <cmath>
#include <set>
#include <string>
#include <vector>

#include <minigrad/minigrad.h>
#include <minigrad/core/ops.h>
#include <minigrad/models/llama.h>

namespace nn = mg::nn;
namespace optim = mg::optim;
using mg::DType;
using mg::Shape;
using mg::Tensor;
using mg::models::Llama;
using mg::models::LlamaConfig;

namespace {

// The reference's CONFIG (llama_reference.py).
LlamaConfig reference_config(int64_t kv_heads) {
  LlamaConfig c;
  c.vocab_size = 13;
  c.hidden_size = 16;
  c.intermediate_size = 40;
  c.num_hidden_layers = 2;
  c.num_attention_heads = 4;
  c.num_key_value_heads = kv_heads;
  c.max_position_embeddings = 16;
  c.rms_norm_eps = 1e-5;
  c.rope_theta = 10000.0;
  return c;
}

std::vector<double> values(const Tensor& t) { return mg::ops::to_dtype(t, DType::Float64).to_vector<double>(); }

// Largest |a - b| over the largest |b|: an error relative to the tensor's scale.
double scaled_error(const Tensor& got, const Tensor& want) {
  const std::vector<double> a = values(got), b = values(want);
  REQUIRE(a.size() == b.size());
  double worst = 0, scale = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    worst = std::max(worst, std::fabs(a[i] - b[i]));
    scale = std::max(scale, std::fabs(b[i]));
  }
  return worst / std::max(scale, 1e-300);
}

double max_abs_diff(const Tensor& got, const Tensor& want) {
  const std::vector<double> a = values(got), b = values(want);
  REQUIRE(a.size() == b.size());
  double worst = 0;
  for (size_t i = 0; i < a.size(); ++i) worst = std::max(worst, std::fabs(a[i] - b[i]));
  return worst;
}

struct Tolerances {
  double logits, loss, grad;
  bool per_element_steps;  // float32: each parameter's bound from its gradient (below); else `after`
  double after;
};

// AdamW moves an element by lr m / (sqrt(v) + eps) a step: a gradient error delta on a
// gradient g changes that by about delta / |g| of a step, never more than the whole step (lr
// in either direction: 2 lr). Over 3 steps, with delta = 2 x the gradients' bound of their
// scale (the gradient moves a little between steps), and the parameter's own rounding u |w|
// per step: |after - want| <= 3 (2 lr min(1, delta / |g|) + u |w|).
void check_steps(const Tensor& got, const Tensor& want, const Tensor& grad, double grad_tolerance) {
  const std::vector<double> a = values(got), b = values(want), g = values(grad);
  double scale = 0;
  for (double x : g) scale = std::max(scale, std::fabs(x));
  const double lr = 1e-2, u = std::ldexp(1.0, -24), delta = 2 * grad_tolerance * scale;
  for (size_t i = 0; i < a.size(); ++i) {
    const double bound = 3 * (2 * lr * std::min(1.0, delta / std::fabs(g[i])) + u * std::fabs(b[i]));
    if (std::fabs(a[i] - b[i]) > bound) {
      INFO("element " << i << ": " << a[i] << " against " << b[i] << ", bound " << bound);
      CHECK(std::fabs(a[i] - b[i]) <= bound);
    }
  }
}

// One run of the reference's 3 steps in `dtype`, every number compared.
void check_against_reference(int64_t kv_heads, DType dtype, const Tolerances& tol) {
  const std::string path = std::string(MINIGRAD_SOURCE_DIR) + "/tests/models/reference/llama_reference.safetensors";
  const nn::Checkpoint ref = nn::load_tensors(path);
  const std::string prefix = "kv" + std::to_string(kv_heads) + ".";
  Llama model(reference_config(kv_heads));
  model.to(dtype);
  nn::TensorDict init = ref.get(prefix + "init.");
  for (auto& [name, t] : init) t = mg::ops::to_dtype(t, dtype);
  nn::load_state_dict(model, init, path);  // every name and shape, as strict=True
  const Tensor idx = ref.tensors.at("idx"), targets = ref.tensors.at("targets");
  const std::vector<double> losses = ref.tensors.at(prefix + "losses").to_vector<double>();
  optim::AdamW opt(optim::weight_decay_groups(model.parameters(),
                                              optim::AdamWOptions(1e-2).betas({0.9, 0.95}).eps(1e-8).weight_decay(0.1)));
  for (int step = 0; step < 3; ++step) {
    INFO("step " << step);
    opt.zero_grad();
    const Tensor logits = model(idx);
    Tensor loss = Llama::loss(logits, targets);
    loss.backward();
    CHECK(std::fabs(values(loss)[0] - losses[static_cast<size_t>(step)]) <= tol.loss);
    if (step == 0) {
      CHECK(scaled_error(logits, ref.tensors.at(prefix + "logits")) <= tol.logits);
      for (const auto& [name, p] : model.named_parameters()) {
        INFO(name);
        REQUIRE(p.grad().defined());
        CHECK(scaled_error(p.grad(), ref.tensors.at(prefix + "grad." + name)) <= tol.grad);
      }
    }
    opt.step();
  }
  {
    mg::NoGradGuard no_grad;
    CHECK(std::fabs(values(Llama::loss(model(idx), targets))[0] - losses[3]) <= tol.loss);
  }
  for (const auto& [name, p] : model.named_parameters()) {
    INFO(name);
    if (tol.per_element_steps)
      check_steps(p, ref.tensors.at(prefix + "after." + name), ref.tensors.at(prefix + "grad." + name), tol.grad);
    else
      CHECK(max_abs_diff(p, ref.tensors.at(prefix + "after." + name)) <= tol.after);
  }
}

}  // namespace

TEST_CASE("Llama: HF's LlamaForCausalLM parameter names and shapes with no biases and the head untied", "[llama]") {
  const std::string path = std::string(MINIGRAD_SOURCE_DIR) + "/tests/models/reference/llama_reference.safetensors";
  const nn::Checkpoint ref = nn::load_tensors(path);
  for (int64_t kv : {1, 2, 4}) {
    Llama model(reference_config(kv));
    const nn::TensorDict init = ref.get("kv" + std::to_string(kv) + ".init.");
    std::set<std::string> names;
    for (const auto& [name, p] : model.named_parameters()) {
      names.insert(name);
      REQUIRE(init.count(name) == 1);
      CHECK(p.shape() == init.at(name).shape());
    }
    CHECK(names.size() == init.size());  // strict=True: nothing missing, nothing unexpected
    CHECK(nn::state_dict(model).size() == init.size());  // no buffers: RoPE's tables are computed
  }
  Llama model(reference_config(2));
  CHECK(model.parameter("model.layers.1.self_attn.k_proj.weight").shape() == Shape{8, 16});  // 2 kv heads of 4
  CHECK(model.parameter("model.layers.0.mlp.gate_proj.weight").shape() == Shape{40, 16});
  CHECK(!model.parameter("lm_head.weight").is_same(model.parameter("model.embed_tokens.weight")));
  CHECK(model.num_parameters() == 13 * 16 * 2 + 2 * (16 * 16 * 2 + 8 * 16 * 2 + 3 * 40 * 16 + 2 * 16) + 16);
}

// float64 on both sides, sums in other orders: logits and gradients agree to about 1e-15 of
// their scale; 1e-11 leaves room for the few hundred operations of the 2-layer graph. AdamW
// then divides each gradient by its own running magnitude, so a parameter's step is as
// precise as its gradient relative to itself (all gradients here are far from 0):
// 1e-12 absolute after 3 steps of lr 1e-2.
TEST_CASE("Llama: equals the PyTorch Llama in float64 for num_key_value_heads 1 2 and n_heads", "[llama][reference]") {
  for (int64_t kv : {1, 2, 4}) {
    INFO("num_key_value_heads " << kv);
    mg::FusedAttentionGuard fused(true);
    check_against_reference(kv, DType::Float64, {1e-11, 1e-12, 1e-11, false, 1e-12});
  }
  mg::FusedAttentionGuard composed(false);
  check_against_reference(2, DType::Float64, {1e-11, 1e-12, 1e-11, false, 1e-12});
}

// float32 from the float64 weights rounded (u = 2^-24 = 6e-8): a logit is a chain of about
// 30 ops deep (2 blocks of norm, 3 GEMMs of up to 40 terms, RoPE, softmax), each adding a
// few u of relative error, and the RMSNorms keep the activations near 1: 100 u = 6e-6 of the
// logits' scale bounds it. The loss is a mean of log-softmaxes of those logits (|d loss /
// d logit| <= 1): 6e-6 absolute. A gradient runs the graph twice: 200 u = 1.2e-5 of its
// scale. The parameters after 3 AdamW steps: check_steps' bound, element by element.
TEST_CASE("Llama: float32 follows the float64 PyTorch Llama within float32's bound", "[llama][reference]") {
  for (int64_t kv : {1, 2, 4}) {
    INFO("num_key_value_heads " << kv);
    check_against_reference(kv, DType::Float32, {6e-6, 6e-6, 1.2e-5, true, 0.0});
  }
}


TEST_CASE("Llama: the config's errors and a sequence longer than max_position_embeddings", "[llama]") {
  LlamaConfig c = reference_config(3);
  REQUIRE_THROWS_WITH(Llama(c), MG_CONTAINS("num_key_value_heads 3") && MG_CONTAINS("num_attention_heads 4"));
  c = reference_config(2);
  c.hidden_size = 12;  // 4 heads of 3: RoPE needs pairs
  REQUIRE_THROWS_WITH(Llama(c), MG_CONTAINS("hidden_size 12") && MG_CONTAINS("even"));
  Llama model(reference_config(2));
  REQUIRE_THROWS_WITH(model(mg::zeros(Shape{1, 17}, DType::Int64)),
                      MG_CONTAINS("length 17") && MG_CONTAINS("max_position_embeddings is only 16"));
  REQUIRE_THROWS_WITH(model(mg::zeros(Shape{1, 4, 16})), MG_CONTAINS("Llama") && MG_CONTAINS("int64 [B, T]"));
}

TEST_CASE("Llama: hooks fire inside the blocks and absent children pass through", "[llama]") {
  mg::manual_seed(3);
  auto model = std::make_shared<Llama>(reference_config(2));
  const Tensor idx = mg::randint(0, 13, Shape{2, 5});
  const Tensor logits = (*model)(idx);
  CHECK(logits.shape() == Shape{2, 5, 13});
  // The rotary tables' positions come through the module's call: a hook sees them.
  std::vector<int64_t> seen;
  model->child("model")->child("layers")->child("1")->child("self_attn")->child("rotary_emb")->register_forward_pre_hook(
      [&](nn::Module&, const Tensor& positions) {
        seen = positions.to_vector<int64_t>();
        return Tensor();
      });
  (*model)(idx);
  CHECK(seen == std::vector<int64_t>{0, 1, 2, 3, 4});
  // A pipeline's two halves: the first without norm and lm_head gives activations, the second
  // without embed_tokens takes them; together they are the whole model.
  auto first = std::static_pointer_cast<Llama>(model->clone());
  auto second = std::static_pointer_cast<Llama>(model->clone());
  first->remove_child("model.norm");
  first->remove_child("lm_head");
  first->child("model")->child("layers")->remove_child("1");
  second->remove_child("model.embed_tokens");
  second->child("model")->child("layers")->remove_child("0");
  const Tensor h = (*first)(idx);
  CHECK(h.shape() == Shape{2, 5, 16});
  const std::vector<float> a = (*second)(h).to_vector<float>(), b = logits.to_vector<float>();
  REQUIRE(a.size() == b.size());
  for (size_t i = 0; i < a.size(); ++i) CHECK(a[i] == b[i]);
}

TEST_CASE("Llama::generate: the KV cache gives the uncached tokens greedy and sampled in float64 and float32",
          "[llama][generate]") {
  for (DType dtype : {DType::Float64, DType::Float32}) {
    INFO(mg::dtype_name(dtype));
    mg::manual_seed(5);
    Llama model(reference_config(2));
    model.to(dtype);
    const Tensor prompt = mg::randint(0, 13, Shape{2, 3});
    for (const auto& [temperature, top_k] : {std::pair<double, int64_t>{0.0, 0}, {1.0, 0}, {0.8, 5}}) {
      INFO("temperature " << temperature << ", top_k " << top_k);
      mg::Generator g1(11), g2(11);
      const Tensor cached = model.generate(prompt, 13, temperature, top_k, &g1, /*use_cache=*/true);
      const Tensor uncached = model.generate(prompt, 13, temperature, top_k, &g2, /*use_cache=*/false);
      REQUIRE(cached.shape() == Shape{2, 16});
      CHECK(cached.to_vector<int64_t>() == uncached.to_vector<int64_t>());
      const std::vector<int64_t> got = cached.to_vector<int64_t>(), given = prompt.to_vector<int64_t>();
      for (int64_t b = 0; b < 2; ++b)
        for (int64_t t = 0; t < 3; ++t) CHECK(got[static_cast<size_t>(b * 16 + t)] == given[static_cast<size_t>(b * 3 + t)]);
    }
  }
  // Each attention's cache is off and empty again after generate, whatever it did.
  Llama model(reference_config(1));
  const Tensor prompt = mg::zeros(Shape{1, 4}, DType::Int64);
  model.generate(prompt, 2);
  auto attention = std::dynamic_pointer_cast<mg::models::LlamaAttention>(
      model.child("model")->child("layers")->child("0")->child("self_attn"));
  REQUIRE(attention != nullptr);
  CHECK(attention->kv_cache_length() == 0);
  // Without the cache the context slides past max_position_embeddings; with it, that is an error.
  CHECK(model.generate(prompt, 14, 0.0, 0, nullptr, false).shape() == Shape{1, 18});
  REQUIRE_THROWS_WITH(model.generate(prompt, 13), MG_CONTAINS("Llama::generate") && MG_CONTAINS("(4)") &&
                                                      MG_CONTAINS("(13)") && MG_CONTAINS("max_position_embeddings 16"));
  REQUIRE_THROWS_WITH(model.generate(prompt, 1, -1.0), MG_CONTAINS("Llama::generate: temperature must be >= 0"));
  // The cache's contract: one new token at a time after the prompt, and no gradients.
  attention->set_kv_cache(true);
  {
    mg::NoGradGuard no_grad;
    (*attention)(mg::randn(Shape{1, 3, 16}));
    CHECK(attention->kv_cache_length() == 3);
    REQUIRE_THROWS_WITH((*attention)(mg::randn(Shape{1, 2, 16})), MG_CONTAINS("one new token at a time, got 2"));
  }
  attention->set_kv_cache(true);
  REQUIRE_THROWS_WITH((*attention)(mg::randn(Shape{1, 3, 16})), MG_CONTAINS("under NoGradGuard"));
  attention->set_kv_cache(false);
}

TEST_CASE("Llama({idx, position_ids}): positions 0..T-1 are forward(idx), shifted ones give the same logits "
          "(RoPE depends on differences), others differ, checkpointed layers give the same gradients",
          "[llama][positions]") {
  mg::manual_seed(3);
  Llama model(reference_config(2));
  model.to(DType::Float64);
  const Tensor idx = mg::randint(0, 13, Shape{2, 6});
  const auto positions = [](std::vector<int64_t> p) { return mg::from_vector(p, Shape{static_cast<int64_t>(p.size())}); };
  const std::vector<double> plain = model(idx).to_vector<double>();
  CHECK(model({idx, positions({0, 1, 2, 3, 4, 5})}).to_vector<double>() == plain);
  // q_i . k_j after RoPE depends on i - j alone: a shift by 7 moves each logit by rounding only
  // (float64: a few ulps of the angles' cos and sin, 1e-12 is a thousand times that).
  const std::vector<double> shifted = model({idx, positions({7, 8, 9, 10, 11, 12})}).to_vector<double>();
  double worst = 0;
  for (size_t i = 0; i < plain.size(); ++i) worst = std::max(worst, std::fabs(shifted[i] - plain[i]));
  CHECK(worst < 1e-12);
  // A gap before the last token changes what it attends with; the first five are causal and unmoved.
  const std::vector<double> gap = model({idx, positions({0, 1, 2, 3, 4, 9})}).to_vector<double>();
  double last = 0, first = 0;
  for (int64_t b = 0; b < 2; ++b)
    for (int64_t t = 0; t < 6; ++t)
      for (int64_t v = 0; v < 13; ++v) {
        const size_t i = static_cast<size_t>((b * 6 + t) * 13 + v);
        (t == 5 ? last : first) = std::max(t == 5 ? last : first, std::fabs(gap[i] - plain[i]));
      }
  CHECK(first == 0.0);
  CHECK(last > 1e-6);
  // Gradients through positions given, plain and with every layer checkpointed.
  std::vector<std::vector<double>> grads[2];
  for (int checkpointed = 0; checkpointed < 2; ++checkpointed) {
    mg::models::set_layer_checkpointing(model, checkpointed == 1);
    model.zero_grad();
    Llama::loss(model({idx, positions({3, 4, 5, 6, 7, 8})}), idx).backward();
    for (const Tensor& p : model.parameters()) grads[checkpointed].push_back(p.grad().to_vector<double>());
  }
  mg::models::set_layer_checkpointing(model, false);
  CHECK(grads[1] == grads[0]);
  // What it refuses, naming the shapes and the limit.
  REQUIRE_THROWS_WITH(model({idx, positions({0, 1, 2})}), MG_CONTAINS("Llama: expected position_ids int64 [6] for 6 "
                                                                      "tokens, got [3]"));
  REQUIRE_THROWS_WITH(model({idx, positions({0, 1, 2, 3, 4, 16})}),
                      MG_CONTAINS("Llama: position 16 is outside [0, max_position_embeddings 16)"));
  REQUIRE_THROWS_WITH(model({idx, positions({0, 1, 2, 3, 4, 5}), idx}),
                      MG_CONTAINS("Llama: forward takes idx or {idx, position_ids}, got 3 inputs"));
}
