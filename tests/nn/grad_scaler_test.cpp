// amp::GradScaler (nn/amp/grad_scaler.h): torch.cuda.amp.GradScaler's semantics. An
// injected inf skips the step, halves the scale, and leaves parameters and optimizer state
// as they were; the scale grows after growth_interval clean steps; unscale_ before
// clip_grad_norm_ gives the unscaled run's step bit for bit; the misuses torch refuses; the
// state dict through a checkpoint; the hook that decides the inf check across ranks.
#include "catch_compat.h"

#include <cmath>
#include <limits>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include <minigrad/autograd/functions.h>
#include <minigrad/autograd/grad_mode.h>
#include <minigrad/core/generator.h>
#include <minigrad/core/ops.h>
#include <minigrad/nn/amp/grad_scaler.h>
#include <minigrad/nn/layers.h>
#include <minigrad/nn/optim/adam.h>
#include <minigrad/nn/optim/sgd.h>
#include <minigrad/nn/serialize.h>
#include <minigrad/nn/utils/clip_grad.h>

#include "temp_dir.h"

using namespace mg;

namespace {

// A tiny regression: Linear(5, 3) on a fixed batch, its loss.
struct Problem {
  std::shared_ptr<nn::Linear> linear;
  Tensor x, y;
  explicit Problem(uint64_t seed) {
    manual_seed(seed);
    linear = std::make_shared<nn::Linear>(5, 3);
    x = randn({8, 5});
    y = randn({8, 3});
  }
  Tensor loss() {
    const Tensor d = sub(linear->forward(x), y);
    return mean(mul(d, d));
  }
};

std::vector<std::vector<float>> values(const std::vector<Tensor>& ts) {
  std::vector<std::vector<float>> v;
  for (const Tensor& t : ts) v.push_back(t.to_vector<float>());
  return v;
}

std::vector<std::vector<float>> adam_state(const optim::AdamW& opt) {
  std::vector<std::vector<float>> v;
  for (size_t i = 0; i < opt.parameters().size(); ++i)
    for (const auto& [name, t] : opt.state(i))
      v.push_back(ops::to_dtype(t, DType::Float32).to_vector<float>());
  return v;
}

void poison(const Tensor& p, float value) {
  NoGradGuard no_grad;
  Tensor g = p.grad();
  Tensor flat = ops::view(g, Shape{g.numel()});
  ops::copy_(ops::narrow(flat, 0, 1, 1), full(Shape{1}, value));
}

}  // namespace

TEST_CASE("GradScaler: torch's defaults, scale() multiplies, a disabled scaler does nothing", "[grad_scaler]") {
  amp::GradScaler scaler;
  CHECK(scaler.get_scale() == 65536.0);
  CHECK(scaler.get_growth_factor() == 2.0);
  CHECK(scaler.get_backoff_factor() == 0.5);
  CHECK(scaler.get_growth_interval() == 2000);
  CHECK(scaler.growth_tracker() == 0);
  const Tensor loss = scalar_tensor(0.75);
  CHECK(scaler.scale(loss).item<float>() == 0.75f * 65536.0f);
  const Tensor half = scalar_tensor(0.75, DType::Float16);
  CHECK(scaler.scale(half).dtype() == DType::Float16);  // a floating scalar keeps the dtype

  amp::GradScalerOptions off;
  off.enabled = false;
  amp::GradScaler disabled(off);
  CHECK(disabled.scale(loss).is_same(loss));
  CHECK(disabled.get_scale() == 1.0);
  CHECK(disabled.state_dict().empty());
  Problem p(1);
  optim::SGD sgd(p.linear->parameters(), optim::SGDOptions(0.1));
  const auto before = values(p.linear->parameters());
  p.loss().backward();
  CHECK(disabled.step(sgd));
  CHECK(values(p.linear->parameters()) != before);
  disabled.update();

  amp::GradScalerOptions no_growth;
  no_growth.growth_factor = 1.0;
  REQUIRE_THROWS_WITH(amp::GradScaler(no_growth), MG_CONTAINS("growth factor must be > 1.0"));
  amp::GradScalerOptions no_backoff;
  no_backoff.backoff_factor = 1.5;
  REQUIRE_THROWS_WITH(amp::GradScaler(no_backoff), MG_CONTAINS("backoff factor must be < 1.0"));
}

TEST_CASE("GradScaler: an inf or a NaN skips the step, halves the scale, leaves parameters and optimizer state untouched",
          "[grad_scaler]") {
  for (float bad : {std::numeric_limits<float>::infinity(), -std::numeric_limits<float>::infinity(),
                    std::numeric_limits<float>::quiet_NaN()}) {
    INFO("injected " << bad);
    Problem p(2);
    optim::AdamW opt(p.linear->parameters(), optim::AdamWOptions(1e-2));
    amp::GradScaler scaler;
    // A clean step first, so that there is optimizer state to leave alone.
    scaler.scale(p.loss()).backward();
    CHECK(scaler.step(opt));
    scaler.update();
    CHECK(scaler.get_scale() == 65536.0);
    CHECK(scaler.growth_tracker() == 1);

    opt.zero_grad();
    scaler.scale(p.loss()).backward();
    poison(p.linear->parameters()[0], bad);
    const auto params = values(p.linear->parameters());
    const auto state = adam_state(opt);
    CHECK_FALSE(scaler.step(opt));
    CHECK(values(p.linear->parameters()) == params);
    CHECK(adam_state(opt) == state);  // step counts included
    scaler.update();
    CHECK(scaler.get_scale() == 32768.0);
    CHECK(scaler.growth_tracker() == 0);

    // The next clean step runs at the new scale.
    opt.zero_grad();
    scaler.scale(p.loss()).backward();
    CHECK(p.linear->parameters()[0].grad().defined());
    CHECK(scaler.step(opt));
    CHECK(values(p.linear->parameters()) != params);
    scaler.update();
    CHECK(scaler.growth_tracker() == 1);
  }
}

TEST_CASE("GradScaler: the scale grows after growth_interval clean steps, and not past float32's range",
          "[grad_scaler]") {
  Problem p(3);
  optim::SGD opt(p.linear->parameters(), optim::SGDOptions(1e-3));
  amp::GradScalerOptions options;
  options.init_scale = 8.0;
  options.growth_interval = 3;
  amp::GradScaler scaler(options);
  const auto one_step = [&] {
    opt.zero_grad();
    scaler.scale(p.loss()).backward();
    scaler.step(opt);
    scaler.update();
  };
  one_step();
  one_step();
  CHECK(scaler.get_scale() == 8.0);
  CHECK(scaler.growth_tracker() == 2);
  one_step();
  CHECK(scaler.get_scale() == 16.0);
  CHECK(scaler.growth_tracker() == 0);
  for (int i = 0; i < 6; ++i) one_step();
  CHECK(scaler.get_scale() == 64.0);
  // An inf in the middle of a count starts it again.
  one_step();
  opt.zero_grad();
  scaler.scale(p.loss()).backward();
  poison(p.linear->parameters()[1], std::numeric_limits<float>::infinity());
  scaler.step(opt);
  scaler.update();
  CHECK(scaler.get_scale() == 32.0);
  CHECK(scaler.growth_tracker() == 0);
  // Growth that would overflow float32 keeps the scale (torch: only a finite new scale).
  scaler.update(3e38);
  for (int i = 0; i < 3; ++i) one_step();
  CHECK(scaler.get_scale() == static_cast<double>(3e38f));
  CHECK(scaler.growth_tracker() == 0);
}

TEST_CASE("GradScaler: unscale_ then clip_grad_norm_ steps as the unscaled run, bit for bit", "[grad_scaler]") {
  // A power-of-two scale multiplies and divides exactly, so the scaled run's clipped
  // gradients and step are the plain run's.
  Problem plain(4), scaled(4);
  optim::SGD opt_plain(plain.linear->parameters(), optim::SGDOptions(0.1, 0.9));
  optim::SGD opt_scaled(scaled.linear->parameters(), optim::SGDOptions(0.1, 0.9));
  amp::GradScaler scaler;
  for (int step = 0; step < 3; ++step) {
    opt_plain.zero_grad();
    plain.loss().backward();
    const std::vector<float> g_plain = plain.linear->parameters()[0].grad().to_vector<float>();
    const Tensor n1 = nn::utils::clip_grad_norm_(plain.linear->parameters(), 0.05);
    opt_plain.step();

    opt_scaled.zero_grad();
    scaler.scale(scaled.loss()).backward();
    // Before unscale_: the plain run's gradients times 2^16, exactly.
    std::vector<float> g_scaled = scaled.linear->parameters()[0].grad().to_vector<float>();
    for (float& v : g_scaled) v /= 65536.0f;
    CHECK(g_scaled == g_plain);
    scaler.unscale_(opt_scaled);
    const Tensor n2 = nn::utils::clip_grad_norm_(scaled.linear->parameters(), 0.05);
    CHECK(n2.item<float>() == n1.item<float>());
    CHECK(scaler.step(opt_scaled));  // no second unscale
    scaler.update();
    CHECK(values(scaled.linear->parameters()) == values(plain.linear->parameters()));
  }
}

TEST_CASE("GradScaler: the misuses torch refuses", "[grad_scaler]") {
  Problem p(5);
  optim::SGD opt(p.linear->parameters(), optim::SGDOptions(0.1));
  amp::GradScaler scaler;
  REQUIRE_THROWS_WITH(scaler.update(), MG_CONTAINS("No inf checks were recorded prior to update()"));
  REQUIRE_THROWS_WITH(scaler.step(opt), MG_CONTAINS("No inf checks were recorded for this optimizer"));
  scaler.scale(p.loss()).backward();
  scaler.unscale_(opt);
  REQUIRE_THROWS_WITH(scaler.unscale_(opt), MG_CONTAINS("unscale_() has already been called on this optimizer"));
  scaler.step(opt);
  REQUIRE_THROWS_WITH(scaler.unscale_(opt), MG_CONTAINS("unscale_() is being called after step()"));
  REQUIRE_THROWS_WITH(scaler.step(opt), MG_CONTAINS("step() has already been called since the last update()"));
  scaler.update();
  // float16 gradients: torch's "Attempting to unscale FP16 gradients."
  Tensor w = ops::to_dtype(randn({3}), DType::Float16).set_requires_grad(true);
  optim::SGD half(std::vector<Tensor>{w}, optim::SGDOptions(0.1));
  sum(mul(w, w)).backward();
  REQUIRE_THROWS_WITH(scaler.unscale_(half), MG_CONTAINS("Attempting to unscale FP16 gradients"));
}

TEST_CASE("GradScaler: its state dict through a checkpoint, torch's keys", "[grad_scaler]") {
  amp::GradScalerOptions options;
  options.growth_interval = 5;
  amp::GradScaler scaler(options);
  Problem p(6);
  optim::SGD opt(p.linear->parameters(), optim::SGDOptions(1e-3));
  for (int i = 0; i < 3; ++i) {
    opt.zero_grad();
    scaler.scale(p.loss()).backward();
    scaler.step(opt);
    scaler.update();
  }
  scaler.update(1024.0);
  const std::map<std::string, Tensor> state = scaler.state_dict();
  CHECK(state.size() == 5);
  CHECK(state.at("scale").dtype() == DType::Float32);
  CHECK(state.at("_growth_tracker").item<int64_t>() == 3);
  mg::testing::TempDir dir;
  const std::string path = dir / "scaler.safetensors";
  nn::save_tensors(state, path);
  amp::GradScaler resumed;
  resumed.load_state_dict(nn::load_tensors(path).tensors);
  CHECK(resumed.get_scale() == 1024.0);
  CHECK(resumed.growth_tracker() == 3);
  CHECK(resumed.get_growth_interval() == 5);
  CHECK(resumed.get_growth_factor() == 2.0);
  CHECK(resumed.get_backoff_factor() == 0.5);
  REQUIRE_THROWS_WITH(resumed.load_state_dict({}), MG_CONTAINS("The source state dict is empty"));
  std::map<std::string, Tensor> partial = state;
  partial.erase("growth_factor");
  REQUIRE_THROWS_WITH(resumed.load_state_dict(partial), MG_CONTAINS("no 'growth_factor'"));
  CHECK(resumed.get_scale() == 1024.0);  // a failed load changes nothing
}

TEST_CASE("GradScaler: reduce_found_inf decides the step for every rank", "[grad_scaler]") {
  // Another rank found an inf: its flag, reduced (max) into ours, skips our clean step.
  int calls = 0;
  amp::GradScalerOptions options;
  options.reduce_found_inf = [&](Tensor& found_inf) {
    ++calls;
    CHECK(found_inf.dtype() == DType::Float32);
    CHECK(found_inf.item<float>() == 0.0f);  // our gradients are finite
    found_inf = full(Shape{}, 1.0);          // the maximum over the "ranks"
  };
  amp::GradScaler scaler(options);
  Problem p(7);
  optim::SGD opt(p.linear->parameters(), optim::SGDOptions(0.1));
  const auto before = values(p.linear->parameters());
  scaler.scale(p.loss()).backward();
  CHECK_FALSE(scaler.step(opt));
  CHECK(calls == 1);
  CHECK(values(p.linear->parameters()) == before);
  scaler.update();
  CHECK(scaler.get_scale() == 32768.0);
  // A rank with no gradients at all (an empty shard) still takes part in the reduction.
  optim::SGD empty(std::vector<Tensor>{randn({2}).set_requires_grad(true)}, optim::SGDOptions(0.1));
  CHECK_FALSE(scaler.step(empty));
  CHECK(calls == 2);
}
