// Parameter groups (torch's param_groups): an optimizer of several groups steps each
// group exactly as an optimizer of that group alone with the group's options would; its
// learning rates are set all at once (set_lr) or per group; its state is numbered through
// all groups and round-trips; nanoGPT's split of weights that decay from those that don't;
// the warmup-then-cosine schedule at its boundaries.
#include "catch_compat.h"

#include <cmath>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include <minigrad/core/ops.h>
#include <minigrad/minigrad.h>

namespace optim = mg::optim;
using mg::Shape;
using mg::Tensor;

namespace {

Tensor random_values(const Shape& shape, uint64_t seed) {
  mg::manual_seed(seed);
  return mg::randn(shape);
}

std::vector<Tensor> clones(const std::vector<Tensor>& ts) {
  std::vector<Tensor> out;
  for (const Tensor& t : ts) out.push_back(mg::ops::clone(t).set_requires_grad(true));
  return out;
}

void set_grads(const std::vector<Tensor>& ps, int step) {
  for (size_t i = 0; i < ps.size(); ++i)
    ps[i].set_grad(random_values(ps[i].shape(), 1000 + 10 * static_cast<uint64_t>(step) + i));
}

// Group 0: a matrix and a vector; group 1: a matrix; group 2: empty; group 3: a vector.
std::vector<std::vector<Tensor>> make_groups() {
  return {{random_values({5, 3}, 1), random_values({3}, 2)},
          {random_values({2, 7}, 3)},
          {},
          {random_values({11}, 4)}};
}

struct GroupedCase {
  const char* name;
  // The optimizer of all groups (group g with options g), and one over a single group.
  std::function<std::unique_ptr<optim::Optimizer>(const std::vector<std::vector<Tensor>>&)> all;
  std::function<std::unique_ptr<optim::Optimizer>(std::vector<Tensor>, size_t group)> one;
};

std::vector<GroupedCase> grouped_cases() {
  const std::vector<optim::SGDOptions> sgd = {
      optim::SGDOptions(0.1, 0.9), optim::SGDOptions(0.05, 0.0, 0.0, 0.1),
      optim::SGDOptions(0.3), optim::SGDOptions(0.02, 0.8, 0.0, 0.01, true)};
  const std::vector<optim::AdamOptions> adam = {
      optim::AdamOptions(1e-2), optim::AdamOptions(3e-2).weight_decay(0.1).amsgrad(true),
      optim::AdamOptions(1e-3), optim::AdamOptions(5e-3).betas({0.8, 0.95})};
  const std::vector<optim::AdamWOptions> adamw = {
      optim::AdamWOptions(1e-2).weight_decay(0.1), optim::AdamWOptions(3e-2).weight_decay(0.0),
      optim::AdamWOptions(1e-3), optim::AdamWOptions(5e-3).amsgrad(true).eps(1e-6)};
  return {
      {"SGD",
       [=](const std::vector<std::vector<Tensor>>& groups) {
         std::vector<optim::ParamGroup<optim::SGDOptions>> g;
         // Group 2 takes the defaults (sgd[2]).
         for (size_t i = 0; i < groups.size(); ++i)
           g.push_back(i == 2 ? optim::ParamGroup<optim::SGDOptions>(groups[i])
                              : optim::ParamGroup<optim::SGDOptions>(groups[i], sgd[i]));
         return std::make_unique<optim::SGD>(std::move(g), sgd[2]);
       },
       [=](std::vector<Tensor> p, size_t group) {
         return std::make_unique<optim::SGD>(std::move(p), sgd[group]);
       }},
      {"Adam",
       [=](const std::vector<std::vector<Tensor>>& groups) {
         std::vector<optim::ParamGroup<optim::AdamOptions>> g;
         for (size_t i = 0; i < groups.size(); ++i)
           g.push_back(i == 2 ? optim::ParamGroup<optim::AdamOptions>(groups[i])
                              : optim::ParamGroup<optim::AdamOptions>(groups[i], adam[i]));
         return std::make_unique<optim::Adam>(std::move(g), adam[2]);
       },
       [=](std::vector<Tensor> p, size_t group) {
         return std::make_unique<optim::Adam>(std::move(p), adam[group]);
       }},
      {"AdamW",
       [=](const std::vector<std::vector<Tensor>>& groups) {
         std::vector<optim::ParamGroup<optim::AdamWOptions>> g;
         for (size_t i = 0; i < groups.size(); ++i)
           g.push_back(i == 2 ? optim::ParamGroup<optim::AdamWOptions>(groups[i])
                              : optim::ParamGroup<optim::AdamWOptions>(groups[i], adamw[i]));
         return std::make_unique<optim::AdamW>(std::move(g), adamw[2]);
       },
       [=](std::vector<Tensor> p, size_t group) {
         return std::make_unique<optim::AdamW>(std::move(p), adamw[group]);
       }},
  };
}

}  // namespace

TEST_CASE("Param groups: each group steps as an optimizer of that group alone, bit for bit") {
  for (const GroupedCase& c : grouped_cases()) {
    INFO(c.name);
    const auto groups = make_groups();
    auto all = c.all(groups);
    REQUIRE(all->param_group_count() == 4);
    REQUIRE(all->parameters().size() == 4);
    CHECK(all->param_group_begin(1) == 2);
    CHECK(all->param_group_end(1) == 3);
    CHECK(all->param_group_begin(2) == 3);  // empty
    CHECK(all->param_group_end(2) == 3);
    CHECK(all->param_group_of(0) == 0);
    CHECK(all->param_group_of(1) == 0);
    CHECK(all->param_group_of(2) == 1);
    CHECK(all->param_group_of(3) == 3);

    std::vector<std::vector<Tensor>> alone_params;
    std::vector<std::unique_ptr<optim::Optimizer>> alone;
    for (size_t g = 0; g < groups.size(); ++g) {
      alone_params.push_back(clones(groups[g]));
      alone.push_back(c.one(alone_params.back(), g));
    }
    for (int step = 0; step < 4; ++step) {
      INFO("step " << step + 1);
      set_grads(all->parameters(), step);
      for (size_t g = 0, i = 0; g < groups.size(); ++g)
        for (const Tensor& p : alone_params[g]) p.set_grad(all->parameters()[i++].grad());
      all->step();
      for (auto& o : alone) o->step();
      for (size_t g = 0, i = 0; g < groups.size(); ++g)
        for (const Tensor& p : alone_params[g])
          REQUIRE(all->parameters()[i++].to_vector<float>() == p.to_vector<float>());
    }
  }
}

TEST_CASE("Param groups: set_lr sets every group's learning rate, set_group_lr one group's") {
  for (const GroupedCase& c : grouped_cases()) {
    INFO(c.name);
    auto opt = c.all(make_groups());
    opt->set_group_lr(1, 0.25);
    CHECK(opt->group_lr(1) == 0.25);
    CHECK(opt->group_lr(0) != 0.25);
    opt->set_lr(0.125);
    for (size_t g = 0; g < 4; ++g) CHECK(opt->group_lr(g) == 0.125);
    CHECK(opt->lr() == 0.125);
    REQUIRE_THROWS_WITH(opt->set_group_lr(4, 0.1),
                        MG_CONTAINS(std::string(c.name) +
                                    "::set_group_lr: group 4 out of range for 4 parameter groups"));
    REQUIRE_THROWS_WITH(opt->set_group_lr(0, -1.0), MG_CONTAINS("invalid learning rate: -1"));
    CHECK(opt->group_lr(0) == 0.125);
    REQUIRE_THROWS_WITH(opt->make_like(opt->parameters()),
                        MG_CONTAINS("make_like: builds an optimizer of one group's options, but "
                                    "this one has 4 groups"));
  }
}

TEST_CASE("Param groups: the per-group options are read back and changed one group at a time") {
  const auto groups = make_groups();
  optim::AdamW opt({optim::ParamGroup<optim::AdamWOptions>(groups[0]),
                    optim::ParamGroup<optim::AdamWOptions>(
                        groups[1], optim::AdamWOptions(2e-3).weight_decay(0.0))},
                   optim::AdamWOptions(6e-4).weight_decay(0.1));
  CHECK(opt.options(0).lr() == 6e-4);
  CHECK(opt.options(0).weight_decay() == 0.1);
  CHECK(opt.options(1).lr() == 2e-3);
  CHECK(opt.options(1).weight_decay() == 0.0);
  opt.set_group_options(1, optim::AdamWOptions(1e-3).amsgrad(true));
  CHECK(opt.options(1).amsgrad());
  CHECK_FALSE(opt.options(0).amsgrad());
  REQUIRE_THROWS_WITH(opt.options(2),
                      MG_CONTAINS("AdamW::options: group 2 out of range for 2 parameter groups"));
  // Options are validated group by group, naming the optimizer.
  REQUIRE_THROWS_WITH(
      optim::SGD({optim::ParamGroup<optim::SGDOptions>(groups[0]),
                  optim::ParamGroup<optim::SGDOptions>(groups[1], optim::SGDOptions(-0.5))},
                 optim::SGDOptions(0.1)),
      MG_CONTAINS("SGD: invalid learning rate: -0.5"));
}

TEST_CASE("Param groups: a tensor in two groups is refused, groups may be empty, not absent") {
  const Tensor a = random_values({3}, 1).set_requires_grad(true);
  const Tensor b = random_values({2, 2}, 2).set_requires_grad(true);
  REQUIRE_THROWS_WITH(
      optim::Adam({optim::ParamGroup<optim::AdamOptions>({a, b}),
                   optim::ParamGroup<optim::AdamOptions>({b})}),
      MG_CONTAINS("Adam: parameter 2 is the same tensor as parameter 1; each would be updated "
                  "twice per step"));
  REQUIRE_THROWS_WITH(optim::AdamW(std::vector<optim::ParamGroup<optim::AdamWOptions>>{}),
                      MG_CONTAINS("AdamW: no parameter groups"));
  optim::AdamW only_empty({optim::ParamGroup<optim::AdamWOptions>(std::vector<Tensor>{})});
  CHECK(only_empty.param_group_count() == 1);
  only_empty.step();  // nothing to do
  REQUIRE_THROWS_WITH(only_empty.param_group_of(0),
                      MG_CONTAINS("AdamW::param_group_of: index 0 out of range for 0 parameters"));
}

TEST_CASE("Param groups: state is numbered through the groups and round-trips bit for bit") {
  for (const GroupedCase& c : grouped_cases()) {
    INFO(c.name);
    const auto groups = make_groups();
    auto opt = c.all(groups);
    for (int step = 0; step < 2; ++step) {
      set_grads(opt->parameters(), step);
      opt->step();
    }
    const optim::TensorDict state = opt->state_dict();
    // Parameter 3 is the first of group 3 (after the empty group 2).
    const std::string key3 = std::string(c.name) == "SGD" ? "momentum_buffer.3" : "exp_avg.3";
    REQUIRE(state.count(key3) == 1);
    CHECK(state.at(key3).shape() == Shape{11});

    auto copies = groups;
    for (auto& g : copies) g = clones(g);
    {
      mg::NoGradGuard no_grad;
      for (size_t g = 0; g < groups.size(); ++g)
        for (size_t k = 0; k < groups[g].size(); ++k) copies[g][k].copy_(groups[g][k]);
    }
    auto resumed = c.all(copies);
    resumed->load_state_dict(state, "grouped state");
    for (int step = 2; step < 5; ++step) {
      set_grads(opt->parameters(), step);
      set_grads(resumed->parameters(), step);
      opt->step();
      resumed->step();
    }
    for (size_t i = 0; i < opt->parameters().size(); ++i)
      CHECK(opt->parameters()[i].to_vector<float>() == resumed->parameters()[i].to_vector<float>());
  }
}

TEST_CASE("Param groups: amsgrad in one group keeps max_exp_avg_sq for that group's parameters") {
  const auto groups = make_groups();
  optim::Adam opt({optim::ParamGroup<optim::AdamOptions>(groups[0]),
                   optim::ParamGroup<optim::AdamOptions>(groups[1],
                                                         optim::AdamOptions(1e-2).amsgrad(true))});
  set_grads(opt.parameters(), 0);
  opt.step();
  CHECK_FALSE(opt.max_exp_avg_sq(0).defined());
  CHECK(opt.max_exp_avg_sq(2).defined());
  const optim::TensorDict state = opt.state_dict();
  CHECK(state.count("max_exp_avg_sq.2") == 1);
  CHECK(state.count("max_exp_avg_sq.0") == 0);
  // A state without it for the amsgrad group is incomplete, and says so.
  optim::TensorDict missing = state;
  missing.erase("max_exp_avg_sq.2");
  REQUIRE_THROWS_WITH(opt.load_state_dict(missing, "ck.safetensors"),
                      MG_CONTAINS("'max_exp_avg_sq.2' is missing (amsgrad is on)"));
}

TEST_CASE("weight_decay_groups: nanoGPT's split, 2-D and larger weights decay, others don't") {
  const Tensor w = random_values({4, 3}, 1).set_requires_grad(true);
  const Tensor bias = random_values({4}, 2).set_requires_grad(true);
  const Tensor emb = random_values({2, 3, 2}, 3).set_requires_grad(true);
  const Tensor scale = random_values({3}, 4).set_requires_grad(true);
  const auto groups =
      optim::weight_decay_groups({w, bias, emb, scale}, optim::AdamWOptions(6e-4).weight_decay(0.1));
  REQUIRE(groups.size() == 2);
  REQUIRE(groups[0].params.size() == 2);
  CHECK(groups[0].params[0].is_same(w));
  CHECK(groups[0].params[1].is_same(emb));
  CHECK(groups[0].options->weight_decay() == 0.1);
  REQUIRE(groups[1].params.size() == 2);
  CHECK(groups[1].params[0].is_same(bias));
  CHECK(groups[1].params[1].is_same(scale));
  CHECK(groups[1].options->weight_decay() == 0.0);
  CHECK(groups[1].options->lr() == 6e-4);

  // A step: the 1-D parameters with a zero gradient do not move (no decay), the weights do.
  optim::AdamW opt(groups);
  for (const Tensor& p : {w, bias, emb, scale}) p.set_grad(mg::zeros(p.shape()));
  const auto before_bias = bias.to_vector<float>();
  const auto before_w = w.to_vector<float>();
  opt.step();
  CHECK(bias.to_vector<float>() == before_bias);
  CHECK(w.to_vector<float>() != before_w);
}

TEST_CASE("WarmupCosine: linear warmup, cosine to the floor, then the floor") {
  const double max_lr = 1e-3, min_lr = 1e-4;
  const optim::WarmupCosine lr(max_lr, min_lr, 10, 110);
  CHECK(lr(0) == Approx(max_lr * 1 / 11));  // nanoGPT's (it + 1) / (warmup + 1)
  CHECK(lr(9) == Approx(max_lr * 10 / 11));
  CHECK(lr(10) == max_lr);                  // the top, exactly
  CHECK(lr(60) == Approx((max_lr + min_lr) / 2));
  CHECK(lr(35) == Approx(min_lr + 0.5 * (1 + std::cos(M_PI * 0.25)) * (max_lr - min_lr)));
  CHECK(lr(110) == min_lr);
  CHECK(lr(111) == min_lr);
  CHECK(lr(1'000'000) == min_lr);
  for (int64_t s = 10; s < 110; ++s) CHECK(lr(s + 1) <= lr(s));  // never rises after warmup
  for (int64_t s = 0; s < 10; ++s) CHECK(lr(s + 1) > lr(s));

  const optim::WarmupCosine no_warmup(1.0, 0.0, 0, 4);
  CHECK(no_warmup(0) == 1.0);
  CHECK(no_warmup(2) == Approx(0.5));
  CHECK(no_warmup(4) == 0.0);
  const optim::WarmupCosine no_decay(1.0, 0.5, 3, 3);  // warmup, then the floor
  CHECK(no_decay(2) == Approx(0.75));
  CHECK(no_decay(3) == 0.5);

  REQUIRE_THROWS_WITH(optim::WarmupCosine(1e-3, 1e-2, 0, 10),
                      MG_CONTAINS("WarmupCosine: the learning rates must satisfy 0 <= min_lr <= "
                                  "max_lr, got max_lr 0.001 and min_lr 0.01"));
  REQUIRE_THROWS_WITH(optim::WarmupCosine(1e-3, 0.0, 20, 10),
                      MG_CONTAINS("0 <= warmup_steps <= decay_steps, got warmup_steps 20 and "
                                  "decay_steps 10"));
  REQUIRE_THROWS_WITH(optim::WarmupCosine(NAN, 0.0, 0, 10), MG_CONTAINS("max_lr nan"));
  REQUIRE_THROWS_WITH(lr(-1), MG_CONTAINS("WarmupCosine: step -1 is negative"));
}
