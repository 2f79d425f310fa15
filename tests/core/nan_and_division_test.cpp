// NaN through relu, argmax and what is built on them, and int64 division: PyTorch's
// answers. relu(NaN) used to be 0 (a model with NaN weights then trained on with a finite
// loss), argmax skipped NaN, and x / 0 or INT64_MIN / -1 on int64 killed the process
// with SIGFPE; now relu keeps NaN, NaN is argmax's maximum, and the integer divisions of
// ops::binary are an mg::Error ("ZeroDivisionError", as PyTorch's // says). `/` itself is
// true division (float32), as torch's.
#include "catch_compat.h"

#include <cmath>
#include <cstdint>
#include <limits>
#include <memory>
#include <vector>

#include <minigrad/autograd/functions.h>
#include <minigrad/autograd/grad_mode.h>
#include <minigrad/core/generator.h>
#include <minigrad/core/ops.h>
#include <minigrad/core/tensor.h>
#include <minigrad/nn/layers.h>

using namespace mg;

namespace {
const float kNaN = std::numeric_limits<float>::quiet_NaN();
const float kInf = std::numeric_limits<float>::infinity();
constexpr int64_t kMin = std::numeric_limits<int64_t>::min();

Tensor ints(std::vector<int64_t> v) {
  const auto n = static_cast<int64_t>(v.size());
  return from_vector(std::move(v), {n});
}
}  // namespace

TEST_CASE("NaN: relu keeps it, as PyTorch, the other values are unchanged") {
  const std::vector<float> out =
      relu(from_vector(std::vector<float>{kNaN, -1.0f, 2.0f, -kInf, kInf, -0.0f, 0.0f}, {7})).to_vector<float>();
  CHECK(std::isnan(out[0]));
  CHECK(out[1] == 0.0f);
  CHECK(out[2] == 2.0f);
  CHECK(out[3] == 0.0f);
  CHECK(out[4] == kInf);
  CHECK(out[5] == 0.0f);
  CHECK_FALSE(std::signbit(out[5]));  // relu(-0) is +0, as before
  CHECK(out[6] == 0.0f);
  // A strided input takes the other loop of the CPU backend.
  const Tensor m = from_vector(std::vector<float>{kNaN, 1.0f, -1.0f, kNaN}, {2, 2});
  const std::vector<float> t = relu(m.t()).to_vector<float>();
  CHECK(std::isnan(t[0]));
  CHECK(t[1] == 0.0f);
  CHECK(t[2] == 1.0f);
  CHECK(std::isnan(t[3]));
}

TEST_CASE("NaN: relu's backward passes the gradient where the output is NaN (threshold_backward)") {
  // PyTorch 1.13: relu([nan, -1, 2]).sum().backward() gives grad [1, 0, 1].
  Tensor x = from_vector(std::vector<float>{kNaN, -1.0f, 2.0f}, {3}).set_requires_grad(true);
  relu(x).sum().backward();
  CHECK(x.grad().to_vector<float>() == std::vector<float>{1.0f, 0.0f, 1.0f});
  CHECK(ops::relu_backward(from_vector(std::vector<float>{5.0f, 5.0f}, {2}), from_vector(std::vector<float>{kNaN, 0.0f}, {2}))
            .to_vector<float>() == std::vector<float>{5.0f, 0.0f});
}

TEST_CASE("NaN: linear_relu and a Sequential with NaN weights give NaN, as the unfused ops") {
  manual_seed(11);
  const Tensor x = randn({4, 3});
  const Tensor w = randn({5, 3});
  const Tensor b = randn({5});
  std::vector<float> wv = w.to_vector<float>();
  wv[2 * 3 + 1] = kNaN;  // output feature 2 of every row
  const Tensor wn = from_vector(wv, {5, 3});
  const std::vector<float> fused = linear_relu(x, wn, b).to_vector<float>();
  const std::vector<float> unfused = relu(linear(x, wn, b)).to_vector<float>();
  for (size_t i = 0; i < fused.size(); ++i) {
    CAPTURE(i);
    if (i % 5 == 2) {
      CHECK(std::isnan(fused[i]));
    } else {
      CHECK(fused[i] == unfused[i]);
    }
  }
  // A checkpoint with a NaN weight used to train on with a finite loss (relu hid the NaN).
  auto model = std::make_shared<nn::Sequential>(std::initializer_list<nn::ModulePtr>{
      std::make_shared<nn::Linear>(3, 5), std::make_shared<nn::ReLU>(),
      std::make_shared<nn::Linear>(5, 2)});
  {
    NoGradGuard no_grad;
    model->named_parameters()[0].second.copy_(wn);
  }
  const Tensor loss = cross_entropy(model->forward(x), ints({0, 1, 1, 0}));
  CHECK(std::isnan(loss.item<float>()));
}

TEST_CASE("NaN: argmax takes NaN as the maximum, the first one of a row") {
  CHECK(from_vector(std::vector<float>{1.0f, kNaN, 3.0f}, {3}).argmax().item<int64_t>() == 1);
  CHECK(from_vector(std::vector<float>{1.0f, 3.0f, kNaN}, {3}).argmax().item<int64_t>() == 2);
  CHECK(from_vector(std::vector<float>{kNaN, kNaN, 0.0f}, {3}).argmax().item<int64_t>() == 0);
  CHECK(from_vector(std::vector<float>{-kInf, kNaN}, {2}).argmax().item<int64_t>() == 1);
  CHECK(from_vector(std::vector<float>{2.0f, 2.0f, 1.0f}, {3}).argmax().item<int64_t>() == 0);
  // Over dim 0 (a strided read) and over rows.
  const Tensor m = from_vector(std::vector<float>{1.0f, kNaN, 5.0f, 0.0f, 2.0f, kNaN}, {3, 2});
  CHECK(m.argmax(0).to_vector<int64_t>() == std::vector<int64_t>{1, 0});
  CHECK(m.argmax(1).to_vector<int64_t>() == std::vector<int64_t>{1, 0, 1});
}

TEST_CASE("int64 division: by zero is a ZeroDivisionError, tensor and scalar forms") {
  // ops::binary's Div on int64 is integer division (the backends' kernel); `/` is true
  // division and never meets it (below).
  const Tensor a = ints({7, -7, 3});
  const auto idiv = [](const Tensor& x, const Tensor& y) { return ops::binary(BinaryOp::Div, x, y); };
  REQUIRE_THROWS_WITH(idiv(a, ints({2, 0, 1})),
                      MG_CONTAINS("div") && MG_CONTAINS("ZeroDivisionError") &&
                          MG_CONTAINS("[3]"));
  REQUIRE_THROWS_WITH(ops::binary_scalar(BinaryOp::Div, a, 0.0), MG_CONTAINS("ZeroDivisionError"));
  // Broadcast: one zero in a [1, 2] divisor reaches every row.
  REQUIRE_THROWS_WITH(idiv(ints({1, 2, 3, 4}).view({2, 2}), ints({1, 0}).view({1, 2})),
                      MG_CONTAINS("ZeroDivisionError"));
  // The quotients that exist truncate toward zero, as before; the scalar op too.
  CHECK(idiv(a, ints({2, 2, -2})).to_vector<int64_t>() == std::vector<int64_t>{3, -3, -1});
  CHECK(ops::binary_scalar(BinaryOp::Div, a, 2.0).to_vector<int64_t>() ==
        std::vector<int64_t>{3, -3, 1});
}

TEST_CASE("int64 `/` is true division, as torch's: float32 quotients, IEEE by zero") {
  const Tensor a = ints({7, -7, 3});
  const Tensor q = a / ints({2, 0, 1});
  CHECK(q.dtype() == DType::Float32);
  const std::vector<float> v = q.to_vector<float>();
  CHECK(v[0] == 3.5f);
  CHECK(v[1] == -kInf);
  CHECK(v[2] == 3.0f);
  CHECK((a / 2.0).to_vector<float>() == std::vector<float>{3.5f, -3.5f, 1.5f});
  CHECK((a / 0.0).to_vector<float>()[0] == kInf);
  // float32 / int64 promotes the integers.
  CHECK((from_vector(std::vector<float>{1.0f}, {1}) / ints({4})).to_vector<float>()[0] == 0.25f);
}

TEST_CASE("float division by zero stays IEEE: inf and NaN, no error") {
  const std::vector<float> q = (from_vector(std::vector<float>{1.0f, 0.0f}, {2}) / from_vector(std::vector<float>{0.0f, 0.0f}, {2}))
                                   .to_vector<float>();
  CHECK(q[0] == kInf);
  CHECK(std::isnan(q[1]));
  CHECK((from_vector(std::vector<float>{1.0f}, {1}) / 0.0).item<float>() == kInf);
}
