// models::GPT: nanoGPT's names and initialisation; the loss at initialisation is about
// ln(vocab); it overfits one batch; a 2-layer GPT's logits, loss, every gradient, and the
// weights after 3 AdamW steps (nanoGPT's parameter groups) equal PyTorch's from the same
// initial weights (tests/models/reference/gpt_reference.py), through the fused attention
// and through the composed one; checkpoints with nanoGPT's keys; generate.
#include "catch_compat.h"

#include <algorithm>
#include <cmath>
#include <memory>
#include <string>
#include <vector>

#include <fmt/format.h>

#include <minigrad/minigrad.h>

#include "temp_dir.h"

namespace nn = mg::nn;
namespace optim = mg::optim;
using mg::Shape;
using mg::Tensor;
using mg::models::GPT;
using mg::models::GPTConfig;

namespace {

GPTConfig small_config() {
  GPTConfig c;
  c.block_size = 16;
  c.vocab_size = 20;
  c.n_layer = 2;
  c.n_head = 2;
  c.n_embd = 32;
  return c;
}

Tensor random_tokens(int64_t b, int64_t t, int64_t vocab, uint64_t seed) {
  mg::manual_seed(seed);
  return mg::randint(0, vocab, Shape{b, t});
}

// Largest |a - b| over max(1, |b|): a relative error for large values, absolute near 0.
double max_error(const std::vector<float>& a, const std::vector<float>& b) {
  REQUIRE(a.size() == b.size());
  double worst = 0;
  for (size_t i = 0; i < a.size(); ++i)
    worst = std::max(worst, std::abs(static_cast<double>(a[i]) - b[i]) /
                                std::max(1.0, std::abs(static_cast<double>(b[i]))));
  return worst;
}

// The largest magnitude among `v`, to scale a tolerance.
double max_abs(const std::vector<float>& v) {
  double m = 0;
  for (float x : v) m = std::max(m, static_cast<double>(std::abs(x)));
  return m;
}

}  // namespace

TEST_CASE("GPT: nanoGPT's parameter names, the head tied to the token embedding") {
  GPT model(small_config());
  std::vector<std::string> names;
  for (const auto& [name, p] : model.named_parameters()) names.push_back(name);
  const std::vector<std::string> first = {
      "transformer.wte.weight",          "transformer.wpe.weight",
      "transformer.h.0.ln_1.weight",     "transformer.h.0.ln_1.bias",
      "transformer.h.0.attn.c_attn.weight", "transformer.h.0.attn.c_attn.bias",
      "transformer.h.0.attn.c_proj.weight", "transformer.h.0.attn.c_proj.bias",
      "transformer.h.0.ln_2.weight",     "transformer.h.0.ln_2.bias",
      "transformer.h.0.mlp.c_fc.weight", "transformer.h.0.mlp.c_fc.bias",
      "transformer.h.0.mlp.c_proj.weight", "transformer.h.0.mlp.c_proj.bias"};
  REQUIRE(names.size() == 2 + 12 * 2 + 2);
  CHECK(std::vector<std::string>(names.begin(), names.begin() + 14) == first);
  CHECK(names[names.size() - 2] == "transformer.ln_f.weight");
  CHECK(names.back() == "transformer.ln_f.bias");
  // The head (lm_head) holds wte's tensor: not a parameter of its own; state_dict names
  // it as torch's does.
  CHECK(model.parameter("lm_head.weight").is_same(model.parameter("transformer.wte.weight")));
  const nn::TensorDict state = model.state_dict();
  CHECK(state.size() == names.size() + 1);
  CHECK(state.at("lm_head.weight").is_same(state.at("transformer.wte.weight")));
  // nanoGPT's count: 12 n_layer n_embd^2 + biases + LayerNorms + wte (wpe left out).
  const int64_t C = 32, L = 2, V = 20;
  const int64_t per_block = 12 * C * C + 13 * C;
  CHECK(model.num_parameters() == L * per_block + V * C + 2 * C);
  CHECK(model.num_parameters(false) == model.num_parameters() + 16 * C);

  GPTConfig no_bias = small_config();
  no_bias.bias = false;
  CHECK(GPT(no_bias).named_parameters().size() == 2 + 6 * 2 + 1);
}

// What lets a plan and a pipeline cut work on the unchanged model: the children are
// called through operator() (hooks fire inside the blocks), absent children are passed
// through, and attention counts its heads from c_attn's output.
TEST_CASE("GPT: hooks fire inside the blocks, absent children pass through, heads read from c_attn") {
  GPTConfig config = small_config();
  config.n_layer = 3;
  mg::manual_seed(5);
  GPT model(config);
  const Tensor idx = random_tokens(2, 6, config.vocab_size, 9);
  const Tensor whole = model.forward(idx);
  int calls = 0;
  model.child("transformer")->child("h")->child("1")->child("mlp")->child("c_fc")->register_forward_hook(
      [&calls](nn::Module&, const Tensor&, const Tensor&) {
        ++calls;
        return Tensor();
      });
  model.forward(idx);
  CHECK(calls == 1);
  // Two "stages" of the same weights: the embedding and block 0; blocks 1, 2, ln_f, head.
  auto first = std::static_pointer_cast<GPT>(model.clone());
  auto second = std::static_pointer_cast<GPT>(model.clone());
  first->remove_child("lm_head");
  first->remove_child("transformer.ln_f");
  first->remove_child("transformer.h.1");
  first->remove_child("transformer.h.2");
  for (const char* name : {"transformer.wte", "transformer.wpe", "transformer.drop", "transformer.h.0"})
    second->remove_child(name);
  const Tensor activations = first->forward(idx);
  CHECK(activations.shape() == Shape{2, 6, 32});
  const std::vector<float> staged = second->forward(activations).to_vector<float>();
  CHECK(staged == whole.to_vector<float>());
  // Half of the heads: c_attn's q, k, v rows of head 0 (a tensor-parallel rank's share).
  auto attn = std::static_pointer_cast<mg::models::CausalSelfAttention>(
      model.child("transformer")->child("h")->child("0")->child("attn"));
  auto half = std::make_shared<nn::Linear>(32, 48, true);
  attn->replace_child("c_attn", half);
  attn->replace_child("c_proj", std::make_shared<nn::Linear>(16, 32, true));
  CHECK((*attn)(mg::randn(Shape{2, 6, 32})).shape() == Shape{2, 6, 32});
  attn->replace_child("c_attn", std::make_shared<nn::Linear>(32, 40, true));
  REQUIRE_THROWS_WITH((*attn)(mg::randn(Shape{2, 6, 32})),
                      MG_CONTAINS("CausalSelfAttention: c_attn gives 40 features, not 3 x a whole number of heads of 16"));
}

TEST_CASE("GPT: GPT-2's initialisation, the residual projections scaled by 1/sqrt(2 n_layer)") {
  GPTConfig c = small_config();
  c.n_layer = 8;
  c.n_embd = 64;
  mg::manual_seed(11);
  GPT model(c);
  const auto std_of = [&](const std::string& name) {
    const std::vector<float> v = model.parameter(name).to_vector<float>();
    double sq = 0;
    for (float x : v) sq += static_cast<double>(x) * x;
    return std::sqrt(sq / static_cast<double>(v.size()));
  };
  CHECK(std_of("transformer.h.3.attn.c_attn.weight") == Approx(0.02).epsilon(0.05));
  CHECK(std_of("transformer.h.3.mlp.c_fc.weight") == Approx(0.02).epsilon(0.05));
  CHECK(std_of("transformer.h.3.attn.c_proj.weight") == Approx(0.02 / 4).epsilon(0.05));
  CHECK(std_of("transformer.h.3.mlp.c_proj.weight") == Approx(0.02 / 4).epsilon(0.05));
  CHECK(std_of("transformer.wte.weight") == Approx(0.02).epsilon(0.1));
  CHECK(std_of("transformer.h.3.attn.c_attn.bias") == 0.0);
  CHECK(model.parameter("transformer.h.3.ln_1.weight").to_vector<float>() ==
        std::vector<float>(64, 1.0f));
}

TEST_CASE("GPT: logits [B, T, V], the loss at initialisation is about ln(vocab)") {
  GPTConfig c = small_config();
  c.vocab_size = 65;
  GPT model(c);
  const Tensor idx = random_tokens(4, 16, 65, 1);
  const Tensor logits = model(idx);
  CHECK(logits.shape() == Shape{4, 16, 65});
  const double loss = GPT::loss(logits, random_tokens(4, 16, 65, 2)).item<float>();
  CHECK(loss == Approx(std::log(65.0)).margin(0.05));
  // Shorter sequences are fine; longer than block_size are not.
  CHECK(model(random_tokens(2, 5, 65, 3)).shape() == Shape{2, 5, 65});
  REQUIRE_THROWS_WITH(model(random_tokens(1, 17, 65, 4)),
                      MG_CONTAINS("GPT: cannot forward a sequence of length 17, block_size is only 16"));
  REQUIRE_THROWS_WITH(model(mg::zeros(Shape{2, 3})),
                      MG_CONTAINS("GPT: expected token indices int64 [B, T], got [2, 3] (float32)"));
  GPTConfig bad = c;
  bad.n_head = 5;
  REQUIRE_THROWS_WITH(GPT(bad), MG_CONTAINS("GPTConfig: n_embd 32 does not divide into n_head 5 heads"));
  bad = c;
  bad.dropout = 1.0;
  REQUIRE_THROWS_WITH(GPT(bad), MG_CONTAINS("GPTConfig: dropout must be in [0, 1), got 1"));
}

TEST_CASE("GPT: overfits one batch") {
  mg::manual_seed(21);
  GPT model(small_config());
  const Tensor x = random_tokens(4, 16, 20, 5), y = random_tokens(4, 16, 20, 6);
  optim::AdamW opt(optim::weight_decay_groups(model.parameters(),
                                              optim::AdamWOptions(3e-3).weight_decay(0.0)));
  double first = 0, last = 0;
  for (int step = 0; step < 120; ++step) {
    opt.zero_grad();
    Tensor loss = GPT::loss(model(x), y);
    loss.backward();
    opt.step();
    (step == 0 ? first : last) = loss.item<float>();
  }
  INFO("loss " << first << " -> " << last);
  CHECK(first > 2.5);
  CHECK(last < 0.1);
}

TEST_CASE("GPT: equals PyTorch's nanoGPT from the same weights: logits, loss, every gradient, 3 AdamW steps") {
  const std::string path =
      std::string(MINIGRAD_SOURCE_DIR) + "/tests/models/reference/gpt_reference.safetensors";
  const nn::Checkpoint ref = nn::load_tensors(path);
  GPTConfig c;
  c.block_size = 8;
  c.vocab_size = 11;
  c.n_layer = 2;
  c.n_head = 2;
  c.n_embd = 16;
  c.dropout = 0.0;
  c.bias = true;
  for (const bool fused : {true, false}) {
    INFO((fused ? "fused attention" : "composed attention"));
    mg::FusedAttentionGuard attention(fused);
    GPT model(c);
    nn::TensorDict init = ref.get("init.");
    init.emplace("lm_head.weight", init.at("transformer.wte.weight"));
    model.load_state_dict(init, path);
    const Tensor idx = ref.tensors.at("idx"), targets = ref.tensors.at("targets");
    const std::vector<float> losses = ref.tensors.at("losses").to_vector<float>();

    optim::AdamW opt(optim::weight_decay_groups(
        model.parameters(), optim::AdamWOptions(1e-2).betas({0.9, 0.95}).eps(1e-8).weight_decay(0.1)));
    for (int step = 0; step < 3; ++step) {
      INFO("step " << step);
      opt.zero_grad();
      const Tensor logits = model(idx);
      Tensor loss = GPT::loss(logits, targets);
      loss.backward();
      CHECK(loss.item<float>() == Approx(losses[static_cast<size_t>(step)]).epsilon(1e-6));
      if (step == 0) {
        CHECK(max_error(logits.to_vector<float>(), ref.tensors.at("logits").to_vector<float>()) < 1e-6);
        for (const auto& [name, p] : model.named_parameters()) {
          INFO(name);
          const std::vector<float> want = ref.tensors.at("grad." + name).to_vector<float>();
          REQUIRE(p.grad().defined());
          // Float rounding relative to the gradient's scale (sums run in another order).
          CHECK(max_error(p.grad().to_vector<float>(), want) <= 1e-5 * std::max(1e-3, max_abs(want)));
          if (name.find("c_attn.bias") != std::string::npos) {  // the key bias: 0 but for rounding
            const std::vector<float> g = p.grad().to_vector<float>();
            CHECK(max_abs(std::vector<float>(g.begin() + c.n_embd, g.begin() + 2 * c.n_embd)) < 1e-7);
          }
        }
      }
      opt.step();
    }
    CHECK(GPT::loss(model(idx), targets).item<float>() == Approx(losses[3]).epsilon(1e-5));
    for (const auto& [name, p] : model.named_parameters()) {
      INFO(name);
      std::vector<float> got = p.to_vector<float>();
      std::vector<float> want = ref.tensors.at("after." + name).to_vector<float>();
      if (name.find("c_attn.bias") != std::string::npos) {
        // The key bias (elements C..2C) adds the same q.b_k to every score of a query's
        // row, which softmax ignores: its gradient is 0 but for rounding (|g| ~ 1e-10 in
        // both programs), and Adam turns that noise into steps of up to lr * |g| / (|g| +
        // eps). Those elements agree to 3 steps of that; the query and value biases as
        // every other parameter.
        const auto key = [&](std::vector<float>& v) {
          std::vector<float> k(v.begin() + c.n_embd, v.begin() + 2 * c.n_embd);
          v.erase(v.begin() + c.n_embd, v.begin() + 2 * c.n_embd);
          return k;
        };
        const std::vector<float> got_key = key(got), want_key = key(want);
        CHECK(max_error(got_key, want_key) < 3 * 1e-2 * 0.02);
      }
      CHECK(max_error(got, want) < 2e-5);
    }
  }
}

TEST_CASE("GPT: eval() turns every dropout off, train() on again") {
  GPTConfig c = small_config();
  c.dropout = 0.3;
  GPT model(c);
  const Tensor idx = random_tokens(2, 16, 20, 8);
  model.eval();
  CHECK(model(idx).to_vector<float>() == model(idx).to_vector<float>());
  model.train();
  CHECK(model(idx).to_vector<float>() != model(idx).to_vector<float>());
}

TEST_CASE("GPT: checkpoints with nanoGPT's keys round-trip, a head that is not the embedding is refused") {
  mg::testing::TempDir dir;
  GPT a(small_config());
  nn::save_tensors(a.state_dict(), dir / "gpt.safetensors");
  const nn::Checkpoint loaded = nn::load_tensors(dir / "gpt.safetensors");
  CHECK(loaded.tensors.count("lm_head.weight") == 1);
  mg::manual_seed(99);
  GPT b(small_config());
  const Tensor idx = random_tokens(2, 9, 20, 9);
  CHECK(a(idx).to_vector<float>() != b(idx).to_vector<float>());
  b.load_state_dict(loaded.tensors, dir / "gpt.safetensors");
  CHECK(a(idx).to_vector<float>() == b(idx).to_vector<float>());

  nn::TensorDict no_head = loaded.tensors;
  no_head.erase("lm_head.weight");
  REQUIRE_THROWS_WITH(b.load_state_dict(no_head, "ck"),
                      MG_CONTAINS("GPT::load_state_dict: ck has no 'lm_head.weight'"));
  nn::TensorDict other_head = loaded.tensors;
  other_head["lm_head.weight"] = mg::zeros(Shape{20, 32});
  REQUIRE_THROWS_WITH(b.load_state_dict(other_head, "ck"),
                      MG_CONTAINS("in ck, 'lm_head.weight' differs from 'transformer.wte.weight'"));
  nn::TensorDict missing = loaded.tensors;
  missing.erase("transformer.h.1.mlp.c_fc.bias");
  REQUIRE_THROWS_WITH(b.load_state_dict(missing, "ck"),
                      MG_CONTAINS("transformer.h.1.mlp.c_fc.bias"));
  CHECK(a(idx).to_vector<float>() == b(idx).to_vector<float>());  // unchanged by the refusals
}

TEST_CASE("GPT::generate: appends tokens, crops to block_size, top_k = 1 is greedy, seeded") {
  GPT model(small_config());
  model.eval();
  const Tensor start = random_tokens(2, 3, 20, 10);
  mg::Generator g1(5), g2(5);
  const Tensor a = model.generate(start, 20, 1.0, 0, &g1);  // 3 + 20 > block_size 16
  const Tensor b = model.generate(start, 20, 1.0, 0, &g2);
  CHECK(a.shape() == Shape{2, 23});
  CHECK(a.to_vector<int64_t>() == b.to_vector<int64_t>());
  for (int64_t t : a.to_vector<int64_t>()) CHECK((t >= 0 && t < 20));
  const std::vector<int64_t> s = start.to_vector<int64_t>(), out = a.to_vector<int64_t>();
  CHECK(std::equal(s.begin(), s.begin() + 3, out.begin()));
  CHECK(std::equal(s.begin() + 3, s.end(), out.begin() + 23));

  // top_k = 1: the argmax of the last position's logits.
  const Tensor greedy = model.generate(start, 1, 1.0, 1);
  const std::vector<float> logits =
      mg::narrow(model(start), 1, 2, 1).contiguous().to_vector<float>();
  for (int64_t row = 0; row < 2; ++row) {
    const auto first = logits.begin() + row * 20;
    CHECK(greedy.to_vector<int64_t>()[static_cast<size_t>(row * 4 + 3)] ==
          std::max_element(first, first + 20) - first);
  }
  REQUIRE_THROWS_WITH(model.generate(start, 1, -0.5), MG_CONTAINS("temperature must be >= 0 and finite"));
  REQUIRE_THROWS_WITH(model.generate(start, 1, INFINITY), MG_CONTAINS("temperature must be >= 0 and finite"));
  REQUIRE_THROWS_WITH(model.generate(start, 1, 1.0, -1), MG_CONTAINS("top_k must be >= 0"));
}

TEST_CASE("GPT::generate: temperature 0 is its limit, the argmax, and a tiny one tends to it") {
  GPT model(small_config());
  model.eval();
  const Tensor start = random_tokens(2, 3, 20, 10);
  // temperature 0: every step the largest logit, as top_k = 1 (and no draw from the generator).
  mg::Generator g(3);
  const auto before = g.state();
  const Tensor zero = model.generate(start, 6, 0.0, 0, &g);
  CHECK(g.state().offset == before.offset);
  CHECK(zero.to_vector<int64_t>() == model.generate(start, 6, 1.0, 1).to_vector<int64_t>());
  // A temperature so small that logit / temperature overflows to inf samples the argmax too,
  // rather than a NaN distribution.
  CHECK(model.generate(start, 6, 1e-300).to_vector<int64_t>() == zero.to_vector<int64_t>());
}

TEST_CASE("GPT::generate: logits that make no distribution are an error naming the step, as torch.multinomial") {
  GPT model(small_config());
  model.eval();
  const Tensor start = random_tokens(2, 3, 20, 10);
  // A model whose weights are NaN: every logit NaN (it once sampled token 0 at every step).
  GPT broken(small_config());
  broken.eval();
  {
    mg::NoGradGuard no_grad;
    broken.parameter("transformer.ln_f.weight").fill_(std::nan(""));
  }
  mg::Generator g(1);
  const auto state = g.state();
  REQUIRE_THROWS_WITH(broken.generate(start, 4, 1.0, 0, &g),
                      MG_CONTAINS("GPT::generate: step 1 of 4, sequence 0: the logit of token 0 is nan") &&
                          MG_CONTAINS("probability tensor contains either inf, nan or element < 0"));
  CHECK(g.state().offset == state.offset);  // nothing drawn
  // The same at temperature 0 and with top_k: there is no largest of NaNs.
  REQUIRE_THROWS_WITH(broken.generate(start, 4, 0.0), MG_CONTAINS("step 1 of 4, sequence 0"));
  REQUIRE_THROWS_WITH(broken.generate(start, 4, 1.0, 3), MG_CONTAINS("step 1 of 4, sequence 0"));
  // Logits that overflow to +inf (softmax: inf / inf = NaN), named the same way: ln_f puts
  // out 3e38 everywhere, and 32 channels of it times a head of ones overflow float32.
  {
    mg::NoGradGuard no_grad;
    broken.parameter("transformer.ln_f.weight").fill_(0.0);
    broken.parameter("transformer.ln_f.bias").fill_(3e38);
    broken.parameter("transformer.wte.weight").fill_(1.0);
  }
  REQUIRE_THROWS_WITH(broken.generate(start, 2), MG_CONTAINS("the logit of token") && MG_CONTAINS("is inf") &&
                                                      MG_CONTAINS("probabilities are not finite"));
  // The healthy model is unaffected: it still samples.
  CHECK(model.generate(start, 2).shape() == Shape{2, 5});
}

TEST_CASE("GPT::generate: a float64 GPT (Module::to) generates, and as its float32 self at temperature 0") {
  GPT model(small_config());
  model.eval();
  const Tensor start = random_tokens(2, 3, 20, 10);
  const Tensor narrow32 = model.generate(start, 8, 0.0);
  model.to(mg::DType::Float64);  // the float32 weights, exactly, in float64
  for (const Tensor& p : model.parameters()) CHECK(p.dtype() == mg::DType::Float64);
  const Tensor wide = model.generate(start, 8, 0.0);
  CHECK(wide.dtype() == mg::DType::Int64);
  CHECK(wide.shape() == Shape{2, 11});
  // Greedy decoding of the same weights: float32 and float64 logits pick the same argmax
  // unless two logits are within float32's rounding (checked: they are not here).
  CHECK(wide.to_vector<int64_t>() == narrow32.to_vector<int64_t>());
  mg::Generator g1(9), g2(9);
  const Tensor a = model.generate(start, 8, 0.8, 5, &g1), b = model.generate(start, 8, 0.8, 5, &g2);
  CHECK(a.to_vector<int64_t>() == b.to_vector<int64_t>());
  for (int64_t t : a.to_vector<int64_t>()) CHECK((t >= 0 && t < 20));
}

TEST_CASE("GPT::generate: the KV cache gives the uncached tokens, greedy and sampled, in float64 and float32, "
          "within block_size and past it") {
  for (mg::DType dtype : {mg::DType::Float64, mg::DType::Float32}) {
    INFO(mg::dtype_name(dtype));
    mg::manual_seed(5);
    GPT model(small_config());  // block_size 16
    model.to(dtype);
    model.eval();
    const Tensor prompt = random_tokens(2, 3, 20, 12);
    for (const auto& [temperature, top_k] : {std::pair<double, int64_t>{0.0, 0}, {1.0, 0}, {0.8, 5}}) {
      // 3 + 13 fills block_size exactly; 3 + 20 slides past it (uncached from there on).
      for (int64_t n : {int64_t{13}, int64_t{20}}) {
        INFO("temperature " << temperature << ", top_k " << top_k << ", " << n << " new tokens");
        mg::Generator g1(11), g2(11);
        const Tensor cached = model.generate(prompt, n, temperature, top_k, &g1, /*use_cache=*/true);
        const Tensor uncached = model.generate(prompt, n, temperature, top_k, &g2, /*use_cache=*/false);
        REQUIRE(cached.shape() == Shape{2, 3 + n});
        CHECK(cached.to_vector<int64_t>() == uncached.to_vector<int64_t>());
      }
    }
  }
  // Each attention's cache is off and empty again after generate; its contract: one new token at
  // a time after the prompt, no gradients, and positions within block_size.
  GPT model(small_config());
  model.generate(random_tokens(1, 4, 20, 3), 2);
  auto attention = std::dynamic_pointer_cast<mg::models::CausalSelfAttention>(
      model.child("transformer")->child("h")->child("0")->child("attn"));
  REQUIRE(attention != nullptr);
  CHECK(attention->kv_cache_length() == 0);
  attention->set_kv_cache(true);
  {
    mg::NoGradGuard no_grad;
    (*attention)(mg::randn(Shape{1, 3, 32}));
    CHECK(attention->kv_cache_length() == 3);
    REQUIRE_THROWS_WITH((*attention)(mg::randn(Shape{1, 2, 32})), MG_CONTAINS("one new token at a time, got 2"));
    attention->set_kv_cache(false);
    for (const auto& block : model.child("transformer")->child("h")->children())
      std::dynamic_pointer_cast<mg::models::CausalSelfAttention>(block->child("attn"))->set_kv_cache(true);
    model(random_tokens(1, 16, 20, 4));  // the whole block cached: no position is left
    REQUIRE_THROWS_WITH(model(random_tokens(1, 1, 20, 5)), MG_CONTAINS("cannot forward a sequence of length 17, block_size is only 16"));
    for (const auto& block : model.child("transformer")->child("h")->children())
      std::dynamic_pointer_cast<mg::models::CausalSelfAttention>(block->child("attn"))->set_kv_cache(false);
  }
  attention->set_kv_cache(true);
  REQUIRE_THROWS_WITH((*attention)(mg::randn(Shape{1, 3, 32})), MG_CONTAINS("under NoGradGuard"));
  attention->set_kv_cache(false);
}
