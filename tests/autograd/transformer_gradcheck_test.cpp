// The transformer's ops against finite differences in float64 (torch.autograd.gradcheck's
// tolerances), at odd sizes, with strided (transposed, narrowed) inputs taken inside the
// checked function so their views' backward is checked too.
#include "catch_compat.h"
#include "gradcheck.h"

#include <cmath>

#include <minigrad/autograd/functions.h>
#include <minigrad/autograd/node.h>
#include <minigrad/core/generator.h>
#include <minigrad/core/ops.h>

using namespace mg;
using mg::testing::Gradcheck64;
using mg::testing::random_input;
using Inputs = std::vector<Tensor>;

namespace {
Tensor r64(const Shape& shape, uint64_t seed, double low = -1.0, double high = 1.0) {
  return random_input(shape, seed, low, high, DType::Float64);
}
}  // namespace

TEST_CASE("gradcheck float64: the checker works in double and catches a wrong gradient",
          "[float64]") {
  const Tensor x = r64({3, 5}, 1);
  CHECK_GRADCHECK([](const Inputs& in) { return mul(in[0], in[0]); }, {x}, Gradcheck64());
  // A gradient 0.5% off passes float32's tolerances (rtol 1e-2), not float64's.
  auto off = [](const Inputs& in) {
    Tensor out = ops::clone(in[0]);
    record_function("Off", {in[0]}, {out}, [](const BackwardArgs& g) {
      return std::vector<Tensor>{ops::binary_scalar(BinaryOp::Mul, g.grad(), 1.005)};
    });
    return out;
  };
  CHECK_FALSE(mg::testing::gradcheck(off, {x}, Gradcheck64()).ok);
  CHECK(mg::testing::gradcheck(off, {ops::to_dtype(x, DType::Float32)}).ok);
}

TEST_CASE("gradcheck float64: matmul with torch.matmul's shapes", "[matmul][float64]") {
  const auto check = [](const Shape& sa, const Shape& sb) {
    INFO(fmt::format("{} @ {}", sa, sb));
    CHECK_GRADCHECK([](const Inputs& in) { return matmul(in[0], in[1]); },
                    {r64(sa, 2), r64(sb, 3)}, Gradcheck64());
  };
  check({5}, {5});             // dot
  check({5}, {5, 3});          // vector @ matrix
  check({3, 5}, {5});          // matrix @ vector
  check({2, 3, 5}, {5});       // batched @ vector
  check({5}, {2, 5, 3});       // vector @ batched
  check({2, 3, 5}, {5, 4});    // [B, T, C] @ [C, D]
  check({3, 5}, {2, 5, 4});    // broadcast matrix @ batch
  check({2, 1, 3, 5}, {3, 5, 2});  // broadcast batch dims [2, 1] and [3]
  check({2, 3, 3, 5}, {2, 3, 5, 3});
  // Transposed operands: strided views straight into the GEMM.
  CHECK_GRADCHECK(
      [](const Inputs& in) { return matmul(in[0].transpose(-1, -2), in[1].transpose(0, 2)); },
      {r64({2, 5, 3}, 4), r64({4, 5, 2}, 5)}, Gradcheck64());
}

TEST_CASE("gradcheck float64: linear on [B, T, C] inputs", "[linear][float64]") {
  CHECK_GRADCHECK([](const Inputs& in) { return linear(in[0], in[1], in[2]); },
                  {r64({2, 3, 5}, 6), r64({4, 5}, 7), r64({4}, 8)}, Gradcheck64());
  CHECK_GRADCHECK([](const Inputs& in) { return linear(in[0].transpose(0, 1), in[1]); },
                  {r64({3, 2, 5}, 9), r64({4, 5}, 10)}, Gradcheck64());
  CHECK_GRADCHECK([](const Inputs& in) { return linear(in[0], in[1], in[2]); },
                  {r64({5}, 11), r64({3, 5}, 12), r64({3}, 13)}, Gradcheck64());
}

TEST_CASE("gradcheck float64: embedding, repeated indices summed", "[embedding][float64]") {
  const Tensor idx = from_vector(std::vector<int64_t>{3, 0, 3, 6, 1, 3}, {2, 3});
  CHECK_GRADCHECK([idx](const Inputs& in) { return embedding(in[0], idx); }, {r64({7, 5}, 14)},
                  Gradcheck64());
  // A strided table (a transposed view).
  CHECK_GRADCHECK([idx](const Inputs& in) { return embedding(in[0].t(), idx); },
                  {r64({5, 7}, 15)}, Gradcheck64());
}

TEST_CASE("gradcheck float64: layer_norm with and without weight and bias",
          "[layer_norm][float64]") {
  CHECK_GRADCHECK([](const Inputs& in) { return layer_norm(in[0], {7}, in[1], in[2]); },
                  {r64({3, 7}, 16), r64({7}, 17), r64({7}, 18)}, Gradcheck64());
  CHECK_GRADCHECK([](const Inputs& in) { return layer_norm(in[0], {7}); }, {r64({2, 3, 7}, 19)},
                  Gradcheck64());
  CHECK_GRADCHECK(
      [](const Inputs& in) { return layer_norm(in[0], Shape{3, 5}, in[1], Tensor(), 1e-3); },
      {r64({2, 3, 5}, 20), r64({3, 5}, 21)}, Gradcheck64());
  CHECK_GRADCHECK(
      [](const Inputs& in) { return layer_norm(in[0].transpose(0, 1), {3}, Tensor(), in[1]); },
      {r64({3, 5}, 22), r64({3}, 23)}, Gradcheck64());
}

TEST_CASE("gradcheck float64: rms_norm with and without weight", "[rms_norm][llama][float64]") {
  CHECK_GRADCHECK([](const Inputs& in) { return rms_norm(in[0], {7}, in[1]); }, {r64({2, 3, 7}, 41), r64({7}, 42)},
                  Gradcheck64());
  CHECK_GRADCHECK([](const Inputs& in) { return rms_norm(in[0].transpose(0, 1), {3}, Tensor(), 1e-3); },
                  {r64({3, 5}, 43)}, Gradcheck64());
  CHECK_GRADCHECK([](const Inputs& in) { return rms_norm(in[0], Shape{3, 5}, in[1]); },
                  {r64({2, 3, 5}, 44), r64({3, 5}, 45)}, Gradcheck64());
}

TEST_CASE("gradcheck float64: silu over both signs", "[silu][llama][float64]") {
  CHECK_GRADCHECK([](const Inputs& in) { return silu(in[0].t()); }, {r64({3, 7}, 46, -6.0, 6.0)}, Gradcheck64());
}

TEST_CASE("gradcheck float64: rotary_embedding at odd positions and on a strided input", "[rotary][llama][float64]") {
  // Tables of angles at positions 2, 5, 9 (theta 10000, D = 6), as a Llama builds them.
  std::vector<double> c, s;
  for (int p : {2, 5, 9})
    for (int i = 0; i < 3; ++i) {
      const double angle = p * std::pow(10000.0, -2.0 * i / 6.0);
      c.push_back(std::cos(angle));
      s.push_back(std::sin(angle));
    }
  const Tensor cos = from_vector(c, {3, 3}), sin = from_vector(s, {3, 3});
  CHECK_GRADCHECK([&](const Inputs& in) { return rotary_embedding(in[0], cos, sin); }, {r64({2, 3, 2, 6}, 47)},
                  Gradcheck64());
  CHECK_GRADCHECK([&](const Inputs& in) { return rotary_embedding(in[0].transpose(1, 2), cos, sin); },
                  {r64({2, 2, 3, 6}, 48)}, Gradcheck64());
}

TEST_CASE("gradcheck float64: gelu (both forms) and tanh", "[gelu][tanh][float64]") {
  const Tensor x = r64({3, 7}, 24, -3.0, 3.0);
  CHECK_GRADCHECK([](const Inputs& in) { return gelu(in[0]); }, {x}, Gradcheck64());
  CHECK_GRADCHECK([](const Inputs& in) { return gelu(in[0], "tanh"); }, {x}, Gradcheck64());
  CHECK_GRADCHECK([](const Inputs& in) { return tanh(in[0].t()); }, {x}, Gradcheck64());
}

TEST_CASE("gradcheck float64: softmax and log_softmax over every dim", "[softmax][float64]") {
  const Tensor x = r64({3, 4, 5}, 25, -2.0, 2.0);
  for (int64_t dim : {0, 1, 2, -1}) {
    INFO("dim " << dim);
    CHECK_GRADCHECK([dim](const Inputs& in) { return softmax(in[0], dim); }, {x}, Gradcheck64());
    CHECK_GRADCHECK([dim](const Inputs& in) { return log_softmax(in[0], dim); }, {x},
                    Gradcheck64());
  }
  CHECK_GRADCHECK([](const Inputs& in) { return softmax(in[0].transpose(0, 2), 1); }, {x},
                  Gradcheck64());
}

TEST_CASE("gradcheck float64: masked_fill with a broadcast mask", "[masked_fill][float64]") {
  const Tensor mask = from_vector(std::vector<int64_t>{1, 0, 0, 1, 0}, {1, 5});
  CHECK_GRADCHECK([mask](const Inputs& in) { return masked_fill(in[0], mask, -7.5); },
                  {r64({3, 5}, 26)}, Gradcheck64());
  const Tensor float_mask = from_vector(std::vector<float>{0.0f, 2.0f, 0.0f}, {3, 1});
  CHECK_GRADCHECK([float_mask](const Inputs& in) { return masked_fill(in[0], float_mask, 1.0); },
                  {r64({3, 5}, 27)}, Gradcheck64());
}

TEST_CASE("gradcheck float64: dropout with a fixed generator state", "[dropout][float64]") {
  Generator gen(1234);
  // Each evaluation redraws from the same state, so f is one fixed function of x.
  CHECK_GRADCHECK(
      [&gen](const Inputs& in) {
        gen.set_state({1234, 0});
        return dropout(in[0].t(), 0.4, true, &gen);
      },
      {r64({5, 7}, 28)}, Gradcheck64());
}

TEST_CASE("gradcheck float64: permute, split, chunk and cat on inner dims",
          "[permute][float64]") {
  const Tensor x = r64({2, 3, 5}, 29);
  CHECK_GRADCHECK([](const Inputs& in) { return permute(in[0], {2, 0, 1}); }, {x}, Gradcheck64());
  CHECK_GRADCHECK([](const Inputs& in) { return in[0].permute({-1, 1, 0}).contiguous(); }, {x},
                  Gradcheck64());
  CHECK_GRADCHECK(
      [](const Inputs& in) {
        const auto pieces = split(in[0], 2, 2);  // sizes 2, 2, 1 on the last dim
        return cat({pieces[2], mul(pieces[0], pieces[1])}, 2);
      },
      {x}, Gradcheck64());
  CHECK_GRADCHECK(
      [](const Inputs& in) {
        const auto pieces = chunk(in[0], 3, 1);
        return cat({pieces[1], pieces[0], pieces[2]}, -2);
      },
      {x}, Gradcheck64());
}

TEST_CASE("gradcheck float64: to(dtype) and promotion carry gradients back in each dtype",
          "[float64]") {
  CHECK_GRADCHECK([](const Inputs& in) { return to(in[0], DType::Float32).to(DType::Float64); },
                  {r64({3, 4}, 30)}, mg::testing::GradcheckOptions{1e-3, 1e-4, 1e-3});
  // float32 * float64 computes in float64; each input gets its gradient in its own dtype.
  CHECK_GRADCHECK([](const Inputs& in) { return mul(in[0], in[1]); },
                  {random_input({3, 4}, 31), r64({3, 4}, 32)});
}

TEST_CASE("gradcheck float64: scaled_dot_product_attention, composed and fused",
          "[attention][float64]") {
  for (bool causal : {false, true}) {
    for (bool fused : {false, true}) {
      INFO("causal " << causal << ", fused " << fused);
      const auto f = [causal, fused](const Inputs& in) {
        return fused ? scaled_dot_product_attention_fused(in[0], in[1], in[2], causal)
                     : scaled_dot_product_attention_composed(in[0], in[1], in[2], causal);
      };
      // L = 5 queries, S = 5 keys, E = 3, Ev = 4, batch [2, 1]; and a strided query.
      CHECK_GRADCHECK(f, {r64({2, 1, 5, 3}, 33), r64({2, 1, 5, 3}, 34), r64({2, 1, 5, 4}, 35)},
                      Gradcheck64());
      const auto g = [f](const Inputs& in) { return f({in[0].transpose(-1, -2), in[1], in[2]}); };
      CHECK_GRADCHECK(g, {r64({3, 3, 7}, 36), r64({3, 6, 3}, 37), r64({3, 6, 2}, 38)},
                      Gradcheck64());
    }
  }
  // With dropout, redrawn from one generator state per evaluation.
  Generator gen(99);
  CHECK_GRADCHECK(
      [&gen](const Inputs& in) {
        gen.set_state({99, 0});
        return scaled_dot_product_attention_fused(in[0], in[1], in[2], true, 0.3, &gen);
      },
      {r64({2, 7, 3}, 39), r64({2, 7, 3}, 40), r64({2, 7, 3}, 41)}, Gradcheck64());
}
