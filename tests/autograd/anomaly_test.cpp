// Anomaly detection (autograd/anomaly_mode.h): with DetectAnomalyGuard the engine names
// the first backward that produced a NaN or an infinity, and what created it in forward.
#include "catch_compat.h"

#include <cmath>

#include <minigrad/autograd/anomaly_mode.h>
#include <minigrad/autograd/functions.h>

using namespace mg;

namespace {
Tensor leaf(const std::vector<float>& values) {
  return from_vector(values, {static_cast<int64_t>(values.size())}).set_requires_grad(true);
}
}  // namespace

TEST_CASE("anomaly: off by default, the guard turns it on and restores the previous setting") {
  REQUIRE_FALSE(AnomalyMode::is_enabled());
  {
    DetectAnomalyGuard outer;
    CHECK(AnomalyMode::is_enabled());
    {
      DetectAnomalyGuard inner;
      CHECK(AnomalyMode::is_enabled());
    }
    CHECK(AnomalyMode::is_enabled());
  }
  CHECK_FALSE(AnomalyMode::is_enabled());
}

TEST_CASE("anomaly: without detection an infinite gradient flows into grad() silently") {
  Tensor x = leaf({1, 0, 2});
  log(x * 1.0).sum().backward();
  const std::vector<float> g = x.grad().to_vector<float>();
  CHECK(g[0] == 1.0f);
  CHECK(std::isinf(g[1]));
  CHECK(g[2] == 0.5f);
}

TEST_CASE("anomaly: names the node whose backward first produced an infinity, and its forward") {
  DetectAnomalyGuard detect;
  Tensor x = leaf({1, 0, 2});
  // d log(y)/dy = 1/y is infinite at y = 0. MulScalarBackward, further down, would pass
  // the infinity on; the error must blame LogBackward, which produced it.
  Tensor loss = log(x * 1.0).sum();
  REQUIRE_THROWS_WITH(loss.backward(),
                      MG_CONTAINS("detect_anomaly: LogBackward returned non-finite values in its "
                                  "gradient 0 (shape [3]") &&
                          MG_CONTAINS("0 NaN and 1 infinite of 3 values") &&
                          MG_CONTAINS("LogBackward was created in forward from inputs: [3]") &&
                          MG_CONTAINS("from MulScalarBackward"));
  CHECK_FALSE(x.grad().defined());  // the error stopped backward before the leaf
}

TEST_CASE("anomaly: counts NaNs, and names the gradient slot that has them") {
  DetectAnomalyGuard detect;
  Tensor a = from_vector(std::vector<float>{0, 1}, {2});  // a constant numerator
  Tensor b = leaf({0, 1});
  // d(a/b)/db = -a/b^2 = -0/0 = NaN at the first element; only input 1 needs a gradient.
  Tensor loss = (a / b).sum();
  REQUIRE_THROWS_WITH(loss.backward(),
                      MG_CONTAINS("DivBackward returned non-finite values in its gradient 1") &&
                          MG_CONTAINS("1 NaN and 0 infinite of 2 values") &&
                          MG_CONTAINS("from a constant") &&
                          MG_CONTAINS("from a leaf that requires grad"));
}

TEST_CASE("anomaly: a graph built before detection was enabled is still checked") {
  Tensor x = leaf({0});
  Tensor loss = log(x).sum();
  DetectAnomalyGuard detect;
  REQUIRE_THROWS_WITH(loss.backward(),
                      MG_CONTAINS("LogBackward returned non-finite values") &&
                          MG_CONTAINS("before anomaly detection was enabled"));
}

TEST_CASE("anomaly: finite gradients pass unchanged through a checked backward") {
  auto run = [](bool detect) {
    Tensor w = from_vector(std::vector<float>{0.5f, -1, 2, 0.25f, 1, -0.5f}, {3, 2})
                   .set_requires_grad(true);
    Tensor x = from_vector(std::vector<float>{1, 2, -1, 0.5f}, {2, 2});
    Tensor targets = from_vector(std::vector<int64_t>{2, 0}, {2});
    std::unique_ptr<DetectAnomalyGuard> guard;
    if (detect) guard = std::make_unique<DetectAnomalyGuard>();
    cross_entropy(linear(x, w), targets).backward();
    return w.grad().to_vector<float>();
  };
  CHECK(run(true) == run(false));
}

TEST_CASE("anomaly: float64 gradients are checked too", "[float64]") {
  DetectAnomalyGuard detect;
  Tensor x = from_vector(std::vector<double>{1, 0}, {2}).set_requires_grad(true);
  Tensor loss = log(x * 1.0).sum();
  REQUIRE_THROWS_WITH(loss.backward(), MG_CONTAINS("LogBackward") && MG_CONTAINS("float64") &&
                                           MG_CONTAINS("0 NaN and 1 infinite of 2 values"));
}
