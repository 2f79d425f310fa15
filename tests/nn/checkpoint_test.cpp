// Activation checkpointing (nn/checkpoint.h): with dropout on, a checkpointed GPT's
// logits, loss and every gradient equal the plain GPT's (float64, bit for bit); a
// checkpointed function passes the input's gradient on; the graph kept between forward
// and backward is smaller; and a recompute that draws fresh dropout masks (a test-only
// fault) is caught by the same comparison.
#include "catch_compat.h"

#include <memory>
#include <string>
#include <vector>

#include <minigrad/core/allocator.h>
#include <minigrad/core/fault_injection.h>
#include <minigrad/minigrad.h>
#include <minigrad/models/gpt_checkpointing.h>
#include <minigrad/nn/checkpoint.h>

namespace nn = mg::nn;
using mg::DType;
using mg::Shape;
using mg::Tensor;
using mg::models::GPT;
using mg::models::GPTConfig;

namespace {

GPTConfig tiny_config(double dropout) {
  GPTConfig c;
  c.block_size = 12;
  c.vocab_size = 23;
  c.n_layer = 3;
  c.n_head = 2;
  c.n_embd = 16;
  c.dropout = dropout;
  return c;
}

std::shared_ptr<GPT> make_gpt(const GPTConfig& config, DType dtype) {
  mg::manual_seed(11);
  auto gpt = std::make_shared<GPT>(config);
  gpt->to(dtype);  // its initialisation draws float32
  return gpt;
}

struct Run {
  std::vector<double> logits, loss, grads;
};

std::vector<double> values(const Tensor& t) { return t.contiguous().to(DType::Float64).to_vector<double>(); }

Run run(const std::shared_ptr<GPT>& gpt) {
  mg::manual_seed(5);
  const Tensor idx = mg::randint(0, 23, Shape{3, 10});
  const Tensor targets = mg::randint(0, 23, Shape{3, 10});
  mg::manual_seed(99);  // the dropout masks' stream
  gpt->zero_grad();
  const Tensor logits = gpt->forward(idx);
  const Tensor loss = GPT::loss(logits, targets);
  loss.backward();
  Run r{values(logits), values(loss), {}};
  for (const Tensor& p : gpt->parameters()) {
    REQUIRE(p.grad().defined());
    const auto g = values(p.grad());
    r.grads.insert(r.grads.end(), g.begin(), g.end());
  }
  return r;
}

}  // namespace

TEST_CASE("checkpoint: a GPT's blocks recomputed give the plain logits, loss and gradients") {
  auto gpt = make_gpt(tiny_config(0.25), DType::Float64);
  const Run plain = run(gpt);
  mg::models::set_block_checkpointing(*gpt);
  const size_t before = nn::checkpoint_recomputations();
  const Run recomputed = run(gpt);
  CHECK(nn::checkpoint_recomputations() - before == 3);  // each block once
  CHECK(recomputed.logits == plain.logits);
  CHECK(recomputed.loss == plain.loss);
  CHECK(recomputed.grads == plain.grads);
  // Dropout is on: without the same masks nothing would agree.
  mg::models::set_block_checkpointing(*gpt, false);
  mg::manual_seed(1);
  CHECK(run(gpt).grads == plain.grads);  // the masks come from the seed set in run()
}

TEST_CASE("checkpoint: fresh dropout masks in the recompute are caught") {
  auto gpt = make_gpt(tiny_config(0.25), DType::Float64);
  const Run plain = run(gpt);
  mg::models::set_block_checkpointing(*gpt);
  Run faulty;
  {
    mg::testing::FaultGuard fault(mg::testing::Fault::CheckpointFreshDropout);
    faulty = run(gpt);
  }
  CHECK(faulty.loss == plain.loss);  // forward is untouched...
  CHECK(faulty.grads != plain.grads);  // ...but backward differentiates other masks
  // Without dropout the fault changes nothing: the comparison needs dropout on.
  auto quiet = make_gpt(tiny_config(0.0), DType::Float64);
  const Run quiet_plain = run(quiet);
  mg::models::set_block_checkpointing(*quiet);
  mg::testing::FaultGuard fault(mg::testing::Fault::CheckpointFreshDropout);
  CHECK(run(quiet).grads == quiet_plain.grads);
}

TEST_CASE("checkpoint: a function's input gradient, and no graph without grad mode") {
  mg::manual_seed(3);
  auto linear = std::make_shared<nn::Linear>(6, 5);
  const auto fn = [&](const Tensor& x) { return mg::gelu(mg::dropout((*linear)(x), 0.3, true)); };
  Tensor x = mg::randn(Shape{4, 6}).to(DType::Float32);
  x.set_requires_grad(true);
  const Tensor w = mg::randn(Shape{4, 5});
  std::vector<float> y_plain, gx_plain, gw_plain;
  {
    mg::manual_seed(8);
    const Tensor y = fn(x);
    (y * w).sum().backward();
    y_plain = y.to_vector<float>();
    gx_plain = x.grad().to_vector<float>();
    gw_plain = linear->weight().grad().to_vector<float>();
  }
  x.set_grad(Tensor());
  linear->zero_grad();
  mg::manual_seed(8);
  const Tensor y = nn::checkpoint(fn, x);
  REQUIRE(y.requires_grad());
  (y * w).sum().backward();
  CHECK(y.to_vector<float>() == y_plain);
  CHECK(x.grad().to_vector<float>() == gx_plain);
  CHECK(linear->weight().grad().to_vector<float>() == gw_plain);
  {
    mg::NoGradGuard no_grad;
    CHECK_FALSE(nn::checkpoint(fn, x).requires_grad());
  }
}

TEST_CASE("checkpoint: the graph kept between forward and backward is smaller") {
  GPTConfig c = tiny_config(0.1);
  c.n_layer = 4;
  c.n_embd = 32;
  c.block_size = 16;
  auto gpt = make_gpt(c, DType::Float32);
  mg::manual_seed(5);
  const Tensor idx = mg::randint(0, c.vocab_size, Shape{4, 16});
  const Tensor targets = mg::randint(0, c.vocab_size, Shape{4, 16});
  // Bytes held once the loss is computed (activations saved for backward) and the peak.
  const auto measure = [&](bool checkpointing) {
    mg::models::set_block_checkpointing(*gpt, checkpointing);
    gpt->zero_grad();
    const size_t base = mg::cpu_memory_allocated();
    mg::cpu_reset_peak_memory_stats();
    Tensor loss = GPT::loss(gpt->forward(idx), targets);
    const size_t kept = mg::cpu_memory_allocated() - base;
    loss.backward();
    loss = Tensor();
    const size_t peak = mg::cpu_max_memory_allocated() - base;
    return std::pair<size_t, size_t>{kept, peak};
  };
  const auto [kept_plain, peak_plain] = measure(false);
  const auto [kept_ckpt, peak_ckpt] = measure(true);
  INFO("kept " << kept_plain << " -> " << kept_ckpt << " bytes, peak " << peak_plain << " -> "
               << peak_ckpt);
  CHECK(kept_ckpt * 2 < kept_plain);
  CHECK(peak_ckpt < peak_plain);
}
