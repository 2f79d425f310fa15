// Tensor parallelism across processes (Gloo ranks): the same layers as in one process
// (tests/parallel/tensor_parallel_test.cpp), each process holding one rank's shards.
// Every rank also runs the plain model on the whole batch itself and compares its own
// pieces with it (parallel/tp_check.h), reporting the worst disagreement; the parent
// asserts. One fork per test case: starting ranks is the slow part.
#ifdef MINIGRAD_WITH_GLOO

#include "catch_compat.h"
#include "multiprocess.h"
#include "parallel/tp_check.h"

#include <minigrad/core/ops.h>
#include <minigrad/parallel/c10d/device_mesh.h>
#include <minigrad/parallel/c10d/gloo/process_group_gloo.h>
#include <minigrad/parallel/ddp/distributed_data_parallel.h>
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

TEST_CASE("tensor parallelism over Gloo ranks (4, and 2 in each sub-group) equals the plain model") {
  // One fork of 4 ranks: tensor parallelism over all 4, then over the two sub-groups
  // {0, 1} and {2, 3} at once (the tensor-parallel groups of a 2 x 2 mesh). Each check
  // also shows that a column layer without the backward all-reduce fails it.
  auto results = run_ranks(4, [](RankContext& ctx) {
    auto world = ctx.gloo();
    check_rank(ctx, parallel::tensor_parallel_group(world), "world ");
    parallel::DeviceMesh mesh(world, 2, 2);
    ctx.report("mesh", mesh.str());
    check_rank(ctx, parallel::tensor_parallel_group(mesh.tp_group()), "tp ");
  });
  INFO(describe(results));
  for (const RankResult& r : results) {
    REQUIRE(r.ok());
    require_rank_passed(r, "world ");
    require_rank_passed(r, "tp ");
    REQUIRE(r.text("mesh") == fmt::format("DeviceMesh(dp=2, tp=2), rank {} = (dp {}, tp {})",
                                          r.rank, r.rank / 2, r.rank % 2));
  }
}

TEST_CASE("2 x 2: DDP over the data-parallel groups with tensor parallelism inside equals the "
          "single-process step on the whole batch") {
  // Ranks (dp, tp): {0, 1} and {2, 3} share layers, {0, 2} and {1, 3} share shards. Each
  // data-parallel rank takes half of every batch; DDP averages its shards' gradients
  // with the other half's. Wrong on purpose: DDP over the whole world, which averages
  // different shards together (and makes every rank start from rank 0's shards).
  auto results = run_ranks(4, [](RankContext& ctx) {
    auto world = ctx.gloo();
    parallel::DeviceMesh mesh(world, 2, 2);
    auto tp = parallel::tensor_parallel_group(mesh.tp_group());
    auto build = [&](const std::shared_ptr<parallel::ProcessGroup>& ddp_group) {
      return [&, ddp_group](const nn::Sequential& plain) {
        mg::testing::ShardedModel sharded;
        auto shard = parallel::parallelize_mlp(plain, tp);
        sharded.model = std::make_shared<parallel::DistributedDataParallel>(shard, ddp_group);
        sharded.shards = {{tp->rank(), shard}};
        sharded.ranks = tp->size();
        sharded.rows = [&mesh](const Tensor& t) {
          const int64_t half = t.size(0) / mesh.dp_size();
          return t.narrow(0, mesh.dp_rank() * half, half);
        };
        sharded.loss = [&mesh](const Tensor& loss) {  // the mean over the halves
          Tensor mean = ops::clone(loss.detach());  // reduced in place
          mesh.dp_group()->allreduce(mean, parallel::ReduceOp::Average)->wait();
          return mean;
        };
        return sharded;
      };
    };
    int config = 0;
    for (const std::vector<int64_t>& widths :
         {std::vector<int64_t>{7, 12, 5, 8, 3}, std::vector<int64_t>{9, 8, 4, 5}}) {
      for (int64_t batch : {6, 10}) {  // even: DDP averages equal halves
        const auto m = mg::testing::sharded_against_plain(widths, batch, Device::cpu(), 3,
                                                          build(mesh.dp_group()));
        ctx.report(fmt::format("worst {}", config), std::vector<float>{static_cast<float>(m.worst)});
        ctx.report(fmt::format("where {}", config), m.where);
        ++config;
      }
    }
    const auto wrong = mg::testing::sharded_against_plain({7, 12, 5, 8, 3}, 6, Device::cpu(), 3,
                                                          build(world));
    ctx.report("wrong worst", std::vector<float>{static_cast<float>(wrong.worst)});
  });
  INFO(describe(results));
  for (const RankResult& r : results) {
    REQUIRE(r.ok());
    for (int config = 0; config < 4; ++config) {
      INFO("rank " << r.rank << ", configuration " << config << ": "
                   << r.text(fmt::format("where {}", config)));
      REQUIRE(r.floats(fmt::format("worst {}", config))[0] <= 1.0f);
    }
    REQUIRE(r.floats("wrong worst")[0] > 100.0f);
  }
}

TEST_CASE("DeviceMesh refuses a shape that does not match the job") {
  parallel::TCPStoreOptions options;
  options.is_server = true;
  auto store = std::make_shared<parallel::TCPStore>("127.0.0.1", 0, options);
  auto world = std::make_shared<parallel::ProcessGroupGloo>(store, 0, 1);
  REQUIRE_THROWS_WITH(parallel::DeviceMesh(world, 2, 2),
                      MG_CONTAINS("DeviceMesh: dp=2 x tp=2 = 4 ranks, but the job has 1; the "
                                  "data-parallel size must be world size / tensor-parallel size"));
  REQUIRE_THROWS_WITH(parallel::DeviceMesh(world, 0, 1),
                      MG_CONTAINS("DeviceMesh: dp and tp must be at least 1, got dp=0 tp=1"));
  REQUIRE_THROWS_WITH(parallel::tensor_parallel_group(nullptr),
                      MG_CONTAINS("tensor_parallel_group: the process group is null"));
}

#endif  // MINIGRAD_WITH_GLOO
