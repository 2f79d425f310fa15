// The transformer's ops beyond their gradients: dropout's mask (identity at p = 0 and in
// eval, one mask per seed and offset, the fraction dropped), embedding's deterministic
// accumulation, values of strided inputs, and every op's errors.
#include "catch_compat.h"
#include "gradcheck.h"

#include <cmath>

#include <minigrad/autograd/functions.h>
#include <minigrad/core/generator.h>
#include <minigrad/core/ops.h>
#include <minigrad/core/philox.h>

using namespace mg;
using mg::testing::random_input;

TEST_CASE("dropout: p = 0 and eval are the identity, one seed, one mask", "[dropout]") {
  const Tensor x = random_input({5, 7}, 1);
  CHECK(dropout(x, 0.0, true).is_same(x));
  CHECK(dropout(x, 0.5, false).is_same(x));
  Generator a(42), b(42), c(43);
  const Tensor ya = dropout(x, 0.3, true, &a), yb = dropout(x, 0.3, true, &b);
  const Tensor yc = dropout(x, 0.3, true, &c);
  CHECK(ya.to_vector<float>() == yb.to_vector<float>());
  CHECK(ya.to_vector<float>() != yc.to_vector<float>());
  // The next draw of a generator takes the next blocks: another mask.
  CHECK(dropout(x, 0.3, true, &a).to_vector<float>() != ya.to_vector<float>());
  // Kept elements are x / (1 - p), the others 0; element i is kept when its Philox uniform
  // (seed 42, offset 0, index i) is >= p, the rule a CUDA kernel follows too.
  const std::vector<float> xv = x.to_vector<float>(), yv = ya.to_vector<float>();
  for (size_t i = 0; i < xv.size(); ++i) {
    const bool keep = philox::uniform(42, 0, i) >= 0.3f;
    CHECK(yv[i] == (keep ? xv[i] * static_cast<float>(1.0 / 0.7) : 0.0f));
  }
  // p = 1 drops everything, without a 1 / 0 scale.
  for (float v : dropout(x, 1.0, true).to_vector<float>()) CHECK(v == 0.0f);
  REQUIRE_THROWS_WITH(dropout(x, 1.5, true), MG_CONTAINS("dropout") && MG_CONTAINS("1.5"));
  REQUIRE_THROWS_WITH(dropout(from_vector(std::vector<int64_t>{1}, {1}), 0.5, true),
                      MG_CONTAINS("dropout") && MG_CONTAINS("int64"));
}

TEST_CASE("dropout: the fraction dropped is near p, the mean kept", "[dropout]") {
  const Tensor x = ones({100000});
  for (double p : {0.1, 0.5, 0.9}) {
    const std::vector<float> y = dropout(x, p, true).to_vector<float>();
    double zeros = 0.0, total = 0.0;
    for (float v : y) {
      zeros += v == 0.0f ? 1.0 : 0.0;
      total += v;
    }
    CHECK(zeros / 1e5 == Approx(p).margin(0.01));
    CHECK(total / 1e5 == Approx(1.0).margin(0.03));
  }
  // A strided input: the mask follows the output's element order.
  Generator g1(5), g2(5);
  const Tensor m = random_input({6, 9}, 2);
  CHECK(dropout(m.t(), 0.5, true, &g1).to_vector<float>() ==
        dropout(m.t().contiguous(), 0.5, true, &g2).to_vector<float>());
}

TEST_CASE("embedding: rows by index, repeated indices sum in order, errors", "[embedding]") {
  const Tensor w = from_vector(std::vector<float>{0, 1, 10, 11, 20, 21}, {3, 2});
  const Tensor idx = from_vector(std::vector<int64_t>{2, 0, 2, 2}, {2, 2});
  const Tensor y = embedding(w, idx);
  CHECK(y.shape() == Shape{2, 2, 2});
  CHECK(y.to_vector<float>() == std::vector<float>{20, 21, 0, 1, 20, 21, 20, 21});
  // Strided indices (a transpose) and a strided table.
  CHECK(embedding(w, idx.t()).to_vector<float>() == std::vector<float>{20, 21, 20, 21, 0, 1, 20, 21});
  CHECK(embedding(w.t().contiguous().t(), idx).to_vector<float>() == y.to_vector<float>());
  Tensor leaf = ops::clone(w);
  leaf.set_requires_grad(true);
  embedding(leaf, idx).sum().backward();
  CHECK(leaf.grad().to_vector<float>() == std::vector<float>{1, 1, 0, 0, 3, 3});

  REQUIRE_THROWS_WITH(embedding(w, from_vector(std::vector<int64_t>{0, 3}, {2})),
                      MG_CONTAINS("embedding") && MG_CONTAINS("index 3") &&
                          MG_CONTAINS("position 1") && MG_CONTAINS("3 rows"));
  REQUIRE_THROWS_WITH(embedding(w, from_vector(std::vector<int64_t>{-1}, {1})),
                      MG_CONTAINS("index -1"));
  REQUIRE_THROWS_WITH(embedding(w, from_vector(std::vector<float>{0.0f}, {1})),
                      MG_CONTAINS("embedding") && MG_CONTAINS("int64") && MG_CONTAINS("float32"));
  REQUIRE_THROWS_WITH(embedding(from_vector(std::vector<float>{0.0f}, {1}), idx),
                      MG_CONTAINS("embedding") && MG_CONTAINS("[1]"));
}

TEST_CASE("layer_norm: values, strided input, errors", "[layer_norm]") {
  const Tensor x = from_vector(std::vector<double>{1, 2, 3, 4, 10, 20, 30, 40}, {2, 4});
  const Tensor y = layer_norm(x, {4}, Tensor(), Tensor(), 0.0);
  const double s = 1.0 / std::sqrt(1.25);  // the biased variance of 1..4 is 1.25
  const std::vector<double> v = y.to_vector<double>();
  CHECK(v[0] == Approx(-1.5 * s).epsilon(1e-12));
  CHECK(v[7] == Approx(1.5 * s).epsilon(1e-12));
  // A transposed input normalises the same rows.
  const Tensor yt = layer_norm(x.t().contiguous().t(), std::vector<int64_t>{4});
  const Tensor ye = layer_norm(x, Shape{4});
  CHECK(yt.to_vector<double>() == ye.to_vector<double>());
  const Tensor w = from_vector(std::vector<double>{1, 2, 3, 4}, {4});
  const Tensor b = from_vector(std::vector<double>{0, 0, 0, 1}, {4});
  CHECK(layer_norm(x, {4}, w, b, 0.0).to_vector<double>()[3] == Approx(4 * 1.5 * s + 1).epsilon(1e-12));
  REQUIRE_THROWS_WITH(layer_norm(x, {3}), MG_CONTAINS("layer_norm") && MG_CONTAINS("[3]") &&
                                              MG_CONTAINS("[2, 4]"));
  REQUIRE_THROWS_WITH(layer_norm(x, {4}, from_vector(std::vector<double>{1, 2}, {2})),
                      MG_CONTAINS("layer_norm") && MG_CONTAINS("weight") && MG_CONTAINS("[2]"));
  REQUIRE_THROWS_WITH(layer_norm(x, {4}, ops::to_dtype(w, DType::Float32)),
                      MG_CONTAINS("weight") && MG_CONTAINS("float32"));
}

TEST_CASE("gelu, tanh, softmax, masked_fill, permute: values and errors", "[gelu][masked_fill]") {
  const Tensor x = from_vector(std::vector<double>{-1.0, 0.0, 0.5}, {3});
  const std::vector<double> exact = gelu(x).to_vector<double>();
  CHECK(exact[0] == Approx(-0.5 * (1 + std::erf(-1 / std::sqrt(2.0)))).epsilon(1e-14));
  CHECK(exact[1] == 0.0);
  const std::vector<double> approx = gelu(x, "tanh").to_vector<double>();
  const double k = std::sqrt(2 / M_PI);
  CHECK(approx[2] == Approx(0.25 * (1 + std::tanh(k * (0.5 + 0.044715 * 0.125)))).epsilon(1e-14));
  REQUIRE_THROWS_WITH(gelu(x, "fast"), MG_CONTAINS("gelu") && MG_CONTAINS("fast"));
  CHECK(tanh(x).to_vector<double>()[2] == std::tanh(0.5));
  CHECK(x.tanh().to_vector<double>()[0] == std::tanh(-1.0));

  // softmax over dim 0 of a strided input; a row of -inf is NaN, as torch.
  const Tensor m = from_vector(std::vector<float>{0, 1, 2, 3, 4, 5}, {2, 3});
  const std::vector<float> s0 = softmax(m.t(), 1).to_vector<float>();
  CHECK(s0[0] == Approx(1 / (1 + std::exp(3.0))));
  CHECK(m.softmax(0).to_vector<float>()[3] == Approx(1 / (1 + std::exp(-3.0))));
  const Tensor neg_inf = full({1, 2}, -INFINITY);
  CHECK(std::isnan(softmax(neg_inf, -1).to_vector<float>()[0]));

  const Tensor mask = from_vector(std::vector<int64_t>{0, 1, 0}, {1, 3});
  CHECK(masked_fill(m, mask, -1.0).to_vector<float>() == std::vector<float>{0, -1, 2, 3, -1, 5});
  CHECK(masked_fill(m.t(), mask.t(), 9.0).to_vector<float>() ==
        std::vector<float>{0, 3, 9, 9, 2, 5});
  REQUIRE_THROWS_WITH(masked_fill(m, from_vector(std::vector<int64_t>{1, 0}, {2}), 0.0),
                      MG_CONTAINS("masked_fill") && MG_CONTAINS("[2]") && MG_CONTAINS("[2, 3]"));
  // The mask broadcasts to x, never x to the mask.
  REQUIRE_THROWS_WITH(masked_fill(m, full({2, 2, 3}, 1.0), 0.0),
                      MG_CONTAINS("masked_fill") && MG_CONTAINS("[2, 2, 3]"));

  const Tensor p = m.view({1, 2, 3}).permute({2, 0, 1});
  CHECK(p.shape() == Shape{3, 1, 2});
  CHECK(p.storage().data() == m.storage().data());  // a view
  CHECK(p.contiguous().to_vector<float>() == std::vector<float>{0, 3, 1, 4, 2, 5});
  REQUIRE_THROWS_WITH(m.permute({0}), MG_CONTAINS("permute") && MG_CONTAINS("[2, 3]"));
  REQUIRE_THROWS_WITH(m.permute({1, 1}), MG_CONTAINS("permute") && MG_CONTAINS("more than once"));
  REQUIRE_THROWS_WITH(m.permute({0, 2}), MG_CONTAINS("permute"));
}

TEST_CASE("split, chunk and cat along inner dims, split by size", "[split]") {
  const Tensor m = from_vector(std::vector<float>{0, 1, 2, 3, 4, 5, 6, 7, 8, 9}, {2, 5});
  const auto pieces = split(m, 2, 1);
  REQUIRE(pieces.size() == 3);
  CHECK(pieces[2].shape() == Shape{2, 1});
  CHECK(pieces[1].contiguous().to_vector<float>() == std::vector<float>{2, 3, 7, 8});
  const auto chunks = chunk(m, 2, -1);
  REQUIRE(chunks.size() == 2);
  CHECK(chunks[0].shape() == Shape{2, 3});
  CHECK(cat({chunks[1], chunks[0]}, 1).to_vector<float>() ==
        std::vector<float>{3, 4, 0, 1, 2, 8, 9, 5, 6, 7});
  REQUIRE_THROWS_WITH(split(m, 0, 1), MG_CONTAINS("split") && MG_CONTAINS("positive"));
}

TEST_CASE("matmul and linear on batched and 1-D operands: shapes and values", "[matmul]") {
  const Tensor a = random_input({2, 3, 4, 5}, 3), b = random_input({3, 5, 2}, 4);
  const Tensor c = matmul(a, b);
  CHECK(c.shape() == Shape{2, 3, 4, 2});
  // Each matrix of the batch is the 2-D product of its operands.
  for (int64_t i = 0; i < 2; ++i)
    for (int64_t j = 0; j < 3; ++j) {
      const Tensor expect = matmul(a.narrow(0, i, 1).narrow(1, j, 1).reshape({4, 5}),
                                   b.narrow(0, j, 1).reshape({5, 2}));
      CHECK(c.narrow(0, i, 1).narrow(1, j, 1).reshape({4, 2}).to_vector<float>() ==
            expect.to_vector<float>());
    }
  CHECK(matmul(random_input({5}, 5), random_input({5}, 6)).dim() == 0);
  CHECK(matmul(random_input({5}, 5), b).shape() == Shape{3, 2});
  CHECK(matmul(a, random_input({5}, 6)).shape() == Shape{2, 3, 4});
  CHECK(linear(a, random_input({7, 5}, 7), random_input({7}, 8)).shape() == Shape{2, 3, 4, 7});
  REQUIRE_THROWS_WITH(linear(a, random_input({7, 4}, 7)),
                      MG_CONTAINS("linear") && MG_CONTAINS("[2, 3, 4, 5]") && MG_CONTAINS("[7, 4]"));
}

TEST_CASE("gelu in float32 (vectorised erf and tanh) agrees with float64's library functions",
          "[gelu]") {
  // Every 1/64 from -8 to 8, where erf and tanh saturate, and a few far out.
  std::vector<double> xs;
  for (int i = -512; i <= 512; ++i) xs.push_back(i / 64.0);
  for (double far : {-100.0, -30.0, 30.0, 100.0}) xs.push_back(far);
  const Tensor x64 = from_vector(xs, {static_cast<int64_t>(xs.size())});
  const Tensor x32 = ops::to_dtype(x64, DType::Float32);
  const Tensor g64 = full(x64.shape(), 1.0, DType::Float64);
  for (bool tanh_form : {false, true}) {
    INFO("tanh form " << tanh_form);
    const std::vector<double> want = ops::gelu(x64, tanh_form).to_vector<double>();
    const std::vector<float> got = ops::gelu(x32, tanh_form).to_vector<float>();
    const std::vector<double> want_grad =
        ops::gelu_backward(g64, x64, tanh_form).to_vector<double>();
    const std::vector<float> got_grad =
        ops::gelu_backward(ops::to_dtype(g64, DType::Float32), x32, tanh_form).to_vector<float>();
    for (size_t i = 0; i < xs.size(); ++i) {
      INFO("x = " << xs[i]);
      CHECK(std::fabs(got[i] - want[i]) <= 1e-6 + 1e-6 * std::fabs(want[i]));
      CHECK(std::fabs(got_grad[i] - want_grad[i]) <= 2e-6);
    }
    // A strided input gives the bits of the contiguous one (whose loop may be the AVX2
    // clone, cpu/target_clones.h, while the strided loop is the baseline's).
    const Tensor m = ops::to_dtype(random_input({7, 9}, 3, -4.0, 4.0), DType::Float32);
    const Tensor gm = ops::to_dtype(random_input({7, 9}, 4, -2.0, 2.0), DType::Float32);
    CHECK(ops::gelu(m.t(), tanh_form).contiguous().to_vector<float>() ==
          ops::gelu(m.t().contiguous(), tanh_form).to_vector<float>());
    CHECK(ops::gelu_backward(gm.t(), m.t(), tanh_form).contiguous().to_vector<float>() ==
          ops::gelu_backward(gm.t().contiguous(), m.t().contiguous(), tanh_form).to_vector<float>());
  }
}
