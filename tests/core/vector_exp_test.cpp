// cpu/vector_exp.h's exp against the reference, std::exp in double, and the softmax
// kernels built on it against a double-precision loop, on contiguous and strided rows.
#include "catch_compat.h"

#include <cmath>
#include <cstdlib>
#include <limits>
#include <vector>

#include <minigrad/autograd/functions.h>
#include <minigrad/core/cpu/vector_exp.h>
#include <minigrad/core/generator.h>
#include <minigrad/core/tensor.h>

using namespace mg;

namespace {

// How many floats lie between a and b (both finite or both the same infinity).
int64_t ulps_apart(float a, float b) {
  const auto ia = static_cast<int64_t>(cpu::bits_from_float(a));
  const auto ib = static_cast<int64_t>(cpu::bits_from_float(b));
  return std::llabs(ia - ib);
}

float reference_exp(float x) { return static_cast<float>(std::exp(static_cast<double>(x))); }

}  // namespace

TEST_CASE("vector_exp: within 2 ulp of exp from below the denormals to overflow") {
  int64_t worst = 0;
  float worst_at = 0.0f;
  for (double x = -110.0; x <= 90.0; x += 3e-4) {
    const auto xf = static_cast<float>(x);
    const float want = reference_exp(xf), got = cpu::vector_exp(xf);
    if (std::isinf(want)) {
      CHECK(std::isinf(got));
      continue;
    }
    const int64_t apart = ulps_apart(want, got);
    if (apart > worst) {
      worst = apart;
      worst_at = xf;
    }
  }
  INFO("worst at x = " << worst_at);
  CHECK(worst <= 2);
  // Every float of [-1, 1], where softmax's shifted logits mostly are.
  for (float x = -1.0f; x <= 1.0f; x = std::nextafter(x, 2.0f)) {
    if (ulps_apart(reference_exp(x), cpu::vector_exp(x)) > 2) {
      FAIL("vector_exp(" << x << ") = " << cpu::vector_exp(x) << ", exp = " << reference_exp(x));
    }
  }
}

TEST_CASE("vector_exp: NaN, infinities and the ends of the range as exp") {
  const float inf = std::numeric_limits<float>::infinity();
  CHECK(std::isnan(cpu::vector_exp(std::numeric_limits<float>::quiet_NaN())));
  CHECK(cpu::vector_exp(-inf) == 0.0f);
  CHECK(cpu::vector_exp(inf) == inf);
  CHECK(cpu::vector_exp(0.0f) == 1.0f);
  CHECK(cpu::vector_exp(-1000.0f) == 0.0f);
  CHECK(cpu::vector_exp(1000.0f) == inf);
  CHECK(cpu::vector_exp(89.0f) == inf);                                  // exp(89) > FLT_MAX
  CHECK(std::isfinite(cpu::vector_exp(88.72f)));                        // just below it
  CHECK(cpu::vector_exp(-100.0f) > 0.0f);                               // a denormal
  CHECK(ulps_apart(cpu::vector_exp(-100.0f), reference_exp(-100.0f)) <= 2);
}

TEST_CASE("exp_row: each element as vector_exp of its shifted input, in place too") {
  std::vector<float> in(1003), out(1003);
  for (size_t i = 0; i < in.size(); ++i) in[i] = static_cast<float>(i % 97) * 0.37f - 20.0f;
  in[500] = std::numeric_limits<float>::quiet_NaN();
  cpu::exp_row(out.data(), in.data(), 1.5f, static_cast<int64_t>(in.size()));
  for (size_t i = 0; i < in.size(); ++i) {
    if (i == 500) {
      CHECK(std::isnan(out[i]));
      continue;
    }
    CHECK(out[i] == cpu::vector_exp(in[i] - 1.5f));
  }
  std::vector<float> same = in;
  cpu::exp_row(same.data(), same.data(), 1.5f, static_cast<int64_t>(same.size()));
  for (size_t i = 0; i < in.size(); ++i)
    if (i != 500) CHECK(same[i] == out[i]);
}

TEST_CASE("cross_entropy with label smoothing and its gradient against a double loop, "
          "contiguous and strided logits") {
  manual_seed(11);
  const int64_t rows = 37, cols = 301;
  const double eps = 0.1;
  const Tensor base = mul(randn({rows, cols}), 4.0);
  const Tensor targets = randint(0, cols, {rows});
  const std::vector<float> x = base.to_vector<float>();
  const std::vector<int64_t> t = targets.to_vector<int64_t>();
  // The reference: everything in double, softmax by its definition.
  double want_loss = 0.0;
  std::vector<double> want_grad(x.size());
  for (int64_t i = 0; i < rows; ++i) {
    double max = -1e300, sum = 0.0, mean = 0.0;
    for (int64_t j = 0; j < cols; ++j) max = std::max(max, double(x[size_t(i * cols + j)]));
    for (int64_t j = 0; j < cols; ++j) sum += std::exp(double(x[size_t(i * cols + j)]) - max);
    for (int64_t j = 0; j < cols; ++j) mean += double(x[size_t(i * cols + j)]) / double(cols);
    const double lse = max + std::log(sum);
    const double at_target = double(x[size_t(i * cols + t[size_t(i)])]);
    want_loss += ((1 - eps) * (lse - at_target) + eps * (lse - mean)) / double(rows);
    for (int64_t j = 0; j < cols; ++j) {
      const double p = std::exp(double(x[size_t(i * cols + j)]) - lse);
      const double q = (j == t[size_t(i)] ? 1 - eps : 0.0) + eps / double(cols);
      want_grad[size_t(i * cols + j)] = (p - q) / double(rows);
    }
  }
  const CrossEntropyOptions options = CrossEntropyOptions().label_smoothing(eps);
  // The same logits, once contiguous and once as the transpose of a [cols, rows] tensor.
  for (const bool strided : {false, true}) {
    INFO((strided ? "strided" : "contiguous"));
    Tensor leaf = strided ? base.t().contiguous() : base.contiguous().detach();
    leaf.set_requires_grad(true);
    const Tensor logits = strided ? leaf.t() : leaf;
    REQUIRE(logits.is_contiguous() == !strided);
    const Tensor loss = cross_entropy(logits, targets, options);
    CHECK(loss.item<float>() == Approx(want_loss).epsilon(1e-6));
    loss.backward();
    const std::vector<float> grad = (strided ? leaf.grad().t() : leaf.grad()).to_vector<float>();
    for (size_t k = 0; k < grad.size(); ++k) {
      INFO("element " << k);
      CHECK(grad[k] == Approx(want_grad[k]).margin(1e-8).epsilon(1e-5));
    }
  }
}
