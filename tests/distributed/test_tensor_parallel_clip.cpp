// clip_grad_norm_ over a tensor-parallel model across Gloo ranks: each rank clips its own
// shards (parallel/tensor_parallel/clip_grad.h), and the norm is the plain model's on the
// whole batch, the same on every rank; every gradient is scaled by the same coefficient.
// One process per rank; the plain model runs in each rank too, and the parent compares.
#ifdef MINIGRAD_WITH_GLOO

#include <limits>

#include "catch_compat.h"
#include "multiprocess.h"
#include "parallel/dp_check.h"

#include <minigrad/autograd/functions.h>
#include <minigrad/core/generator.h>
#include <minigrad/nn/utils/clip_grad.h>
#include <minigrad/parallel/tensor_parallel/clip_grad.h>
#include <minigrad/parallel/tensor_parallel/layers.h>

using namespace mg;
using namespace mg::test;

TEST_CASE("tensor-parallel clip_grad_norm_ across Gloo ranks equals the plain model's clip") {
  const double inf = std::numeric_limits<double>::infinity();
  const std::vector<double> norm_types = {2.0, 1.0, inf};
  auto results = run_ranks(2, [&](RankContext& ctx) {
    auto group = parallel::tensor_parallel_group(ctx.gloo());
    for (const double norm_type : norm_types) {
      const std::string at = fmt::format(" {}", norm_type);
      // 6-8-6-4: a column/row pair and a Linear left whole on every rank.
      manual_seed(31);
      auto plain = std::static_pointer_cast<nn::Sequential>(mg::testing::make_mlp({6, 8, 6, 4}));
      auto shard = parallel::parallelize_mlp(*plain, group);
      manual_seed(32);
      const Tensor x = randn({7, 6});
      const Tensor y = randint(0, 4, {7});
      cross_entropy(plain->forward(x), y).backward();
      cross_entropy(shard->forward(x), y).backward();
      std::vector<float> before;
      for (const Tensor& p : shard->parameters())
        for (float g : p.grad().to_vector<float>()) before.push_back(g);
      ctx.report("plain" + at, nn::utils::clip_grad_norm_(plain->parameters(), 0.05, norm_type));
      ctx.report("total" + at, parallel::clip_grad_norm_(*shard, group, 0.05, norm_type));
      std::vector<float> ratio;
      std::size_t i = 0;
      for (const Tensor& p : shard->parameters())
        for (float g : p.grad().to_vector<float>()) {
          if (before[i] != 0.0f) ratio.push_back(g / before[i]);
          ++i;
        }
      ctx.report("ratios" + at, ratio);
      // This rank's own parameters alone: what a clip unaware of the other shards sees.
      ctx.report("local" + at, nn::utils::get_total_norm(
                                   [&] {
                                     std::vector<Tensor> g;
                                     for (const Tensor& p : shard->parameters()) g.push_back(p.grad());
                                     return g;
                                   }(),
                                   norm_type));
    }
  });
  INFO(describe(results));
  for (const RankResult& r : results) {
    REQUIRE(r.ok());
    for (const double norm_type : norm_types) {
      INFO("rank " << r.rank << ", norm " << norm_type);
      const std::string at = fmt::format(" {}", norm_type);
      const float plain = r.floats("plain" + at)[0];
      const float total = r.floats("total" + at)[0];
      REQUIRE(plain > 0.05f);  // so the clip scales
      REQUIRE(total == Approx(plain).epsilon(1e-5));
      REQUIRE(total == results[0].floats("total" + at)[0]);  // the same on every rank
      if (norm_type != inf) REQUIRE(r.floats("local" + at)[0] < plain * 0.9999f);
      const float coef = static_cast<float>(0.05 / (static_cast<double>(total) + 1e-6));
      for (const float ratio : r.floats("ratios" + at)) REQUIRE(ratio == Approx(coef).epsilon(1e-4));
    }
  }
}

#endif  // MINIGRAD_WITH_GLOO
