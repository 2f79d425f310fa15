// The optimizers and gradient clipping in float64, as gradient checks and tight parity
// tests train: AdamW, Adam and SGD step float64 parameters by the composition of
// elementwise ops (the fused kernels are float32's), to within a few ulps of double of
// their formula; float32 and float64 parameters step side by side in one optimizer; the
// norm of float64 gradients is float64.
#include "catch_compat.h"

#include <cmath>
#include <vector>

#include <minigrad/minigrad.h>

namespace optim = mg::optim;
namespace utils = mg::nn::utils;
using mg::DType;
using mg::Shape;
using mg::Tensor;

namespace {

constexpr int64_t kN = 29;

std::vector<double> pattern(double a, double b, double scale) {
  std::vector<double> v(static_cast<size_t>(kN));
  for (size_t i = 0; i < v.size(); ++i) v[i] = scale * std::sin(a * static_cast<double>(i) + b);
  return v;
}

Tensor parameter64(const std::vector<double>& values) {
  return mg::from_vector(values, Shape{kN}).set_requires_grad(true);
}

// The gradient of step t: scale_t * (c * p + d), from the current parameter, in double.
std::vector<double> gradient(const std::vector<double>& p, int t) {
  const auto c = pattern(1.3, 0.1, 1.0), d = pattern(0.4, 2.0, 0.5);
  const double scale = 1.0 / (1.0 + t);
  std::vector<double> g(p.size());
  for (size_t i = 0; i < p.size(); ++i) g[i] = scale * (c[i] * p[i] + d[i]);
  return g;
}

void check_close(const std::vector<double>& got, const std::vector<double>& want, double tol) {
  REQUIRE(got.size() == want.size());
  for (size_t i = 0; i < got.size(); ++i) {
    INFO("element " << i);
    CHECK(got[i] == Approx(want[i]).margin(tol));
  }
}

}  // namespace

TEST_CASE("AdamW and Adam step float64 parameters by their formula, in double") {
  for (const bool decoupled : {true, false}) {
    INFO((decoupled ? "AdamW" : "Adam"));
    const double lr = 1e-2, beta1 = 0.9, beta2 = 0.95, eps = 1e-8, wd = 0.1;
    Tensor p = parameter64(pattern(0.7, 0.3, 1.5));
    std::unique_ptr<optim::Optimizer> opt;
    if (decoupled) {
      opt = std::make_unique<optim::AdamW>(
          std::vector<Tensor>{p}, optim::AdamWOptions(lr).betas({beta1, beta2}).eps(eps).weight_decay(wd));
    } else {
      opt = std::make_unique<optim::Adam>(
          std::vector<Tensor>{p}, optim::AdamOptions(lr).betas({beta1, beta2}).eps(eps).weight_decay(wd));
    }
    std::vector<double> want = p.to_vector<double>(), m(kN), v(kN);
    for (int t = 1; t <= 5; ++t) {
      const std::vector<double> g0 = gradient(p.to_vector<double>(), t);
      p.set_grad(mg::from_vector(g0, Shape{kN}));
      opt->step();
      for (size_t i = 0; i < want.size(); ++i) {
        double g = g0[i];
        if (decoupled) want[i] *= 1.0 - lr * wd; else g += wd * want[i];
        m[i] = beta1 * m[i] + (1.0 - beta1) * g;
        v[i] = beta2 * v[i] + (1.0 - beta2) * g * g;
        const double bc1 = 1.0 - std::pow(beta1, t), bc2 = 1.0 - std::pow(beta2, t);
        want[i] -= lr / bc1 * m[i] / (std::sqrt(v[i]) / std::sqrt(bc2) + eps);
      }
      INFO("after step " << t);
      REQUIRE(p.dtype() == DType::Float64);
      // Double against double: the composition rounds in another order, a few ulps.
      check_close(p.to_vector<double>(), want, 1e-14);
    }
    const auto state = opt->state_dict();
    for (const auto& [key, tensor] : state)
      if (key.find("exp_avg") != std::string::npos) CHECK(tensor.dtype() == DType::Float64);
  }
}

TEST_CASE("SGD with momentum steps float64 parameters by its formula") {
  const double lr = 0.05, momentum = 0.9, wd = 0.01;
  Tensor p = parameter64(pattern(0.2, 1.0, 2.0));
  optim::SGD sgd({p}, optim::SGDOptions(lr).momentum(momentum).weight_decay(wd).nesterov(true));
  std::vector<double> want = p.to_vector<double>(), buf(kN);
  for (int t = 1; t <= 4; ++t) {
    const std::vector<double> g0 = gradient(p.to_vector<double>(), t);
    p.set_grad(mg::from_vector(g0, Shape{kN}));
    sgd.step();
    for (size_t i = 0; i < want.size(); ++i) {
      const double d = g0[i] + wd * want[i];
      buf[i] = t == 1 ? d : momentum * buf[i] + d;
      want[i] -= lr * (d + momentum * buf[i]);
    }
    check_close(p.to_vector<double>(), want, 1e-14);
  }
}

TEST_CASE("One AdamW steps float32 and float64 parameters side by side") {
  Tensor p32 = mg::from_vector(std::vector<float>{1.0f, -2.0f, 0.5f}, Shape{3}).set_requires_grad(true);
  Tensor p64 = mg::from_vector(std::vector<double>{1.0, -2.0, 0.5}, Shape{3}).set_requires_grad(true);
  optim::AdamW opt({p32, p64}, optim::AdamWOptions(0.1));
  for (int t = 0; t < 3; ++t) {
    p32.set_grad(mg::from_vector(std::vector<float>{0.3f, -0.1f, 2.0f}, Shape{3}));
    p64.set_grad(mg::from_vector(std::vector<double>{0.3, -0.1, 2.0}, Shape{3}));
    opt.step();
  }
  const auto a = p32.to_vector<float>();
  const auto b = p64.to_vector<double>();
  CHECK(p32.dtype() == DType::Float32);
  CHECK(p64.dtype() == DType::Float64);
  for (size_t i = 0; i < a.size(); ++i) CHECK(a[i] == Approx(b[i]).margin(1e-6));
}

TEST_CASE("clip_grad_norm_ on float64 gradients: a float64 norm, the formula in double") {
  Tensor a = parameter64(pattern(0.3, 0.2, 3.0));
  Tensor b = mg::from_vector(std::vector<double>{4.0, -1e-3}, Shape{2}).set_requires_grad(true);
  a.set_grad(mg::from_vector(pattern(0.9, 0.4, 2.0), Shape{kN}));
  b.set_grad(mg::from_vector(std::vector<double>{4.0, -1e-3}, Shape{2}));
  double squares = 16.0 + 1e-6;
  for (const double g : pattern(0.9, 0.4, 2.0)) squares += g * g;
  const double norm = std::sqrt(squares);
  const Tensor total = utils::clip_grad_norm_({a, b}, 1.0);
  REQUIRE(total.dtype() == DType::Float64);
  CHECK(total.item<double>() == Approx(norm).epsilon(1e-14));
  const double coef = 1.0 / (norm + 1e-6);
  CHECK(b.grad().to_vector<double>()[0] == Approx(4.0 * coef).epsilon(1e-14));

  // One dtype throughout: a float32 gradient among float64 ones is named.
  Tensor c = mg::from_vector(std::vector<float>{1.0f}, Shape{1}).set_requires_grad(true);
  c.set_grad(mg::from_vector(std::vector<float>{1.0f}, Shape{1}));
  REQUIRE_THROWS_WITH(utils::clip_grad_norm_({a, c}, 1.0),
                      MG_CONTAINS("clip_grad_norm_: gradient 1 is float32 (shape [1]), expected "
                                  "a float64 tensor"));
}
