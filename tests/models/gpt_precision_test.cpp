// The GPT (models/gpt.h) in mixed precision: under autocast (float32 parameters, bfloat16
// GEMMs: nanoGPT's way) and with bfloat16 parameters (llm.c's way, through float32 master
// weights), forward, backward and training steps run and stay near the float32 model.
//
// How near, and why: bfloat16 rounds each GEMM's output and each stored activation by up
// to u = 2^-8 (0.4 %) relative. The logits come out of about a dozen such roundings in a
// 2-layer GPT, independent and of random sign, so their relative error is a few u, and
// the loss (an average over 64 tokens of log-probabilities) moves less than that: 1e-2
// relative is ~2.5 u, and torchtitan's own check of bf16 against fp32 losses is 2e-2.
// Gradients are sums over the batch of products of those activations, each carrying a
// dozen independent roundings of random sign: their relative error, ||g - g32|| / ||g32||
// over each parameter, is about u sqrt(12) = 3.5u; held to 5u (2e-2). bfloat16 parameters
// add their own rounding (u relative) to every weight and every backward GEMM's output is
// rounded too: held to 8u (3e-2). (Measured: 1.75u and 2.6u at worst.)
#include "catch_compat.h"

#include <cmath>
#include <memory>
#include <vector>

#include <minigrad/core/ops.h>
#include <minigrad/minigrad.h>

using namespace mg;
using mg::models::GPT;
using mg::models::GPTConfig;

namespace {

GPTConfig config() {
  GPTConfig c;
  c.block_size = 16;
  c.vocab_size = 20;
  c.n_layer = 2;
  c.n_head = 2;
  c.n_embd = 32;
  return c;
}

Tensor tokens(uint64_t seed) {
  manual_seed(seed);
  return randint(0, 20, Shape{4, 16});
}

// A GPT with the float32 model's weights, in `dtype`.
std::shared_ptr<GPT> copy_of(const GPT& model, DType dtype) {
  auto other = std::make_shared<GPT>(model.config());
  other->load_state_dict(model.state_dict(), "the float32 model");
  other->to(dtype);
  return other;
}

double relative_error(const Tensor& a, const Tensor& reference) {
  const std::vector<float> x = ops::to_dtype(a, DType::Float32).to_vector<float>();
  const std::vector<float> y = ops::to_dtype(reference, DType::Float32).to_vector<float>();
  double diff = 0.0, norm = 0.0;
  for (size_t i = 0; i < x.size(); ++i) {
    diff += (static_cast<double>(x[i]) - y[i]) * (static_cast<double>(x[i]) - y[i]);
    norm += static_cast<double>(y[i]) * y[i];
  }
  return std::sqrt(diff / std::max(norm, 1e-30));
}

}  // namespace

TEST_CASE("GPT in mixed precision: autocast and bfloat16 parameters, forward and backward near float32",
          "[reduced_float][autocast]") {
  manual_seed(31);
  GPT model(config());
  const Tensor x = tokens(1), y = tokens(2);
  const Tensor loss32 = GPT::loss(model(x), y);
  loss32.backward();
  std::vector<Tensor> grads32;
  for (const Tensor& p : model.parameters()) grads32.push_back(p.grad());
  model.zero_grad();

  // nanoGPT's way: float32 parameters, bfloat16 GEMMs, the loss in float32.
  Tensor logits, loss;
  {
    AutocastGuard autocast(DeviceType::CPU, DType::BFloat16);
    logits = model(x);
    loss = GPT::loss(logits, y);
  }
  CHECK(logits.dtype() == DType::BFloat16);  // the lm_head's GEMM
  CHECK(loss.dtype() == DType::Float32);     // cross_entropy in float32
  loss.backward();
  const double l32 = loss32.item<float>();
  INFO("float32 loss " << l32 << ", autocast " << loss.item<float>());
  CHECK(std::fabs(loss.item<float>() - l32) <= 1e-2 * l32);
  for (size_t i = 0; i < grads32.size(); ++i) {
    const Tensor g = model.parameters()[i].grad();
    INFO("parameter " << i << " " << model.parameters()[i].shape().str());
    CHECK(g.dtype() == DType::Float32);
    CHECK(relative_error(g, grads32[i]) <= 2e-2);
  }

  // llm.c's way: the weights themselves in bfloat16 (every op in bfloat16, the loss too).
  auto half = copy_of(model, DType::BFloat16);
  const Tensor loss16 = GPT::loss((*half)(x), y);
  CHECK(loss16.dtype() == DType::BFloat16);
  loss16.backward();
  INFO("bfloat16 parameters' loss " << static_cast<float>(loss16.item<bfloat16>()));
  CHECK(std::fabs(static_cast<float>(loss16.item<bfloat16>()) - l32) <= 1e-2 * l32);
  for (size_t i = 0; i < grads32.size(); ++i) {
    const Tensor g = half->parameters()[i].grad();
    INFO("parameter " << i << " " << half->parameters()[i].shape().str());
    CHECK(g.dtype() == DType::BFloat16);
    CHECK(relative_error(g, grads32[i]) <= 3e-2);
  }
  // A bfloat16 GPT generates (its logits are read in double), and under autocast too.
  const Tensor prompt = narrow(x, 1, 0, 4);
  CHECK(half->generate(prompt, 5, 0.0).shape() == Shape{4, 9});
  {
    AutocastGuard autocast(DeviceType::CPU, DType::BFloat16);
    CHECK(model.generate(prompt, 5, 1.0, 3).shape() == Shape{4, 9});
  }
}

TEST_CASE("GPT in mixed precision: 30 AdamW steps, bf16-mixed and bfloat16 with masters, track float32",
          "[reduced_float][autocast]") {
  // Overfitting one batch: the three runs' losses fall together. Each step's loss within
  // 2e-2 relative of float32's (torchtitan's tolerance); the runs differ by the roundings
  // above, step after step, which the optimizer's normalisation keeps from compounding.
  manual_seed(32);
  GPT reference(config());
  auto mixed = copy_of(reference, DType::Float32);
  auto half = copy_of(reference, DType::BFloat16);
  const Tensor x = tokens(3), y = tokens(4);
  const auto options = optim::AdamWOptions(3e-3).weight_decay(0.0);
  optim::AdamW opt32(reference.parameters(), options), opt_mixed(mixed->parameters(), options);
  optim::MasterWeights opt_half(half->parameters(), [&](std::vector<Tensor> masters) {
    return std::make_unique<optim::AdamW>(std::move(masters), options);
  });
  double first = 0.0, last32 = 0.0;
  for (int step = 0; step < 30; ++step) {
    opt32.zero_grad();
    const Tensor l32 = GPT::loss(reference(x), y);
    l32.backward();
    opt32.step();

    opt_mixed.zero_grad();
    Tensor lm;
    {
      AutocastGuard autocast(DeviceType::CPU, DType::BFloat16);
      lm = GPT::loss((*mixed)(x), y);
    }
    lm.backward();
    opt_mixed.step();

    opt_half.zero_grad();
    const Tensor lh = GPT::loss((*half)(x), y);
    lh.backward();
    opt_half.step();

    const double a = l32.item<float>(), b = lm.item<float>(), c = static_cast<float>(lh.item<bfloat16>());
    INFO("step " << step << ": float32 " << a << ", bf16-mixed " << b << ", bfloat16 + masters " << c);
    CHECK(std::fabs(b - a) <= 2e-2 * a);
    CHECK(std::fabs(c - a) <= 2e-2 * a);
    if (step == 0) first = a;
    last32 = a;
  }
  CHECK(last32 < 0.5 * first);
}
