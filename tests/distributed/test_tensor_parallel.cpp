// Tensor parallelism across processes (Gloo ranks): the same layers as in one process
// (tests/parallel/tensor_parallel_test.cpp), each process holding one rank's shards.
// Every rank also runs the plain model on the whole batch itself and compares its own
// pieces with it (parallel/tp_check.h), reporting the worst disagreement; the parent
// asserts. One fork per test case: starting ranks is the slow part.
#ifdef MINIGRAD_WITH_GLOO

#include "catch_compat.h"
#include "multiprocess.h"
#include "parallel/tp_check.h"

#include <minigrad/parallel/distributed/process_group_gloo.h>
#include <minigrad/parallel/tensor_parallel/group.h>

using namespace mg;
using namespace mg::test;

namespace {

// This process's shard of `plain`, as sharded_against_plain wants it.
mg::testing::ShardedModel rank_shard(const nn::Sequential& plain,
                                     const parallel::TensorParallelGroupPtr& group,
                                     const mg::testing::MakeShard& make_shard) {
  mg::testing::ShardedModel sharded;
  sharded.model = make_shard(plain, group);
  sharded.shards = {{group->rank(), sharded.model}};
  sharded.ranks = group->size();
  return sharded;
}

// The checks one rank runs on `group`, reported under `prefix`.
void check_rank(RankContext& ctx, const parallel::TensorParallelGroupPtr& group,
                const std::string& prefix) {
  int config = 0;
  for (const std::vector<int64_t>& widths :
       {std::vector<int64_t>{7, 12, 5, 8, 3}, std::vector<int64_t>{9, 8, 4, 5}}) {
    for (int64_t batch : {5, 11}) {
      const auto m = mg::testing::sharded_against_plain(
          widths, batch, Device::cpu(), 3, [&](const nn::Sequential& plain) {
            return rank_shard(plain, group, mg::testing::default_shard);
          });
      ctx.report(fmt::format("{}worst {}", prefix, config), std::vector<float>{static_cast<float>(m.worst)});
      ctx.report(fmt::format("{}where {}", prefix, config), m.where);
      ++config;
    }
  }
  const auto gathered = mg::testing::sharded_against_plain(
      {7, 12, 5}, 9, Device::cpu(), 3, [&](const nn::Sequential& plain) {
        return rank_shard(plain, group, mg::testing::shard_with_gather_and_scatter);
      });
  ctx.report(prefix + "gather worst", std::vector<float>{static_cast<float>(gathered.worst)});
  ctx.report(prefix + "gather where", gathered.where);
  const auto wrong = mg::testing::sharded_against_plain(
      {7, 12, 5, 8, 3}, 5, Device::cpu(), 3, [&](const nn::Sequential& plain) {
        return rank_shard(plain, group, mg::testing::shard_without_backward_all_reduce);
      });
  ctx.report(prefix + "wrong worst", std::vector<float>{static_cast<float>(wrong.worst)});

  // One training step of a two-block MLP on data: 2 forward all-reduces, 1 backward one.
  group->reset_stats();
  manual_seed(5);
  auto plain = std::static_pointer_cast<nn::Sequential>(mg::testing::make_mlp({6, 8, 6, 8, 4}));
  auto shard = parallel::parallelize_mlp(*plain, group);
  cross_entropy(shard->forward(randn({5, 6})), randint(0, 4, {5})).backward();
  const auto stats = group->stats();
  ctx.report(prefix + "all_reduces", std::vector<float>{static_cast<float>(stats.all_reduces),
                                                        static_cast<float>(stats.all_reduce_bytes),
                                                        static_cast<float>(stats.all_gathers)});
}

void require_rank_passed(const RankResult& r, const std::string& prefix) {
  for (int config = 0; config < 4; ++config) {
    INFO(prefix << " rank " << r.rank << ", configuration " << config << ": "
                << r.text(fmt::format("{}where {}", prefix, config)));
    REQUIRE(r.floats(fmt::format("{}worst {}", prefix, config))[0] <= 1.0f);
  }
  INFO(r.text(prefix + "gather where"));
  REQUIRE(r.floats(prefix + "gather worst")[0] <= 1.0f);
  REQUIRE(r.floats(prefix + "wrong worst")[0] > 100.0f);
  REQUIRE(r.floats(prefix + "all_reduces") == std::vector<float>{3, 5 * (6 + 4 + 6) * 4, 0});
}

}  // namespace

TEST_CASE("tensor parallelism over 2 Gloo ranks equals the plain model; a missing all-reduce does not") {
  auto results = run_ranks(2, [](RankContext& ctx) {
    check_rank(ctx, parallel::tensor_parallel_group(ctx.gloo()), "");
  });
  INFO(describe(results));
  for (const RankResult& r : results) {
    REQUIRE(r.ok());
    require_rank_passed(r, "");
  }
}

TEST_CASE("tensor parallelism over 4 Gloo ranks equals the plain model; a missing all-reduce does not") {
  auto results = run_ranks(4, [](RankContext& ctx) {
    check_rank(ctx, parallel::tensor_parallel_group(ctx.gloo()), "");
  });
  INFO(describe(results));
  for (const RankResult& r : results) {
    REQUIRE(r.ok());
    require_rank_passed(r, "");
  }
}

TEST_CASE("tensor_parallel_group refuses a null process group") {
  REQUIRE_THROWS_WITH(parallel::tensor_parallel_group(nullptr),
                      MG_CONTAINS("tensor_parallel_group: the process group is null"));
}

#endif  // MINIGRAD_WITH_GLOO
