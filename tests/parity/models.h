// The models the parity table trains (table.h's "model" column), their batches, losses and
// optimizers: the same for the plain module and for every form (harness.cpp). The MLP is
// small enough to split every way; the GPT is as tiny as tests/distributed's GPT tests use;
// the Llama as tiny, split by its own spec (models/llama_plan.h) through the same harness.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <vector>

#include "parallel/dp_check.h"  // make_mlp
#include "parity/table.h"

#include <minigrad/minigrad.h>
#include <minigrad/models/gpt.h>
#include <minigrad/models/gpt_checkpointing.h>
#include <minigrad/models/gpt_plan.h>
#include <minigrad/models/llama.h>
#include <minigrad/models/llama_plan.h>

namespace mg::parity {

// Linear(6,8) ReLU Linear(8,4) ReLU Linear(4,3): 107 parameters, so one flat bucket pads
// on 2 and on 3 ranks, and so do FSDP's units of 56 (on 3) and 15 (on 2) elements;
// parallelize_mlp splits the first pair over 2 ranks and leaves the last Linear whole.
inline const std::vector<int64_t> kWidths{6, 8, 4, 3};
constexpr uint64_t kModelSeed = 20240611;
constexpr double kMaxNorm = 0.05;  // below the gradients' norm: every AdamW step clips (checked)

inline std::shared_ptr<nn::Sequential> make_model(const Config& c) {
  MG_CHECK(c.model == "MLP", "parity: the MLP's forms cannot take the model '{}'", c.model);
  manual_seed(kModelSeed);
  return std::static_pointer_cast<nn::Sequential>(mg::testing::make_mlp(kWidths));
}

// The GPT's rows train a tiny GPT, as tests/distributed's GPT tests do: 6 heads of 2, so
// that tp 2 and tp 3 split the heads, the vocabulary (24) and 4C (48); sequences of 12, so
// that cp 2 and cp 3 cut them into 2 cp chunks of equal length (T % (2 cp) == 0) and
// sequence parallelism over 2 ranks gives each 6 positions. No biases: the key bias's
// exact gradient is zero (softmax ignores a constant per query), so in float32 it is
// rounding noise that Adam divides by its own size into a whole step, a different one in
// every form.
inline models::GPTConfig gpt_config(const Config& c) {
  models::GPTConfig g;
  g.block_size = 12;
  g.vocab_size = 24;
  g.n_layer = c.n_layer;  // 2 unless a pipeline row needs a block per virtual stage
  g.n_head = 6;
  g.n_embd = 12;
  g.bias = false;
  g.dropout = c.dropout;
  return g;
}
constexpr int64_t kGptT = 12;

// Built alike on every rank (the same seed), in the row's dtype.
inline std::shared_ptr<models::GPT> make_gpt(const Config& c) {
  MG_CHECK(c.model == "GPT", "parity: the GPT's forms cannot take the model '{}'", c.model);
  manual_seed(kModelSeed);
  auto gpt = std::make_shared<models::GPT>(gpt_config(c));
  gpt->to(c.dtype);  // its initialisation draws float32
  return gpt;
}

// The Llama's rows train a tiny Llama: 4 query heads of 4 and 2 kv heads (grouped-query
// attention, a group of 2), so that tp 2 gives each rank 2 query heads and their kv head;
// SwiGLU width 24, vocabulary 24 and sequences of 12, as the GPT's, for the same splits.
inline models::LlamaConfig llama_config(const Config& c) {
  models::LlamaConfig l;
  l.vocab_size = 24;
  l.hidden_size = 16;
  l.intermediate_size = 24;
  l.num_hidden_layers = c.n_layer;
  l.num_attention_heads = 4;
  l.num_key_value_heads = 2;
  l.max_position_embeddings = 12;
  return l;
}

inline std::shared_ptr<models::Llama> make_llama(const Config& c) {
  MG_CHECK(c.model == "Llama", "parity: the Llama's forms cannot take the model '{}'", c.model);
  manual_seed(kModelSeed);
  auto llama = std::make_shared<models::Llama>(llama_config(c));
  llama->to(c.dtype);
  return llama;
}

inline bool is_transformer(const Config& c) { return c.model == "GPT" || c.model == "Llama"; }

// What the harness asks of a transformer to split it: the model's spec (models/split_spec.h),
// bound to this rank's model. The forms are the same code for both models.
inline models::SplitSpec make_transformer(const Config& c) {
  if (c.model == "GPT") return models::gpt_split_spec(make_gpt(c));
  return models::llama_split_spec(make_llama(c));
}

inline nn::ModulePtr make_module(const Config& c) {
  if (c.model == "GPT") return make_gpt(c);
  if (c.model == "Llama") return make_llama(c);
  return make_model(c);
}

struct Batch {
  Tensor x, y;
};

// The whole batch of step `step`: every process draws the same. The MLP's: features and
// classes; the GPT's: [batch, T] tokens and their targets, none ignored (-1), so that
// every row holds as many targets and a rank's mean weighs as its rows do.
inline Batch step_batch(const Config& c, int step) {
  manual_seed(1000 + static_cast<uint64_t>(step));
  if (is_transformer(c))  // the GPT's and the Llama's vocabularies are both 24
    return {randint(0, gpt_config(c).vocab_size, Shape{c.batch, kGptT}),
            randint(0, gpt_config(c).vocab_size, Shape{c.batch, kGptT})};
  Tensor x = randn(Shape{c.batch, kWidths.front()});
  Tensor y = randint(0, kWidths.back(), Shape{c.batch});
  return {x, y};
}

// The model's loss: the mean over the batch's rows (a transformer's: over its tokens);
// Reduction::Sum, a transformer's summed over its tokens.
inline Tensor model_loss(const Config& c, const Tensor& out, const Tensor& y, Reduction reduction = Reduction::Mean) {
  if (c.model == "GPT") return models::GPT::loss(out, y, reduction);
  if (c.model == "Llama") return models::Llama::loss(out, y, reduction);
  return cross_entropy(out, y);
}

// A 0-dim tensor's value, float32 or float64.
inline double scalar(const Tensor& t) {
  return t.dtype() == DType::Float64 ? t.item<double>() : static_cast<double>(t.item<float>());
}

// The GPT's AdamW takes the GPT tests' lr 1e-3. Adam divides each gradient by its own
// size: where a gradient is near zero (some of c_attn's) the order of float32's sums moves
// the step by far more than it moves the gradient, and a smaller step keeps that below the
// tolerance. A fault shows in the gradients, which are compared before the step.
inline std::unique_ptr<optim::Optimizer> make_optimizer(const Config& c, std::vector<Tensor> params) {
  if (c.optimizer == Optimizer::SGDMomentum)
    return std::make_unique<optim::SGD>(std::move(params), optim::SGDOptions(0.1).momentum(0.9));
  return std::make_unique<optim::AdamW>(std::move(params), optim::AdamWOptions().lr(is_transformer(c) ? 1e-3 : 0.02));
}

}  // namespace mg::parity
