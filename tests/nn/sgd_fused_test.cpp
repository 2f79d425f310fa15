// optim::SGD's fused step (Backend::sgd_step: one pass per tensor on the CPU) against
// the update rule written out here as a plain loop, and against the composition of
// elementwise ops it replaces: bit for bit, for every option, over several steps.
#include "catch_compat.h"
#include "sgd_options.h"

#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include <fmt/format.h>

#include <minigrad/core/backend.h>
#include <minigrad/core/ops.h>
#include <minigrad/minigrad.h>
#include <minigrad/nn/optim/sgd.h>

namespace optim = mg::optim;
using mg::Shape;
using mg::Tensor;

using mg::testing::all_sgd_options;
using mg::testing::describe;

namespace {

// One parameter as the reference sees it.
struct ReferenceParam {
  std::vector<float> p;
  std::vector<float> buf;  // empty until the first step with momentum
};

// torch.optim.SGD's rule as add_ and mul_ compute it: float arithmetic, the scalars
// rounded to float first, every product and every sum rounded on its own.
void reference_step(ReferenceParam& r, const std::vector<float>& g, const optim::SGDOptions& o) {
  const float weight_decay = static_cast<float>(o.weight_decay());
  const float momentum = static_cast<float>(o.momentum());
  const float keep = static_cast<float>(1.0 - o.dampening());
  const float neg_lr = static_cast<float>(-o.lr());
  const bool first = r.buf.empty();
  if (o.momentum() != 0.0 && first) r.buf.resize(r.p.size());
  for (size_t i = 0; i < r.p.size(); ++i) {
    float d_p = g[i];
    if (o.weight_decay() != 0.0) {
      const float decay = weight_decay * r.p[i];
      d_p = d_p + decay;
    }
    if (o.momentum() != 0.0) {
      if (first) {
        r.buf[i] = d_p;
      } else {
        const float scaled = r.buf[i] * momentum;
        const float added = keep * d_p;
        r.buf[i] = scaled + added;
      }
      if (o.nesterov()) {
        const float look_ahead = momentum * r.buf[i];
        d_p = d_p + look_ahead;
      } else {
        d_p = r.buf[i];
      }
    }
    const float update = neg_lr * d_p;
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

TEST_CASE("SGD fused step: bit for bit the reference loop, for every option, over 4 steps") {
  for (const auto& options : all_sgd_options()) {
    INFO(describe(options));
    std::vector<Tensor> params;
    std::vector<ReferenceParam> reference;
    for (size_t k = 0; k < odd_shapes().size(); ++k) {
      params.push_back(random_values(odd_shapes()[k], 10 + k).set_requires_grad(true));
      reference.push_back({params.back().to_vector<float>(), {}});
    }
    // A parameter that never gets a gradient: skipped, no buffer.
    const Tensor frozen = random_values({5}, 99).set_requires_grad(true);
    const auto frozen_before = frozen.to_vector<float>();
    params.push_back(frozen);
    optim::SGD sgd(params, options);

    for (int step = 0; step < 4; ++step) {
      INFO("step " << step + 1);
      for (size_t k = 0; k < reference.size(); ++k) {
        const Tensor g = random_grad(params[k].shape(), 1000 + 10 * step + k);
        params[k].set_grad(g);
        reference_step(reference[k], g.to_vector<float>(), options);
      }
      sgd.step();
      for (size_t k = 0; k < reference.size(); ++k) {
        require_bits(params[k].to_vector<float>(), reference[k].p,
                     fmt::format("parameter {} (shape {})", k, params[k].shape()));
        if (options.momentum() != 0.0)
          require_bits(sgd.momentum_buffer(k).to_vector<float>(), reference[k].buf,
                       fmt::format("momentum buffer {}", k));
        else
          REQUIRE_FALSE(sgd.momentum_buffer(k).defined());
      }
      require_bits(frozen.to_vector<float>(), frozen_before, "the parameter without a gradient");
      REQUIRE_FALSE(sgd.momentum_buffer(params.size() - 1).defined());
    }
  }
}

TEST_CASE("SGD fused step: the CPU backend's one pass gives the bits of the per-op composition") {
  mg::Backend& cpu = mg::backend(mg::DeviceType::CPU);
  for (const auto& options : all_sgd_options()) {
    INFO(describe(options));
    const bool momentum = options.momentum() != 0.0;
    std::vector<Tensor> fused_p, composed_p, fused_buf, composed_buf;
    for (size_t k = 0; k < odd_shapes().size(); ++k) {
      const Tensor start = random_values(odd_shapes()[k], 20 + k);
      fused_p.push_back(mg::ops::clone(start));
      composed_p.push_back(mg::ops::clone(start));
      fused_buf.push_back(momentum ? mg::empty(start.shape()) : Tensor());
      composed_buf.push_back(momentum ? mg::empty(start.shape()) : Tensor());
    }
    for (int step = 0; step < 3; ++step) {
      INFO("step " << step + 1);
      mg::SgdStep fused{{}, options.lr(), options.momentum(), options.dampening(),
                        options.weight_decay(), options.nesterov()};
      mg::SgdStep composed = fused;
      for (size_t k = 0; k < fused_p.size(); ++k) {
        const Tensor g = random_grad(fused_p[k].shape(), 2000 + 10 * step + k);
        fused.tensors.push_back({fused_p[k], g, fused_buf[k], step == 0});
        composed.tensors.push_back({composed_p[k], g, composed_buf[k], step == 0});
      }
      cpu.sgd_step(fused);
      cpu.Backend::sgd_step(composed);  // the default: add_/mul_ one op at a time
      for (size_t k = 0; k < fused_p.size(); ++k) {
        require_bits(fused_p[k].to_vector<float>(), composed_p[k].to_vector<float>(),
                     fmt::format("parameter {}", k));
        if (momentum)
          require_bits(fused_buf[k].to_vector<float>(), composed_buf[k].to_vector<float>(),
                       fmt::format("momentum buffer {}", k));
      }
    }
  }
}

TEST_CASE("SGD fused step: gradients that are views into a flat bucket, strided views, and "
          "strided parameters") {
  const optim::SGDOptions options(0.1, 0.9, 0.0, 1e-2, true);
  // Gradients live side by side in one flat buffer, as DDP's gradient_as_bucket_view
  // makes them: contiguous views at an offset (fused).
  const Tensor a = random_values({7}, 30).set_requires_grad(true);
  const Tensor b = random_values({3, 5}, 31).set_requires_grad(true);
  // A transposed gradient (not contiguous) and a transposed parameter take the per-op
  // path; the results are the same rule.
  const Tensor c = random_values({4, 6}, 32).set_requires_grad(true);
  const Tensor d = random_values({5, 3}, 33).t().detach().set_requires_grad(true);
  REQUIRE_FALSE(d.is_contiguous());
  std::vector<ReferenceParam> reference;
  for (const Tensor& p : {a, b, c, d}) reference.push_back({p.to_vector<float>(), {}});
  optim::SGD sgd({a, b, c, d}, options);

  Tensor bucket = mg::zeros({1 + 7 + 15});
  for (int step = 0; step < 3; ++step) {
    INFO("step " << step + 1);
    mg::NoGradGuard no_grad;
    bucket.copy_(random_grad({1 + 7 + 15}, 3000 + step));
    const Tensor a_grad = bucket.narrow(0, 1, 7);
    const Tensor b_grad = bucket.narrow(0, 8, 15).view({3, 5});
    REQUIRE(a_grad.is_contiguous());
    REQUIRE(a_grad.storage_offset() == 1);
    a.set_grad(a_grad);
    b.set_grad(b_grad);
    const Tensor c_grad = random_grad({6, 4}, 3100 + step).t();
    REQUIRE_FALSE(c_grad.is_contiguous());
    c.set_grad(c_grad);
    d.set_grad(random_grad({3, 5}, 3200 + step));
    const auto bucket_before = bucket.to_vector<float>();

    reference_step(reference[0], a_grad.to_vector<float>(), options);
    reference_step(reference[1], b_grad.to_vector<float>(), options);
    reference_step(reference[2], c_grad.to_vector<float>(), options);
    reference_step(reference[3], d.grad().to_vector<float>(), options);
    sgd.step();
    const Tensor params[] = {a, b, c, d};
    for (size_t k = 0; k < 4; ++k) {
      require_bits(params[k].to_vector<float>(), reference[k].p, fmt::format("parameter {}", k));
      require_bits(sgd.momentum_buffer(k).to_vector<float>(), reference[k].buf,
                   fmt::format("momentum buffer {}", k));
    }
    require_bits(bucket.to_vector<float>(), bucket_before, "the gradient bucket (read only)");
  }
}

TEST_CASE("SGD fused step: momentum switched on between steps starts new buffers") {
  const Tensor p = random_values({4097}, 40).set_requires_grad(true);
  ReferenceParam reference{p.to_vector<float>(), {}};
  optim::SGD sgd({p}, optim::SGDOptions(0.1));
  for (int step = 0; step < 4; ++step) {
    if (step == 2) sgd.set_options(optim::SGDOptions(0.1, 0.9, 0.1, 1e-2));
    const Tensor g = random_grad({4097}, 4000 + step);
    p.set_grad(g);
    reference_step(reference, g.to_vector<float>(), sgd.options());
    sgd.step();
    require_bits(p.to_vector<float>(), reference.p, fmt::format("step {}", step + 1));
    REQUIRE(sgd.momentum_buffer(0).defined() == (step >= 2));
  }
}

TEST_CASE("Backend::sgd_step refuses tensors it cannot update, naming them") {
  mg::Backend& cpu = mg::backend(mg::DeviceType::CPU);
  const Tensor p = mg::zeros({3, 4});
  const Tensor g = mg::ones({3, 4});
  mg::SgdStep step{{{p, g, Tensor(), false}}, 0.1, 0.9, 0.0, 0.0, false};
  // momentum without a buffer
  REQUIRE_THROWS_WITH(cpu.sgd_step(step), MG_CONTAINS("sgd_step on cpu: tensor 0 does not fit"));
  step.momentum = 0.0;
  step.tensors[0].grad = mg::ones({4, 3}).t();  // right shape, not contiguous
  REQUIRE_THROWS_WITH(cpu.sgd_step(step), MG_CONTAINS("(not contiguous)"));
  step.tensors[0].grad = mg::ones({12});
  REQUIRE_THROWS_WITH(cpu.sgd_step(step), MG_CONTAINS("grad: shape [12]"));
  step.tensors[0].grad = g;
  cpu.sgd_step(step);
  require_bits(p.to_vector<float>(), std::vector<float>(12, static_cast<float>(-0.1)),
               "p after one step of -0.1 * 1");
}
