// optim::MasterWeights (nn/optim/master_weights.h): the fault the masters exist for
// (bfloat16 parameters stepped in bfloat16 lose 1e-3 steps on weights of 1; the masters
// keep them), a step equals the inner optimizer's on float32 tensors, its state is
// float32, stochastic rounding is unbiased and seeded, checkpoints resume the masters, a
// GradScaler unscales float16 gradients in the masters, and the nanoGPT way (float32
// parameters under autocast) with every optimizer.
#include "catch_compat.h"
#include "reduced_float_compare.h"

#include <cmath>
#include <memory>
#include <vector>

#include <minigrad/autograd/autocast.h>
#include <minigrad/autograd/functions.h>
#include <minigrad/autograd/grad_mode.h>
#include <minigrad/core/generator.h>
#include <minigrad/core/ops.h>
#include <minigrad/nn/amp/grad_scaler.h>
#include <minigrad/nn/layers.h>
#include <minigrad/nn/optim/adam.h>
#include <minigrad/nn/optim/master_weights.h>
#include <minigrad/nn/optim/sgd.h>

using namespace mg;

namespace {

std::unique_ptr<optim::Optimizer> sgd(std::vector<Tensor> masters) {
  return std::make_unique<optim::SGD>(std::move(masters), optim::SGDOptions(1e-3));
}
std::unique_ptr<optim::Optimizer> adamw(std::vector<Tensor> masters) {
  return std::make_unique<optim::AdamW>(std::move(masters), optim::AdamWOptions(1e-3).weight_decay(0.0));
}

std::vector<float> floats(const Tensor& t) { return ops::to_dtype(t, DType::Float32).to_vector<float>(); }

}  // namespace

TEST_CASE("MasterWeights: bfloat16 parameters stepped in bfloat16 lose 1e-3 steps on weights of 1, the masters keep them",
          "[master_weights]") {
  // loss = sum(w): every gradient is 1, so SGD moves each weight by -lr a step, and Adam
  // by about -lr (its update is m / sqrt(v) ~ 1 times lr). Near 1 a bfloat16 is spaced
  // 2^-8 below and 2^-7 above: a step of 1e-3 is less than half a spacing (1.95e-3) and
  // rounds back to 1, every time.
  for (const auto& [name, make] : std::vector<std::pair<std::string, optim::OptimizerFactory>>{{"SGD", sgd}, {"AdamW", adamw}}) {
    INFO(name);
    Tensor plain = ones({64}, DType::BFloat16).set_requires_grad(true);
    Tensor mastered = ones({64}, DType::BFloat16).set_requires_grad(true);
    std::unique_ptr<optim::Optimizer> in_bf16 = make({plain});
    optim::MasterWeights with_masters({mastered}, make);
    for (int step = 0; step < 10; ++step) {
      in_bf16->zero_grad();
      sum(plain).backward();
      in_bf16->step();
      with_masters.zero_grad();
      sum(mastered).backward();
      with_masters.step();
    }
    // The fault: ten steps and not one bit moved.
    for (float v : floats(plain)) REQUIRE(v == 1.0f);
    // The masters hold 1 - 10 steps (float32's own rounding of ten subtractions: < 1e-6),
    // and the parameters their nearest bfloat16: 0.98828125, 253 * 2^-8.
    const std::vector<float> master = floats(with_masters.parameters()[0]);
    CHECK(master[0] == Approx(1.0 - 10 * 1e-3).margin(2e-5));  // Adam's step is lr m/(sqrt(v)+eps): 1e-3 (1 - 1e-5)
    CHECK(with_masters.parameters()[0].dtype() == DType::Float32);
    for (float v : floats(mastered)) REQUIRE(v == static_cast<float>(bfloat16(master[0])));
    CHECK(floats(mastered)[0] == 0.98828125f);
  }
}

TEST_CASE("MasterWeights: a step is the inner optimizer's on float32 tensors, its state float32, the parameters the masters rounded",
          "[master_weights]") {
  manual_seed(11);
  // A Linear in bfloat16 with MasterWeights(AdamW), against AdamW on float32 copies of the
  // initial masters given the same (bfloat16) gradients converted to float32.
  auto model = std::make_shared<nn::Linear>(6, 4);
  model->to(DType::BFloat16);
  const Tensor x = ops::to_dtype(randn({5, 6}), DType::BFloat16);
  optim::MasterWeights opt(model->parameters(), [](std::vector<Tensor> m) {
    return std::make_unique<optim::AdamW>(std::move(m), optim::AdamWOptions(1e-2).weight_decay(0.1));
  });
  CHECK(opt.name() == "MasterWeights(AdamW)");
  std::vector<Tensor> reference;
  for (const Tensor& p : model->parameters()) reference.push_back(ops::to_dtype(p, DType::Float32).set_requires_grad(true));
  optim::AdamW plain(reference, optim::AdamWOptions(1e-2).weight_decay(0.1));
  for (int step = 0; step < 3; ++step) {
    opt.zero_grad();
    sum(mul(model->forward(x), model->forward(x))).backward();
    for (size_t i = 0; i < reference.size(); ++i) {
      REQUIRE(model->parameters()[i].grad().dtype() == DType::BFloat16);
      reference[i].set_grad(ops::to_dtype(model->parameters()[i].grad(), DType::Float32));
    }
    opt.step();
    plain.step();
    for (size_t i = 0; i < reference.size(); ++i) {
      CHECK(floats(opt.parameters()[i]) == reference[i].to_vector<float>());
      CHECK(floats(model->parameters()[i]) == floats(ops::to_dtype(reference[i], DType::BFloat16)));
      CHECK(model->parameters()[i].dtype() == DType::BFloat16);
    }
  }
  for (const auto& [name, t] : opt.state(0)) {
    INFO(name);
    CHECK((t.dtype() == DType::Float32 || name == "step"));
  }
  // zero_grad clears the masters' gradients and the model's.
  opt.zero_grad();
  CHECK_FALSE(opt.parameters()[0].grad().defined());
  CHECK_FALSE(model->parameters()[0].grad().defined());
}

TEST_CASE("MasterWeights: stochastic rounding is unbiased, lands on a neighbour, and is seeded", "[master_weights]") {
  // 1 - 3e-4 lies between the bfloat16 neighbours 1 - 2^-8 and 1, a quarter-ish of the way
  // down: each of n elements rounds up with probability p = 1 - 3e-4 / 2^-8 = 0.9232.
  const int64_t n = 20000;
  const float value = 1.0f - 3e-4f;
  const Tensor master = full({n}, value);
  for (DType dtype : {DType::BFloat16, DType::Float16}) {
    INFO(dtype_name(dtype));
    const Tensor r = ops::round_stochastic(master, dtype, 5, 0);
    const std::vector<float> v = floats(r);
    const float hi = 1.0f, lo = dtype == DType::BFloat16 ? 1.0f - 0x1p-8f : 1.0f - 0x1p-11f;
    double total = 0.0;
    for (float e : v) {
      REQUIRE((e == hi || e == lo));
      total += e;
    }
    // The mean within 5 standard errors: sd of one element (hi - lo) sqrt(p (1 - p)).
    const double p = (value - lo) / (hi - lo);
    const double bound = 5.0 * (hi - lo) * std::sqrt(p * (1.0 - p) / static_cast<double>(n));
    CHECK(std::fabs(total / static_cast<double>(n) - value) <= bound);
    // The same seed and offset, the same bits; another seed, others.
    CHECK(floats(ops::round_stochastic(master, dtype, 5, 0)) == v);
    CHECK(floats(ops::round_stochastic(master, dtype, 6, 0)) != v);
  }
  // Representable values, zeros and non-finite values round to nearest; negatives mirror.
  const Tensor special = from_vector(std::vector<float>{0.5f, -0.0f, INFINITY, -3.0f, -(1.0f - 3e-4f), 1e30f, 65510.0f}, {7});
  const std::vector<float> s = floats(ops::round_stochastic(special, DType::BFloat16, 1, 0));
  CHECK(s[0] == 0.5f);
  CHECK((s[1] == 0.0f && std::signbit(s[1])));
  CHECK(std::isinf(s[2]));
  CHECK(s[3] == -3.0f);
  CHECK((s[4] == -1.0f || s[4] == -(1.0f - 0x1p-8f)));
  const std::vector<float> h = floats(ops::round_stochastic(special, DType::Float16, 1, 0));
  CHECK(std::isinf(h[5]));    // float16 overflows as nearest rounding does
  CHECK(h[6] == 65504.0f);    // between the largest finite value and infinity: the largest
  REQUIRE_THROWS_WITH(ops::round_stochastic(ops::to_dtype(master, DType::Float64), DType::BFloat16, 1, 0),
                      MG_CONTAINS("round_stochastic: rounds float32 to bfloat16 or float16, got float64"));

  // Through MasterWeights: seeded, and after many small steps the parameters' mean tracks
  // the masters (unbiased), where nearest rounding would not have moved them at all.
  Tensor w = ones({4096}, DType::BFloat16).set_requires_grad(true);
  optim::MasterWeightsOptions options;
  options.stochastic_rounding = true;
  options.seed = 42;
  optim::MasterWeights opt({w}, sgd, options);
  for (int step = 0; step < 3; ++step) {
    opt.zero_grad();
    sum(w).backward();
    opt.step();
  }
  double mean = 0.0;
  for (float e : floats(w)) mean += e;
  mean /= 4096.0;
  const double m = floats(opt.parameters()[0])[0];  // 1 - 3e-3
  CHECK(std::fabs(mean - m) <= 5.0 * 0x1p-8 * 0.5 / 64.0);  // 5 standard errors (p(1-p) <= 1/4)
  CHECK(std::fabs(mean - 1.0) > 1e-3);
}

TEST_CASE("MasterWeights: its state dict holds the float32 masters, a resumed run continues exactly",
          "[master_weights]") {
  manual_seed(12);
  auto make_model = [] {
    manual_seed(13);
    auto m = std::make_shared<nn::Linear>(4, 3);
    m->to(DType::BFloat16);
    return m;
  };
  const Tensor x = ops::to_dtype(randn({6, 4}), DType::BFloat16);
  auto run_step = [&](nn::Linear& model, optim::MasterWeights& opt) {
    opt.zero_grad();
    sum(mul(model.forward(x), model.forward(x))).backward();
    opt.step();
  };
  auto a = make_model();
  optim::MasterWeights opt_a(a->parameters(), adamw);
  run_step(*a, opt_a);
  run_step(*a, opt_a);
  const optim::TensorDict state = opt_a.state_dict();
  CHECK(state.count("master.0") == 1);
  CHECK(state.at("master.0").dtype() == DType::Float32);
  CHECK(state.count("exp_avg.1") == 1);
  // Resume: a fresh model with a's (bfloat16) parameters, a fresh optimizer with the state.
  auto b = make_model();
  {
    NoGradGuard no_grad;
    for (size_t i = 0; i < b->parameters().size(); ++i) b->parameters()[i].copy_(a->parameters()[i]);
  }
  optim::MasterWeights opt_b(b->parameters(), adamw);
  opt_b.load_state_dict(state);
  run_step(*a, opt_a);
  run_step(*b, opt_b);
  for (size_t i = 0; i < a->parameters().size(); ++i) {
    CHECK(floats(opt_a.parameters()[i]) == floats(opt_b.parameters()[i]));
    CHECK(floats(a->parameters()[i]) == floats(b->parameters()[i]));
  }
  optim::TensorDict bad = state;
  bad["master.0"] = ops::to_dtype(bad["master.0"], DType::BFloat16);
  REQUIRE_THROWS_WITH(opt_b.load_state_dict(bad), MG_CONTAINS("master.0"));
}

TEST_CASE("MasterWeights: a GradScaler unscales float16 gradients in the float32 masters and skips an inf",
          "[master_weights][grad_scaler]") {
  manual_seed(14);
  auto model = std::make_shared<nn::Linear>(4, 3);
  model->to(DType::Float16);
  const Tensor x = ops::to_dtype(randn({6, 4}), DType::Float16);
  optim::MasterWeights opt(model->parameters(), sgd);
  amp::GradScaler scaler;
  // The loss in float32 (as autocast's cross_entropy is), its gradient 2^-30 per output:
  // below float16's smallest subnormal (2^-24), it would be 0 in the model's gradients.
  // Scaled by 2^16 it is 2^-14, float16's smallest normal, and the bias's gradient sums 6
  // rows of it; unscaled in the float32 masters it is 6 * 2^-30 exactly.
  const auto loss = [&] { return mul(sum(model->forward(x).to(DType::Float32)), 0x1p-30); };
  scaler.scale(loss()).backward();
  CHECK(model->parameters()[1].grad().dtype() == DType::Float16);
  CHECK(floats(model->parameters()[1].grad())[0] == 6.0f * 0x1p-14f);
  scaler.unscale_(opt);
  CHECK(opt.parameters()[1].grad().dtype() == DType::Float32);
  CHECK(floats(opt.parameters()[1].grad())[0] == 6.0f * 0x1p-30f);
  // Without the scaler the same gradient is lost in float16.
  opt.zero_grad();
  loss().backward();
  CHECK(floats(model->parameters()[0].grad())[0] == 0.0f);
  opt.zero_grad();
  scaler.update(65536.0);
  scaler.scale(loss()).backward();
  CHECK(scaler.step(opt));
  scaler.update();

  opt.zero_grad();
  scaler.scale(loss()).backward();
  {
    NoGradGuard no_grad;
    Tensor g = model->parameters()[0].grad();
    ops::copy_(ops::narrow(ops::view(g, Shape{g.numel()}), 0, 0, 1), full(Shape{1}, INFINITY, DType::Float16));
  }
  const std::vector<float> masters = floats(opt.parameters()[0]), params = floats(model->parameters()[0]);
  CHECK_FALSE(scaler.step(opt));
  CHECK(floats(opt.parameters()[0]) == masters);
  CHECK(floats(model->parameters()[0]) == params);
  scaler.update();
  CHECK(scaler.get_scale() == 32768.0);
}

TEST_CASE("MasterWeights: the nanoGPT way (float32 parameters under autocast) with every optimizer",
          "[master_weights][autocast]") {
  // Nothing new: the parameters stay float32, autocast's casts bring float32 gradients
  // back, and any optimizer steps them. Each optimizer lowers the loss of a small fit.
  std::vector<std::pair<std::string, std::function<std::unique_ptr<optim::Optimizer>(std::vector<Tensor>)>>> makers = {
      {"SGD", [](std::vector<Tensor> p) { return std::make_unique<optim::SGD>(std::move(p), optim::SGDOptions(0.05, 0.9)); }},
      {"Adam", [](std::vector<Tensor> p) { return std::make_unique<optim::Adam>(std::move(p), optim::AdamOptions(1e-2)); }},
      {"AdamW", [](std::vector<Tensor> p) { return std::make_unique<optim::AdamW>(std::move(p), optim::AdamWOptions(1e-2)); }},
  };
  for (auto& [name, make] : makers) {
    INFO(name);
    manual_seed(15);
    auto model = std::make_shared<nn::Linear>(8, 2);
    const Tensor x = randn({32, 8}), y = randn({32, 2});
    auto opt = make(model->parameters());
    double first = 0, last = 0;
    for (int step = 0; step < 30; ++step) {
      opt->zero_grad();
      Tensor loss;
      {
        AutocastGuard autocast(DeviceType::CPU, DType::BFloat16);
        const Tensor d = sub(model->forward(x), y);  // bfloat16 - float32: float32
        loss = mean(mul(d, d));
      }
      loss.backward();
      for (const Tensor& p : model->parameters()) REQUIRE(p.grad().dtype() == DType::Float32);
      opt->step();
      (step == 0 ? first : last) = loss.item<float>();
    }
    CHECK(model->parameters()[0].dtype() == DType::Float32);
    CHECK(last < 0.8 * first);
  }
}
