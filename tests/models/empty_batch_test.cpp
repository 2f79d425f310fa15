// Every op that takes a batch, on an empty one (zero rows): the result has PyTorch's shape
// (and value, where it has one: the mean of nothing is NaN, the sum 0), backward gives the
// leaves gradients of their own shapes (empty for the batch, zeros for the weights), or
// the op refuses with a clear mg::Error where PyTorch raises too. GPT::generate on a [0, 1]
// prompt once died of SIGSEGV; a view of an empty batch's columns (narrow, split, cat,
// attention's heads) was refused as out of bounds where PyTorch takes any offset.
//
// PyTorch 1.13's shapes and values were read from python3-torch (F.* on torch.zeros(0, 3)
// and its kin; 1.13 has no scaled_dot_product_attention, so attention is its composition,
// softmax(q k^T) v, there).
#include "catch_compat.h"

#include <cmath>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include <minigrad/minigrad.h>
#include <minigrad/core/ops.h>

using namespace mg;

namespace {

// A float32 leaf of zeros that requires grad.
Tensor leaf(const Shape& shape) {
  Tensor t = zeros(shape);
  t.set_requires_grad(true);
  return t;
}

Tensor int64_zeros(const Shape& shape) { return zeros(shape, DType::Int64); }

models::GPTConfig tiny_gpt() {
  models::GPTConfig c;
  c.block_size = 8;
  c.vocab_size = 11;
  c.n_layer = 1;
  c.n_head = 2;
  c.n_embd = 8;
  return c;
}

struct Run {
  Tensor out;
  std::vector<Tensor> leaves;  // their gradients are checked after backward of sum(out)
};

struct Case {
  std::string name;
  Shape shape;  // PyTorch's
  std::function<Run()> run;
};

// Sizes: a batch of 0 rows of 3 features; Linear 3 -> 4; an embedding of 5 x 3; attention
// [0, 2 heads, 4 positions, 8].
std::vector<Case> cases() {
  const Shape rows{0, 3};
  const auto one = [](Tensor out, std::vector<Tensor> leaves) { return Run{std::move(out), std::move(leaves)}; };
  return {
      {"add (broadcast row)", rows, [=] { Tensor x = leaf(rows), b = leaf({3}); return one(x + b, {x, b}); }},
      {"mul by a scalar", rows, [=] { Tensor x = leaf(rows); return one(x * 2.5, {x}); }},
      {"div", rows, [=] { Tensor x = leaf(rows), y = leaf(rows); return one(x / y, {x, y}); }},
      {"int64 / int64", rows, [=] { return one(int64_zeros(rows) / int64_zeros(rows), {}); }},
      {"neg, exp, log, relu, tanh, gelu", rows,
       [=] { Tensor x = leaf(rows); return one(gelu(tanh(relu(log(exp(neg(x)))))), {x}); }},
      {"sum", Shape{}, [=] { Tensor x = leaf(rows); return one(sum(x), {x}); }},
      {"sum over dim 0", Shape{3}, [=] { Tensor x = leaf(rows); return one(sum(x, {0}), {x}); }},
      {"mean", Shape{}, [=] { Tensor x = leaf(rows); return one(mean(x), {x}); }},
      {"mean over dim 0", Shape{3}, [=] { Tensor x = leaf(rows); return one(mean(x, {0}), {x}); }},
      {"mean over dim 1", Shape{0}, [=] { Tensor x = leaf(rows); return one(mean(x, {1}), {x}); }},
      {"argmax over dim 1", Shape{0}, [=] { return one(zeros(rows).argmax(1), {}); }},
      {"matmul", Shape{0, 4}, [=] { Tensor x = leaf(rows), w = leaf({3, 4}); return one(matmul(x, w), {x, w}); }},
      {"batched matmul", Shape{0, 2, 4},
       [=] { Tensor a = leaf({0, 2, 3}), b = leaf({0, 3, 4}); return one(matmul(a, b), {a, b}); }},
      {"linear", Shape{0, 4},
       [=] { Tensor x = leaf(rows), w = leaf({4, 3}), b = leaf({4}); return one(linear(x, w, b), {x, w, b}); }},
      {"linear of [0, 5, 3]", Shape{0, 5, 4},
       [=] { Tensor x = leaf({0, 5, 3}), w = leaf({4, 3}), b = leaf({4}); return one(linear(x, w, b), {x, w, b}); }},
      {"linear_relu", Shape{0, 4},
       [=] { Tensor x = leaf(rows), w = leaf({4, 3}), b = leaf({4}); return one(linear_relu(x, w, b), {x, w, b}); }},
      {"softmax over dim 0", rows, [=] { Tensor x = leaf(rows); return one(softmax(x, 0), {x}); }},
      {"log_softmax", rows, [=] { Tensor x = leaf(rows); return one(log_softmax(x, -1), {x}); }},
      {"cross_entropy (mean)", Shape{},
       [=] { Tensor x = leaf(rows); return one(cross_entropy(x, int64_zeros({0})), {x}); }},
      {"cross_entropy (sum, label smoothing)", Shape{}, [=] {
         Tensor x = leaf(rows);
         return one(cross_entropy(x, int64_zeros({0}),
                                  CrossEntropyOptions().reduction(Reduction::Sum).label_smoothing(0.1)),
                    {x});
       }},
      {"cross_entropy (none)", Shape{0}, [=] {
         Tensor x = leaf(rows);
         return one(cross_entropy(x, int64_zeros({0}), CrossEntropyOptions().reduction(Reduction::None)), {x});
       }},
      {"reshape, view, transpose, permute, expand", Shape{3, 1, 0}, [=] {
         Tensor x = leaf(rows);
         return one(expand(permute(view(transpose(reshape(x, {-1, 3}), 0, 1), {3, 0, 1}), {0, 2, 1}), {3, 1, 0}), {x});
       }},
      {"narrow of columns", Shape{0, 2}, [=] { Tensor x = leaf(rows); return one(narrow(x, 1, 1, 2), {x}); }},
      {"cat along dim 1", Shape{0, 5},
       [=] { Tensor a = leaf(rows), b = leaf({0, 2}); return one(cat({a, b}, 1), {a, b}); }},
      {"split of columns, the second piece", Shape{0, 2},
       [=] { Tensor x = leaf(rows); return one(split(x, std::vector<int64_t>{1, 2}, 1)[1], {x}); }},
      {"chunk of columns, the first piece", Shape{0, 2},
       [=] { Tensor x = leaf(rows); return one(chunk(x, 2, 1)[0], {x}); }},
      {"to float64", rows, [=] { Tensor x = leaf(rows); return one(to(x, DType::Float64), {x}); }},
      {"masked_fill", rows, [=] { Tensor x = leaf(rows); return one(masked_fill(x, int64_zeros(rows), 1.0), {x}); }},
      {"dropout", rows, [=] { Tensor x = leaf(rows); return one(dropout(x, 0.5, true), {x}); }},
      {"embedding", Shape{0, 4, 3},
       [=] { Tensor w = leaf({5, 3}); return one(embedding(w, int64_zeros({0, 4})), {w}); }},
      {"layer_norm", rows, [=] {
         Tensor x = leaf(rows), w = leaf({3}), b = leaf({3});
         return one(layer_norm(x, {3}, w, b), {x, w, b});
       }},
      {"scaled_dot_product_attention (fused)", Shape{0, 2, 4, 8}, [=] {
         Tensor q = leaf({0, 2, 4, 8}), k = leaf({0, 2, 4, 8}), v = leaf({0, 2, 4, 8});
         return one(scaled_dot_product_attention_fused(q, k, v, true), {q, k, v});
       }},
      {"scaled_dot_product_attention (composed)", Shape{0, 2, 4, 8}, [=] {
         Tensor q = leaf({0, 2, 4, 8}), k = leaf({0, 2, 4, 8}), v = leaf({0, 2, 4, 8});
         return one(scaled_dot_product_attention_composed(q, k, v, true), {q, k, v});
       }},
      {"scaled_dot_product_attention of no positions", Shape{1, 2, 0, 8}, [=] {
         Tensor q = leaf({1, 2, 0, 8});
         return one(scaled_dot_product_attention(q, q, q, true), {q});
       }},
      {"nn::Sequential (Linear, ReLU, Linear: fused)", Shape{0, 2}, [=] {
         auto model = std::make_shared<nn::Sequential>(std::initializer_list<nn::ModulePtr>{
             std::make_shared<nn::Linear>(3, 4), std::make_shared<nn::ReLU>(), std::make_shared<nn::Linear>(4, 2)});
         Tensor x = leaf(rows);
         std::vector<Tensor> leaves{x};
         for (const Tensor& p : model->parameters()) leaves.push_back(p);
         return one((*model)(x), leaves);
       }},
      {"nn::LayerNorm, nn::GELU, nn::Dropout", rows, [=] {
         nn::LayerNorm ln(3);
         nn::GELU gelu_layer;
         nn::Dropout drop(0.5);
         Tensor x = leaf(rows);
         return one(drop(gelu_layer(ln(x))), {x, ln.parameter("weight"), ln.parameter("bias")});
       }},
      {"nn::Embedding", Shape{0, 4, 3}, [=] {
         nn::Embedding e(5, 3);
         return one(e(int64_zeros({0, 4})), {e.parameter("weight")});
       }},
      {"nn::CrossEntropyLoss", Shape{}, [=] {
         Tensor x = leaf(rows);
         return one(nn::CrossEntropyLoss().forward(x, int64_zeros({0})), {x});
       }},
      {"GPT forward", Shape{0, 4, 11}, [=] {
         manual_seed(1);
         auto gpt = std::make_shared<models::GPT>(tiny_gpt());
         return one((*gpt)(int64_zeros({0, 4})), gpt->parameters());
       }},
      {"GPT forward of no positions", Shape{2, 0, 11}, [=] {
         manual_seed(1);
         auto gpt = std::make_shared<models::GPT>(tiny_gpt());
         return one((*gpt)(int64_zeros({2, 0})), gpt->parameters());
       }},
      {"GPT::loss", Shape{}, [=] {
         manual_seed(1);
         auto gpt = std::make_shared<models::GPT>(tiny_gpt());
         return one(models::GPT::loss((*gpt)(int64_zeros({0, 4})), int64_zeros({0, 4})), gpt->parameters());
       }},
      {"GPT::generate", Shape{0, 4}, [=] {
         manual_seed(1);
         models::GPT gpt(tiny_gpt());
         return one(gpt.generate(int64_zeros({0, 1}), 3), {});
       }},
  };
}

}  // namespace

TEST_CASE("empty batch: every op on zero rows gives PyTorch's shape, and backward empty gradients") {
  for (const Case& c : cases()) {
    INFO(c.name);
    const Run r = c.run();
    REQUIRE(r.out.defined());
    CHECK(r.out.shape() == c.shape);
    if (r.leaves.empty()) continue;
    sum(r.out).backward();
    for (size_t i = 0; i < r.leaves.size(); ++i) {
      INFO("leaf " << i << " of shape " << r.leaves[i].shape().str());
      const Tensor g = r.leaves[i].grad();
      REQUIRE(g.defined());
      CHECK(g.shape() == r.leaves[i].shape());
      CHECK(g.dtype() == r.leaves[i].dtype());
      // No row, no contribution: the weights' gradients are zeros (torch's too), NaN-free
      // even where the forward value is NaN (the mean of nothing).
      for (float v : g.contiguous().to_vector<float>()) CHECK(v == 0.0f);
    }
  }
}

TEST_CASE("empty batch: the values PyTorch gives (the mean of nothing is NaN, the sum 0)") {
  CHECK(std::isnan(mean(zeros({0, 3})).item<float>()));
  for (float v : mean(zeros({0, 3}), {0}).to_vector<float>()) CHECK(std::isnan(v));
  CHECK(std::isnan(mean(zeros({3, 0}, DType::Float64), {1}).to_vector<double>()[2]));
  CHECK(sum(zeros({0, 3})).item<float>() == 0.0f);
  const Tensor logits = zeros({0, 3}), targets = int64_zeros({0});
  CHECK(std::isnan(cross_entropy(logits, targets).item<float>()));
  CHECK(cross_entropy(logits, targets, CrossEntropyOptions().reduction(Reduction::Sum)).item<float>() == 0.0f);
  CHECK(std::isnan(cross_entropy(logits, targets, CrossEntropyOptions().label_smoothing(0.1)).item<float>()));
  // The GPT's loss over no tokens: a mean over nothing.
  manual_seed(1);
  models::GPT gpt(tiny_gpt());
  CHECK(std::isnan(models::GPT::loss(gpt(int64_zeros({0, 4})), int64_zeros({0, 4})).item<float>()));
  // generate keeps the prompt's length plus the new tokens, on the prompt's device, int64.
  const Tensor none = gpt.generate(int64_zeros({0, 3}), 5);
  CHECK(none.shape() == Shape{0, 8});
  CHECK(none.dtype() == DType::Int64);
}

TEST_CASE("empty batch: where PyTorch raises, a clear mg::Error") {
  // torch: "argmax(): Expected reduction dim 0 to have non-zero size."
  REQUIRE_THROWS_WITH(zeros({0, 3}).argmax(0),
                      MG_CONTAINS("argmax: expected reduction dim 0 to have non-zero size, got shape [0, 3]"));
  // torch: F.scaled_dot_product_attention has queries and no keys: nothing to average.
  REQUIRE_THROWS_WITH(scaled_dot_product_attention(zeros({1, 2, 4, 8}), zeros({1, 2, 0, 8}), zeros({1, 2, 0, 8})),
                      MG_CONTAINS("expected at least one key, got key of shape [1, 2, 0, 8] for query of shape "
                                  "[1, 2, 4, 8]"));
  // torch: default_collate([]) fails on an empty list (batch[0]).
  const auto dataset = std::make_shared<data::TensorDataset>(zeros({4, 3}), int64_zeros({4}));
  REQUIRE_THROWS_WITH(dataset->get_batch({}), MG_CONTAINS("TensorDataset::get_batch: empty list of indices"));
  // nanoGPT's generate on T = 0 crops nothing and fails on logits[:, -1, :] (no position).
  models::GPT gpt(tiny_gpt());
  REQUIRE_THROWS_WITH(gpt.generate(int64_zeros({2, 0}), 1),
                      MG_CONTAINS("GPT::generate: expected token indices int64 [B, T] with T >= 1, got [2, 0]"));
}

TEST_CASE("empty batch: a DataLoader over an empty dataset yields no batch, as torch's") {
  const auto dataset = std::make_shared<data::TensorDataset>(zeros({0, 3}), int64_zeros({0}));
  for (const bool drop_last : {false, true}) {
    data::DataLoaderOptions options;
    options.batch_size = 4;
    options.drop_last = drop_last;
    data::DataLoader loader(dataset, options);
    CHECK(loader.size() == 0);
    int batches = 0;
    for (const data::Batch& b : loader) {
      (void)b;
      ++batches;
    }
    CHECK(batches == 0);
  }
}

TEST_CASE("empty batch: shuffling an empty dataset is refused, as torch's RandomSampler") {
  const auto dataset = std::make_shared<data::TensorDataset>(zeros({0, 3}), int64_zeros({0}));
  data::DataLoaderOptions options;
  options.shuffle = true;
  // torch: "num_samples should be a positive integer value, but got num_samples=0"
  REQUIRE_THROWS_WITH(data::DataLoader(dataset, options),
                      MG_CONTAINS("RandomSampler: num_samples should be a positive integer value, but got "
                                  "num_samples=0"));
}
