// optim::Adam/AdamW's fused step (Backend::adam_step: one pass per tensor on the CPU)
// against the update rule written out here as a plain float loop, and against the
// composition of elementwise ops it replaces: bit for bit, for every option, over
// several steps, with per-parameter step counts, views and strided tensors.
#include "adam_options.h"
#include "catch_compat.h"

#include <cmath>
#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include <fmt/format.h>

#include <minigrad/core/backend.h>
#include <minigrad/core/ops.h>
#include <minigrad/minigrad.h>

using mg::Shape;
using mg::Tensor;
using mg::testing::adam_of;
using mg::testing::AdamCase;
using mg::testing::all_adam_cases;
using mg::testing::describe;
using mg::testing::make_adam;

namespace {

// One parameter and its state as the reference sees them.
struct ReferenceParam {
  std::vector<float> p, m, v, vmax;
  int64_t step = 0;
};

// PyTorch's _single_tensor_adam(w) as its in-place ops compute it: float arithmetic, the
// scalars rounded to float first, every product, quotient, sum and root rounded on its
// own; addcmul_/addcdiv_ multiply by their value first.
void reference_step(ReferenceParam& r, const std::vector<float>& grad, const AdamCase& c) {
  if (r.step == 0) r.m = r.v = r.vmax = std::vector<float>(r.p.size(), 0.0f);
  ++r.step;
  const auto t = static_cast<double>(r.step);
  const double step_size = c.lr / (1.0 - std::pow(c.beta1, t));
  const auto bias_correction2_sqrt = static_cast<float>(std::sqrt(1.0 - std::pow(c.beta2, t)));
  const auto neg_step_size = static_cast<float>(-step_size);
  const auto beta1 = static_cast<float>(c.beta1), keep1 = static_cast<float>(1.0 - c.beta1);
  const auto beta2 = static_cast<float>(c.beta2), keep2 = static_cast<float>(1.0 - c.beta2);
  const auto eps = static_cast<float>(c.eps);
  const auto weight_decay = static_cast<float>(c.weight_decay);
  const auto decay = static_cast<float>(1.0 - c.lr * c.weight_decay);
  for (size_t i = 0; i < r.p.size(); ++i) {
    float g = c.maximize ? -grad[i] : grad[i];
    if (c.weight_decay != 0.0) {
      if (c.decoupled) {
        r.p[i] = r.p[i] * decay;
      } else {
        const float penalty = weight_decay * r.p[i];
        g = g + penalty;
      }
    }
    const float m_scaled = r.m[i] * beta1;
    const float m_added = keep1 * g;
    r.m[i] = m_scaled + m_added;
    const float v_scaled = r.v[i] * beta2;
    const float g_scaled = keep2 * g;
    const float g_squared = g_scaled * g;
    r.v[i] = v_scaled + g_squared;
    float second = r.v[i];
    if (c.amsgrad) {
      r.vmax[i] = std::isnan(r.vmax[i]) || r.vmax[i] > r.v[i] ? r.vmax[i] : r.v[i];
      second = r.vmax[i];
    }
    const float root = std::sqrt(second);
    const float corrected = root / bias_correction2_sqrt;
    const float denom = corrected + eps;
    const float scaled = neg_step_size * r.m[i];
    const float update = scaled / denom;
    r.p[i] = r.p[i] + update;
  }
}

void require_bits(const std::vector<float>& actual, const std::vector<float>& expected,
                  const std::string& what) {
  REQUIRE(actual.size() == expected.size());
  for (size_t i = 0; i < actual.size(); ++i) {
    if (std::memcmp(&actual[i], &expected[i], sizeof(float)) != 0)
      FAIL(fmt::format("{}: element {} of {} is {:.9g}, expected {:.9g}", what, i, actual.size(),
                       actual[i], expected[i]));
  }
}

void require_state_bits(const mg::optim::AdamBase& adam, size_t k, const ReferenceParam& r,
                        const AdamCase& c) {
  REQUIRE(adam.step_count(k) == r.step);
  require_bits(adam.exp_avg(k).to_vector<float>(), r.m, fmt::format("exp_avg {}", k));
  require_bits(adam.exp_avg_sq(k).to_vector<float>(), r.v, fmt::format("exp_avg_sq {}", k));
  if (c.amsgrad) {
    require_bits(adam.max_exp_avg_sq(k).to_vector<float>(), r.vmax,
                 fmt::format("max_exp_avg_sq {}", k));
  } else {
    REQUIRE_FALSE(adam.max_exp_avg_sq(k).defined());
  }
}

Tensor random_values(const Shape& shape, uint64_t seed) {
  mg::manual_seed(seed);
  return mg::randn(shape);
}

// Gradients of varied magnitude, so that roundings differ from element to element.
Tensor random_grad(const Shape& shape, uint64_t seed) {
  return mg::ops::binary_scalar(mg::BinaryOp::Mul, random_values(shape, seed), 3.7);
}

const std::vector<Shape>& odd_shapes() {
  static const std::vector<Shape> shapes = {Shape{1}, Shape{7}, Shape{4097}, Shape{13, 17}};
  return shapes;
}

}  // namespace

TEST_CASE("Adam fused step: bit for bit the reference loop, for every option, over 4 steps") {
  for (const AdamCase& c : all_adam_cases()) {
    INFO(describe(c));
    std::vector<Tensor> params;
    std::vector<ReferenceParam> reference;
    for (size_t k = 0; k < odd_shapes().size(); ++k) {
      params.push_back(random_values(odd_shapes()[k], 10 + k).set_requires_grad(true));
      reference.push_back({params.back().to_vector<float>(), {}, {}, {}, 0});
    }
    // A parameter that never gets a gradient: skipped, no state.
    const Tensor frozen = random_values({5}, 99).set_requires_grad(true);
    const auto frozen_before = frozen.to_vector<float>();
    params.push_back(frozen);
    auto opt = make_adam(c, params);
    const auto& adam = adam_of(*opt);

    for (int step = 0; step < 4; ++step) {
      INFO("step " << step + 1);
      for (size_t k = 0; k < reference.size(); ++k) {
        // Parameter 1 sits out step 2, so its step count (and bias correction) lags.
        if (k == 1 && step == 1) {
          params[k].set_grad(Tensor());
          continue;
        }
        const Tensor g = random_grad(params[k].shape(), 1000 + 10 * step + k);
        params[k].set_grad(g);
        reference_step(reference[k], g.to_vector<float>(), c);
      }
      opt->step();
      for (size_t k = 0; k < reference.size(); ++k) {
        require_bits(params[k].to_vector<float>(), reference[k].p,
                     fmt::format("parameter {} (shape {})", k, params[k].shape()));
        require_state_bits(adam, k, reference[k], c);
      }
      require_bits(frozen.to_vector<float>(), frozen_before, "the parameter without a gradient");
      REQUIRE(adam.state(params.size() - 1).empty());
    }
  }
}

TEST_CASE("Adam fused step: the CPU backend's one pass gives the bits of the per-op composition") {
  mg::Backend& cpu = mg::backend(mg::DeviceType::CPU);
  for (const AdamCase& c : all_adam_cases()) {
    INFO(describe(c));
    struct Side {
      std::vector<Tensor> p, m, v, vmax;
    } fused, composed;
    for (size_t k = 0; k < odd_shapes().size(); ++k) {
      const Tensor start = random_values(odd_shapes()[k], 20 + k);
      for (Side* side : {&fused, &composed}) {
        side->p.push_back(mg::ops::clone(start));
        side->m.push_back(mg::zeros(start.shape()));
        side->v.push_back(mg::zeros(start.shape()));
        side->vmax.push_back(c.amsgrad ? mg::zeros(start.shape()) : Tensor());
      }
    }
    for (int step = 1; step <= 3; ++step) {
      INFO("step " << step);
      mg::AdamStep fused_step = c.step(), composed_step = c.step();
      for (size_t k = 0; k < fused.p.size(); ++k) {
        const Tensor g = random_grad(fused.p[k].shape(), 2000 + 10 * step + k);
        // Tensors at different steps in one call: each has its own corrections.
        const auto t = static_cast<double>(step + static_cast<int>(k));
        const double step_size = c.lr / (1.0 - std::pow(c.beta1, t));
        const double bc2_sqrt = std::sqrt(1.0 - std::pow(c.beta2, t));
        fused_step.tensors.push_back(
            {fused.p[k], g, fused.m[k], fused.v[k], fused.vmax[k], step_size, bc2_sqrt});
        composed_step.tensors.push_back({composed.p[k], g, composed.m[k], composed.v[k],
                                         composed.vmax[k], step_size, bc2_sqrt});
      }
      const Tensor g0_before = mg::ops::clone(fused_step.tensors[2].grad);
      cpu.adam_step(fused_step);
      cpu.Backend::adam_step(composed_step);  // the default: one elementwise op at a time
      for (size_t k = 0; k < fused.p.size(); ++k) {
        INFO("tensor " << k);
        require_bits(fused.p[k].to_vector<float>(), composed.p[k].to_vector<float>(), "param");
        require_bits(fused.m[k].to_vector<float>(), composed.m[k].to_vector<float>(), "exp_avg");
        require_bits(fused.v[k].to_vector<float>(), composed.v[k].to_vector<float>(),
                     "exp_avg_sq");
        if (c.amsgrad)
          require_bits(fused.vmax[k].to_vector<float>(), composed.vmax[k].to_vector<float>(),
                       "max_exp_avg_sq");
      }
      require_bits(fused_step.tensors[2].grad.to_vector<float>(), g0_before.to_vector<float>(),
                   "the gradient (read only)");
    }
  }
}

TEST_CASE("Adam fused step: NaN and infinite gradients propagate as in the composition") {
  mg::Backend& cpu = mg::backend(mg::DeviceType::CPU);
  AdamCase c;
  c.amsgrad = true;
  const float inf = INFINITY, nan = NAN;
  const Tensor g = mg::from_vector(std::vector<float>{nan, inf, -inf, 1.0f, 0.0f}, {5});
  Tensor p1 = mg::ones({5}), p2 = mg::ones({5});
  std::vector<Tensor> s1 = {mg::zeros({5}), mg::zeros({5}), mg::zeros({5})};
  std::vector<Tensor> s2 = {mg::zeros({5}), mg::zeros({5}), mg::zeros({5})};
  for (int step = 1; step <= 2; ++step) {
    mg::AdamStep a = c.step(), b = c.step();
    a.tensors.push_back({p1, g, s1[0], s1[1], s1[2], 1e-2, 0.5});
    b.tensors.push_back({p2, g, s2[0], s2[1], s2[2], 1e-2, 0.5});
    cpu.adam_step(a);
    cpu.Backend::adam_step(b);
    require_bits(p1.to_vector<float>(), p2.to_vector<float>(), "param");
    require_bits(s1[2].to_vector<float>(), s2[2].to_vector<float>(), "max_exp_avg_sq");
  }
  CHECK(std::isnan(p1.to_vector<float>()[0]));
  CHECK(std::isnan(s1[2].to_vector<float>()[0]));  // NaN wins the running maximum
  CHECK(std::isinf(s1[2].to_vector<float>()[1]));
}

TEST_CASE("Adam fused step: gradients as views into a flat bucket, strided gradients and "
          "strided parameters") {
  AdamCase c;
  c.decoupled = true;
  c.weight_decay = 0.1;
  c.amsgrad = true;
  const Tensor a = random_values({7}, 30).set_requires_grad(true);
  const Tensor b = random_values({3, 5}, 31).set_requires_grad(true);
  // A transposed gradient and a transposed parameter step through contiguous copies.
  const Tensor d = random_values({4, 6}, 32).set_requires_grad(true);
  const Tensor e = random_values({5, 3}, 33).t().detach().set_requires_grad(true);
  REQUIRE_FALSE(e.is_contiguous());
  std::vector<ReferenceParam> reference;
  for (const Tensor& p : {a, b, d, e}) reference.push_back({p.to_vector<float>(), {}, {}, {}, 0});
  auto opt = make_adam(c, {a, b, d, e});
  const auto& adam = adam_of(*opt);

  Tensor bucket = mg::zeros({1 + 7 + 15});
  for (int step = 0; step < 3; ++step) {
    INFO("step " << step + 1);
    mg::NoGradGuard no_grad;
    bucket.copy_(random_grad({1 + 7 + 15}, 3000 + step));
    const Tensor a_grad = bucket.narrow(0, 1, 7);
    const Tensor b_grad = bucket.narrow(0, 8, 15).view({3, 5});
    a.set_grad(a_grad);
    b.set_grad(b_grad);
    const Tensor d_grad = random_grad({6, 4}, 3100 + step).t();
    REQUIRE_FALSE(d_grad.is_contiguous());
    d.set_grad(d_grad);
    e.set_grad(random_grad({3, 5}, 3200 + step));
    const auto bucket_before = bucket.to_vector<float>();

    reference_step(reference[0], a_grad.to_vector<float>(), c);
    reference_step(reference[1], b_grad.to_vector<float>(), c);
    reference_step(reference[2], d_grad.to_vector<float>(), c);
    reference_step(reference[3], e.grad().to_vector<float>(), c);
    opt->step();
    const Tensor params[] = {a, b, d, e};
    for (size_t k = 0; k < 4; ++k) {
      require_bits(params[k].to_vector<float>(), reference[k].p, fmt::format("parameter {}", k));
      require_state_bits(adam, k, reference[k], c);
    }
    REQUIRE_FALSE(e.is_contiguous());  // still the same strided view, updated in place
    require_bits(bucket.to_vector<float>(), bucket_before, "the gradient bucket (read only)");
  }
}

TEST_CASE("Backend::adam_step refuses tensors it cannot update, naming them") {
  mg::Backend& cpu = mg::backend(mg::DeviceType::CPU);
  AdamCase c;
  c.amsgrad = true;
  const Tensor p = mg::zeros({3, 4});
  const Tensor g = mg::ones({3, 4});
  mg::AdamStep step = c.step();
  // The bias corrections of a first step at lr 1e-3 and the default betas.
  step.tensors.push_back({p, g, mg::zeros({3, 4}), mg::zeros({3, 4}), Tensor(), 1e-3 / (1 - 0.9),
                          std::sqrt(1 - 0.999)});
  REQUIRE_THROWS_WITH(cpu.adam_step(step), MG_CONTAINS("adam_step on cpu: tensor 0 does not fit"));
  REQUIRE_THROWS_WITH(cpu.adam_step(step), MG_CONTAINS("max_exp_avg_sq: undefined; amsgrad true"));
  step.amsgrad = false;
  step.tensors[0].exp_avg = mg::zeros({4, 3}).t();
  REQUIRE_THROWS_WITH(cpu.adam_step(step), MG_CONTAINS("exp_avg: shape [3, 4] float32 (not contiguous)"));
  step.tensors[0].exp_avg = mg::zeros({12});
  REQUIRE_THROWS_WITH(cpu.Backend::adam_step(step), MG_CONTAINS("exp_avg: shape [12]"));
  step.tensors[0].exp_avg = mg::zeros({3, 4});
  cpu.adam_step(step);
  // The first step of Adam moves every element by lr (m / sqrt(v) = 1 after correction).
  const auto after = p.to_vector<float>();
  for (float x : after) CHECK(x == Approx(-1e-3).epsilon(1e-5));
}
