// optim::Optimizer, the interface every optimizer shares, as a wrapper of "any
// optimizer" (ZeRO's sharded optimizer) uses it: an optimizer over flat 1-D views into
// one buffer (a shard) steps exactly as over the whole tensors; state moves between
// optimizers parameter by parameter (state / set_state) and through make_like; the
// learning rate is set through the base class; bad states are refused, naming them.
#include "catch_compat.h"

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include <fmt/format.h>

#include <minigrad/core/ops.h>
#include <minigrad/minigrad.h>

namespace optim = mg::optim;
using mg::Shape;
using mg::Tensor;

namespace {

using Factory = std::function<std::unique_ptr<optim::Optimizer>(std::vector<Tensor>)>;

struct Kind {
  const char* name;
  Factory make;
};

// The optimizers every test here walks, with options that use every part of their rule.
std::vector<Kind> kinds() {
  return {
      {"SGD", [](std::vector<Tensor> p) {
         return std::make_unique<optim::SGD>(std::move(p),
                                             optim::SGDOptions(0.05, 0.9, 0.0, 1e-2, true));
       }},
      {"Adam", [](std::vector<Tensor> p) {
         return std::make_unique<optim::Adam>(
             std::move(p), optim::AdamOptions(1e-2).weight_decay(0.1).amsgrad(true));
       }},
      {"AdamW", [](std::vector<Tensor> p) {
         return std::make_unique<optim::AdamW>(std::move(p),
                                               optim::AdamWOptions(1e-2).betas({0.8, 0.95}));
       }},
  };
}

Tensor random_values(const Shape& shape, uint64_t seed) {
  mg::manual_seed(seed);
  return mg::randn(shape);
}

std::vector<float> values(const Tensor& t) { return t.to_vector<float>(); }

}  // namespace

TEST_CASE("Optimizer: a shard of flat views into one buffer steps as the whole tensors do") {
  // Two parameters laid side by side in one flat buffer of 7 + 15 elements, cut into two
  // shards at element 9 (inside the second parameter), as ZeRO cuts its flat buffer.
  const std::vector<Shape> shapes = {{7}, {3, 5}};
  const int64_t total = 22, cut = 9;
  for (const Kind& kind : kinds()) {
    INFO(kind.name);
    std::vector<Tensor> whole;
    Tensor flat = mg::zeros({total});
    int64_t offset = 0;
    for (size_t k = 0; k < shapes.size(); ++k) {
      whole.push_back(random_values(shapes[k], 10 + k));
      mg::NoGradGuard no_grad;
      flat.narrow(0, offset, shapes[k].numel()).copy_(whole.back().reshape({-1}));
      offset += shapes[k].numel();
    }
    const std::vector<Tensor> shards = {flat.narrow(0, 0, cut), flat.narrow(0, cut, total - cut)};
    REQUIRE(shards[1].storage_offset() == cut);
    auto whole_opt = kind.make(whole);
    auto shard_opt = kind.make(shards);

    Tensor flat_grad = mg::zeros({total});
    for (int step = 0; step < 4; ++step) {
      INFO("step " << step + 1);
      {
        mg::NoGradGuard no_grad;
        flat_grad.copy_(random_values({total}, 100 + static_cast<uint64_t>(step)));
      }
      offset = 0;
      for (size_t k = 0; k < shapes.size(); ++k) {
        whole[k].set_grad(
            mg::ops::clone(flat_grad.narrow(0, offset, shapes[k].numel())).view(shapes[k]));
        offset += shapes[k].numel();
      }
      shards[0].set_grad(flat_grad.narrow(0, 0, cut));
      shards[1].set_grad(flat_grad.narrow(0, cut, total - cut));
      whole_opt->step();
      shard_opt->step();
      std::vector<float> expected;
      for (const Tensor& p : whole) {
        const auto v = values(p);
        expected.insert(expected.end(), v.begin(), v.end());
      }
      REQUIRE(values(flat) == expected);  // bit for bit: the update is elementwise
    }
  }
}

TEST_CASE("Optimizer: state moves parameter by parameter, and make_like continues bit for bit") {
  for (const Kind& kind : kinds()) {
    INFO(kind.name);
    const Tensor a = random_values({4097}, 20), b = random_values({13, 17}, 21);
    Tensor a2 = mg::ops::clone(a), b2 = mg::ops::clone(b);
    auto original = kind.make({a, b});
    const auto set_grads = [&](int step) {
      const Tensor ga = random_values({4097}, 200 + static_cast<uint64_t>(step));
      const Tensor gb = random_values({13, 17}, 300 + static_cast<uint64_t>(step));
      a.set_grad(ga);
      b.set_grad(gb);
      a2.set_grad(ga);
      b2.set_grad(gb);
    };
    for (int step = 0; step < 2; ++step) {
      set_grads(step);
      original->step();
    }
    mg::NoGradGuard no_grad;
    a2.copy_(a);
    b2.copy_(b);
    // A new optimizer of the same kind and options, given the state one parameter at a
    // time (in the other order, to show the index is what counts).
    auto copy = original->make_like({a2, b2});
    REQUIRE(copy->name() == original->name());
    REQUIRE(copy->state(0).empty());
    copy->set_state(1, original->state(1));
    copy->set_state(0, original->state(0));
    for (const auto& [name, t] : original->state(0)) {
      INFO(name);
      REQUIRE_FALSE(copy->state(0).at(name).is_same(t));  // copies, not shared
    }
    for (int step = 2; step < 5; ++step) {
      set_grads(step);
      original->step();
      copy->step();
      REQUIRE(values(a2) == values(a));
      REQUIRE(values(b2) == values(b));
    }
    // An empty state clears a parameter's state.
    copy->set_state(0, {});
    CHECK(copy->state(0).empty());
    CHECK_FALSE(copy->state(1).empty());
  }
}

TEST_CASE("Optimizer: set_lr through the base class, and bad states refused by name") {
  for (const Kind& kind : kinds()) {
    INFO(kind.name);
    const Tensor p = random_values({6}, 30);
    auto opt = kind.make({p});
    opt->set_lr(0.25);
    CHECK(opt->lr() == 0.25);
    REQUIRE_THROWS_WITH(opt->set_lr(-1.0), MG_CONTAINS("invalid learning rate: -1"));
    CHECK(opt->lr() == 0.25);

    p.set_grad(random_values({6}, 31));
    opt->step();
    const optim::TensorDict good = opt->state(0);
    REQUIRE_FALSE(good.empty());
    optim::TensorDict bad = good;
    bad.begin()->second = mg::zeros({7});
    bad["no_such_state"] = mg::zeros({6});
    try {
      opt->set_state(0, bad, "shard 3");
      FAIL("set_state accepted a bad state");
    } catch (const mg::Error& e) {
      const std::string msg = e.what();
      CHECK_THAT(msg, MG_CONTAINS(fmt::format("{}::set_state: shard 3 does not fit", kind.name)));
      CHECK_THAT(msg, MG_CONTAINS("unexpected key 'no_such_state'"));
      CHECK_THAT(msg, MG_CONTAINS(fmt::format("'{}' has shape [7]", good.begin()->first)));
    }
    // Nothing changed.
    for (const auto& [name, t] : opt->state(0)) CHECK(t.is_same(good.at(name)));
    REQUIRE_THROWS_WITH(opt->set_state(1, good), MG_CONTAINS("index 1 out of range for 1"));
    REQUIRE_THROWS_WITH(opt->state(1), MG_CONTAINS("index 1 out of range for 1"));
  }
}
