// The transformer's layers as modules: Embedding, LayerNorm, GELU, Dropout. Each forward
// is its functional op on [B, T, C] activations; PyTorch's initialisation and printing;
// Dropout follows train()/eval(), which reaches every child.
#include "catch_compat.h"

#include <cmath>
#include <memory>
#include <string>
#include <vector>

#include <minigrad/minigrad.h>

namespace nn = mg::nn;
using mg::Shape;
using mg::Tensor;

TEST_CASE("Embedding: rows of the table at [B, T] indices, N(0, 1) weights") {
  mg::manual_seed(3);
  nn::Embedding emb(50, 6);
  CHECK(emb.weight().shape() == Shape{50, 6});
  CHECK(emb.str() == "Embedding(50, 6)");
  const std::vector<float> w = emb.weight().to_vector<float>();
  double mean = 0, sq = 0;
  for (float v : w) {
    mean += v;
    sq += static_cast<double>(v) * v;
  }
  mean /= static_cast<double>(w.size());
  CHECK(std::abs(mean) < 0.2);
  CHECK(std::sqrt(sq / static_cast<double>(w.size())) == Approx(1.0).epsilon(0.15));

  const Tensor idx = mg::from_vector(std::vector<int64_t>{3, 0, 49, 3, 7, 1}, Shape{2, 3});
  const Tensor y = emb(idx);
  CHECK(y.shape() == Shape{2, 3, 6});
  const std::vector<float> out = y.to_vector<float>();
  for (int64_t k = 0; k < 6; ++k) {
    CHECK(out[static_cast<size_t>(k)] == w[static_cast<size_t>(3 * 6 + k)]);
    CHECK(out[static_cast<size_t>(2 * 6 + k)] == w[static_cast<size_t>(49 * 6 + k)]);
  }
  mg::sum(y).backward();
  // Row 3 was used twice: its gradient is 2; unused rows 0.
  const std::vector<float> g = emb.weight().grad().to_vector<float>();
  CHECK(g[3 * 6] == 2.0f);
  CHECK(g[2 * 6] == 0.0f);
  REQUIRE_THROWS_WITH(nn::Embedding(0, 3), MG_CONTAINS("Embedding: num_embeddings and "
                                                       "embedding_dim must be positive, got 0 and 3"));
}

TEST_CASE("LayerNorm: normalises the last dimension, ones and zeros to start, bias optional") {
  nn::LayerNorm ln(4);
  CHECK(ln.str() == "LayerNorm((4,), eps=1e-05, elementwise_affine=True)");
  CHECK(ln.parameter("weight").to_vector<float>() == std::vector<float>{1, 1, 1, 1});
  CHECK(ln.parameter("bias").to_vector<float>() == std::vector<float>{0, 0, 0, 0});
  const Tensor x = mg::from_vector(std::vector<float>{1, 2, 3, 4, -2, 0, 2, 4, 5, 5, 5, 5},
                                   Shape{1, 3, 4});
  const std::vector<float> y = ln(x).to_vector<float>();
  // Row 0: mean 2.5, biased variance 1.25.
  const double sd = std::sqrt(1.25 + 1e-5);
  CHECK(y[0] == Approx(-1.5 / sd));
  CHECK(y[3] == Approx(1.5 / sd));
  CHECK(y[8] == Approx(0.0).margin(1e-6));  // a constant row
  nn::LayerNorm no_bias(4, 1e-5, true, false);
  CHECK(no_bias.named_parameters().size() == 1);
  nn::LayerNorm plain(std::vector<int64_t>{3, 4}, 1e-5, false);
  CHECK(plain.parameters().empty());
  CHECK(plain(x).shape() == Shape{1, 3, 4});
  REQUIRE_THROWS_WITH(nn::LayerNorm(std::vector<int64_t>{4, 0}),
                      MG_CONTAINS("LayerNorm: normalized_shape must be positive sizes, got [4, 0]"));
}

TEST_CASE("GELU: exact and tanh forms, bad approximate named") {
  const Tensor x = mg::from_vector(std::vector<float>{-3.f, -1.f, 0.f, 0.5f, 2.f}, Shape{5});
  const std::vector<float> exact = nn::GELU()(x).to_vector<float>();
  const std::vector<float> approx = nn::GELU("tanh")(x).to_vector<float>();
  const std::vector<float> xs = x.to_vector<float>();
  for (size_t i = 0; i < xs.size(); ++i) {
    const double v = xs[i];
    CHECK(exact[i] == Approx(0.5 * v * (1 + std::erf(v / std::sqrt(2.0)))).margin(1e-6));
    const double inner = std::sqrt(2 / M_PI) * (v + 0.044715 * v * v * v);
    CHECK(approx[i] == Approx(0.5 * v * (1 + std::tanh(inner))).margin(1e-6));
  }
  CHECK(nn::GELU("tanh").str() == "GELU(approximate='tanh')");
  REQUIRE_THROWS_WITH(nn::GELU("fast"),
                      MG_CONTAINS("GELU: approximate must be \"none\" or \"tanh\", got \"fast\""));
}

TEST_CASE("Dropout: zeroes about p and scales the rest in training, the identity in eval") {
  nn::Dropout drop(0.25);
  CHECK(drop.str() == "Dropout(p=0.25, inplace=False)");
  const Tensor x = mg::ones(Shape{4, 64, 32});
  mg::manual_seed(5);
  const std::vector<float> y = drop(x).to_vector<float>();
  size_t zeros = 0;
  for (float v : y) {
    CHECK((v == 0.0f || v == Approx(1.0 / 0.75)));
    zeros += v == 0.0f ? 1 : 0;
  }
  CHECK(static_cast<double>(zeros) / static_cast<double>(y.size()) == Approx(0.25).margin(0.02));
  drop.eval();
  CHECK(drop(x).to_vector<float>() == x.to_vector<float>());
  nn::Dropout none(0.0);
  CHECK(none(x).to_vector<float>() == x.to_vector<float>());
  // A generator of its own: the same seed, the same mask.
  nn::Dropout da(0.5), db(0.5);
  da.set_generator(std::make_shared<mg::Generator>(7));
  db.set_generator(std::make_shared<mg::Generator>(7));
  CHECK(da(x).to_vector<float>() == db(x).to_vector<float>());
  REQUIRE_THROWS_WITH(nn::Dropout(1.5),
                      MG_CONTAINS("Dropout: dropout probability has to be between 0 and 1, but got 1.5"));
}

TEST_CASE("Module::train()/eval(): reach Dropout layers nested in children") {
  auto inner = std::make_shared<nn::Sequential>(
      std::initializer_list<nn::ModulePtr>{std::make_shared<nn::Linear>(8, 8),
                                           std::make_shared<nn::Dropout>(0.5)});
  nn::Sequential outer({inner, std::make_shared<nn::GELU>(), std::make_shared<nn::Dropout>(0.5)});
  const Tensor x = mg::ones(Shape{2, 5, 8});
  outer.eval();
  CHECK_FALSE((*inner)[1]->is_training());
  CHECK_FALSE(outer[2]->is_training());
  CHECK(outer(x).to_vector<float>() == outer(x).to_vector<float>());  // deterministic
  outer.train();
  CHECK((*inner)[1]->is_training());
  CHECK(outer(x).to_vector<float>() != outer(x).to_vector<float>());  // new masks each call
}
