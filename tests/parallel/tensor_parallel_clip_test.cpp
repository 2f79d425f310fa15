// clip_grad_norm_ over a tensor-parallel model in one process (TensorParallel over CPU
// devices): the norm is the plain model's, every gradient is scaled alike, and the naive
// clip over every rank's parameters (which counts a replicated one once per rank) is not.
#include <cmath>
#include <limits>

#include "catch_compat.h"
#include "parallel/dp_check.h"

#include <minigrad/minigrad.h>

using namespace mg;
using mg::testing::cpus;

namespace {

// The plain MLP and its tensor-parallel twin over `ranks` CPU devices after one backward
// on the same batch. 6-8-6-4: a column/row pair, then a Linear left whole (replicated),
// beside the row layer's replicated bias.
struct Twins {
  std::shared_ptr<nn::Sequential> plain;
  std::shared_ptr<parallel::TensorParallel> tp;
};

Twins backward_both(int ranks) {
  manual_seed(21);
  Twins t;
  t.plain = std::static_pointer_cast<nn::Sequential>(mg::testing::make_mlp({6, 8, 6, 4}));
  t.tp = std::make_shared<parallel::TensorParallel>(*t.plain, cpus(static_cast<size_t>(ranks)));
  manual_seed(22);
  const Tensor x = randn({9, 6});
  const Tensor y = randint(0, 4, {9});
  cross_entropy(t.plain->forward(x), y).backward();
  cross_entropy(t.tp->forward(x), y).backward();
  return t;
}

std::vector<std::vector<float>> grads(const std::vector<Tensor>& params) {
  std::vector<std::vector<float>> g;
  for (const Tensor& p : params) g.push_back(p.grad().to_vector<float>());
  return g;
}

}  // namespace

TEST_CASE("tensor-parallel clip_grad_norm_ in one process: the plain model's norm, every "
          "gradient scaled alike") {
  const double inf = std::numeric_limits<double>::infinity();
  for (int ranks : {2, 4}) {
    for (double norm_type : {2.0, 1.0, 3.0, inf}) {
      INFO(ranks << " ranks, norm " << norm_type);
      Twins t = backward_both(ranks);
      const auto split = parallel::tensor_parallel_parameters(*t.tp->shard(0));
      REQUIRE(split.sharded.size() == 3);     // column weight and bias, row weight
      REQUIRE(split.replicated.size() == 3);  // row bias, the last Linear's weight and bias
      const std::vector<Tensor> tp_params = t.tp->parameters();
      const auto before = grads(tp_params);
      // The naive clip counts the replicated gradients once per rank: a larger norm.
      std::vector<Tensor> every_rank_grad;
      for (const Tensor& p : tp_params) every_rank_grad.push_back(p.grad());
      const float naive = nn::utils::get_total_norm(every_rank_grad, norm_type).item<float>();

      const float expected = nn::utils::clip_grad_norm_(t.plain->parameters(), 0.05, norm_type)
                                 .item<float>();
      const float total = parallel::clip_grad_norm_(*t.tp, 0.05, norm_type).item<float>();
      REQUIRE(total == Approx(expected).epsilon(1e-5));
      if (!std::isinf(norm_type)) REQUIRE(naive > expected * 1.0001f);
      REQUIRE(expected > 0.05f);  // so the clip scales

      const float coef = static_cast<float>(0.05 / (static_cast<double>(total) + 1e-6));
      const auto after = grads(tp_params);
      for (size_t i = 0; i < after.size(); ++i)
        for (size_t j = 0; j < after[i].size(); ++j)
          REQUIRE(after[i][j] == Approx(before[i][j] * coef).margin(1e-7));
    }
  }
}

TEST_CASE("tensor-parallel clip_grad_norm_: a null group and a negative max_norm are errors") {
  Twins t = backward_both(2);
  REQUIRE_THROWS_WITH(parallel::clip_grad_norm_(*t.tp->shard(0), nullptr, 1.0),
                      MG_CONTAINS("tensor-parallel clip_grad_norm_: the group is null"));
  REQUIRE_THROWS_WITH(parallel::clip_grad_norm_(*t.tp, -1.0),
                      MG_CONTAINS("clip_grad_norm_: max_norm must be >= 0, got -1"));
}
