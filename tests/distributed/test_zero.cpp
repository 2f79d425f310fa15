// ZeroRedundancyOptimizer (ZeRO-1 under DDP, ZeRO-2 on the plain module) on CPU with
// Gloo: its steps equal the single-process steps on the whole batch and DDP's, with
// clipping, for buckets whose shards split tensors or hold padding alone; wrong variants
// fail that comparison; its checkpoints round-trip; a dead rank fails the all-gather.
#ifdef MINIGRAD_WITH_GLOO

#include <signal.h>

#include "sharding_helpers.h"
#include "temp_dir.h"

#include <minigrad/nn/serialize.h>
#include <minigrad/parallel/ddp/distributed_data_parallel.h>
#include <minigrad/parallel/sharded/zero_redundancy_optimizer.h>

using namespace mg;
using namespace mg::parallel;
using namespace mg::test;
using namespace std::chrono_literals;

namespace {

constexpr int kSteps = 3;
constexpr double kTinyBuckets = 4.0 / (1 << 20);  // 4 bytes: a bucket per tensor

struct Setup {
  int stage = 1;
  double bucket_cap_mb = 25.0;
  double max_norm = 0.0;        // clip before every step when > 0
  bool with_ddp = true;         // stage 1's gradients come from DDP
  bool averaged_twice = false;  // a wrong variant: the loss divided by the world size too
};

// Trains the uneven MLP with ZeRO on this rank's slices; reports the losses, the first
// step's gradient (stage 1: the full one; stage 2: each bucket's shard), the parameters.
void train_zero(RankContext& ctx, const Setup& setup, const MakeOptimizer& make) {
  auto pg = ctx.gloo();
  auto net = make_uneven_mlp(77 + static_cast<uint64_t>(ctx.rank));
  std::shared_ptr<DistributedDataParallel> ddp;
  if (setup.with_ddp) ddp = std::make_shared<DistributedDataParallel>(net, pg);
  ZeroOptions options;
  options.stage = setup.stage;
  options.bucket_cap_mb = setup.bucket_cap_mb;
  ZeroRedundancyOptimizer zero(net->parameters(), pg, make, options);
  std::vector<float> losses;
  for (int step = 0; step < kSteps; ++step) {
    const ShardBatch b = local_slice(step, ctx.rank, ctx.world_size);
    zero.zero_grad();
    Tensor loss = cross_entropy(ddp ? ddp->forward(b.x) : net->forward(b.x), b.y);
    losses.push_back(loss.item<float>());
    if (setup.averaged_twice) loss = loss * (1.0 / ctx.world_size);
    loss.backward();
    if (setup.max_norm > 0.0) zero.clip_grad_norm_(setup.max_norm);
    if (step == 0) {
      if (setup.stage == 1) ctx.report("grads", flat_values(net->parameters(), true));
      for (size_t k = 0; k < zero.num_buckets() && setup.stage == 2; ++k) {
        ctx.report(fmt::format("grad.{}", k), zero.bucket(k).shard().grad());
        std::vector<float> members;
        for (size_t i : zero.bucket(k).indices()) members.push_back(static_cast<float>(i));
        ctx.report(fmt::format("members.{}", k), members);
      }
      ctx.report("buckets", std::vector<float>{static_cast<float>(zero.num_buckets())});
    }
    zero.step();
  }
  ctx.report("losses", losses);
  ctx.report("params", flat_values(net->parameters()));
}

// The whole first-step gradient in parameter order, from stage 2's bucket shards.
std::vector<float> gradient_from_buckets(const std::vector<RankResult>& results,
                                         const std::vector<int64_t>& param_numels) {
  std::vector<std::vector<float>> per_param(param_numels.size());
  const auto buckets = static_cast<size_t>(results[0].floats("buckets")[0]);
  for (size_t k = 0; k < buckets; ++k) {
    std::vector<int64_t> numels;
    const auto members = results[0].floats(fmt::format("members.{}", k));
    for (float m : members) numels.push_back(param_numels[static_cast<size_t>(m)]);
    const ShardLayout layout = make_shard_layout(numels, static_cast<int>(results.size()));
    const auto flat = unshard_reports(results, fmt::format("grad.{}", k), layout.numel);
    for (size_t j = 0; j < members.size(); ++j) {
      const auto begin = flat.begin() + layout.offsets[j];
      per_param[static_cast<size_t>(members[j])].assign(begin, begin + layout.numels[j]);
    }
  }
  std::vector<float> out;
  for (const auto& p : per_param) out.insert(out.end(), p.begin(), p.end());
  return out;
}

std::vector<int64_t> uneven_mlp_numels() {
  std::vector<int64_t> out;
  for (const Tensor& p : make_uneven_mlp(0)->parameters()) out.push_back(p.numel());
  return out;
}

}  // namespace

TEST_CASE("ZeroRedundancyOptimizer: stages 1 and 2 equal the single-process whole-batch steps") {
  const double max_norm = 0.5;  // below the gradient's norm: every step is clipped
  for (bool use_adamw : {false, true}) {
    const MakeOptimizer make = use_adamw ? adamw() : sgd_momentum();
    const Reference ref = reference_run(77, kSteps, make, max_norm);
    for (int stage : {1, 2}) {
      for (int world : {2, 4}) {
        for (double cap : {25.0, kTinyBuckets}) {
          DYNAMIC_SECTION((use_adamw ? "AdamW" : "SGD momentum")
                          << ", stage " << stage << ", " << world << " ranks, "
                          << (cap < 1 ? "a bucket per tensor" : "one bucket")) {
            Setup setup;
            setup.stage = stage;
            setup.bucket_cap_mb = cap;
            setup.max_norm = max_norm;
            setup.with_ddp = stage == 1;
            auto results =
                run_ranks(world, [&](RankContext& ctx) { train_zero(ctx, setup, make); });
            INFO(describe(results));
            for (const RankResult& r : results) REQUIRE(r.ok());
            require_close(mean_losses(results), ref.losses);
            if (stage == 1) {
              for (const RankResult& r : results) require_close(r.floats("grads"), ref.first_grads);
            } else {
              require_close(gradient_from_buckets(results, uneven_mlp_numels()), ref.first_grads);
            }
            for (const RankResult& r : results) {
              require_close(r.floats("params"), ref.params);
              // Every rank gathered the same update into its parameters, bit for bit.
              REQUIRE(r.floats("params") == results[0].floats("params"));
            }
            CHECK(results[0].floats("buckets")[0] == (cap < 1 ? 8 : 1));
          }
        }
      }
    }
  }
}

TEST_CASE(
    "ZeroRedundancyOptimizer: the comparison fails without DDP's all-reduce or with a double "
    "average") {
  const Reference ref = reference_run(77, kSteps, sgd_momentum());
  for (bool no_ddp : {true, false}) {
    DYNAMIC_SECTION((no_ddp ? "stage 1 without DDP" : "stage 2 averaged twice")) {
      Setup setup;
      setup.stage = no_ddp ? 1 : 2;
      setup.with_ddp = false;  // stage 1 then steps each rank's shard with local gradients
      setup.averaged_twice = !no_ddp;
      auto results =
          run_ranks(2, [&](RankContext& ctx) { train_zero(ctx, setup, sgd_momentum()); });
      INFO(describe(results));
      for (const RankResult& r : results) REQUIRE(r.ok());
      CHECK_FALSE(all_close(results[0].floats("params"), ref.params));
    }
  }
}

namespace {

void zero_step(ZeroRedundancyOptimizer& zero, nn::Module& net, int step, const RankContext& ctx) {
  const ShardBatch b = local_slice(step, ctx.rank, ctx.world_size);
  zero.zero_grad();
  cross_entropy(net.forward(b.x), b.y).backward();
  zero.step();
}

}  // namespace

TEST_CASE("ZeroRedundancyOptimizer: full and sharded checkpoints resume bit for bit, and the full "
          "one loads into the plain optimizer") {
  mg::testing::TempDir dir;
  const std::string full_path = dir / "full.safetensors";
  auto shard_path = [&dir](int rank) { return dir / fmt::format("shard{}.safetensors", rank); };
  ZeroOptions options;
  options.stage = 2;
  options.bucket_cap_mb = kTinyBuckets;

  auto first = run_ranks(2, [&](RankContext& ctx) {
    auto pg = ctx.gloo();
    auto net = make_uneven_mlp(31);
    ZeroRedundancyOptimizer zero(net->parameters(), pg, sgd_momentum(), options);
    zero_step(zero, *net, 0, ctx);
    zero_step(zero, *net, 1, ctx);
    const nn::TensorDict optim = zero.full_state_dict();
    if (ctx.rank == 0) {
      nn::Checkpoint ck;
      ck.put("model.", nn::state_dict(*net));  // every rank holds all the parameters
      ck.put("optim.", optim);
      nn::save_tensors(ck, full_path);
    }
    nn::Checkpoint shard;
    shard.put("model.", nn::state_dict(*net));
    shard.put("optim.", zero.state_dict());  // this rank's shards of the state
    nn::save_tensors(shard, shard_path(ctx.rank));
    zero_step(zero, *net, 2, ctx);
    zero_step(zero, *net, 3, ctx);
    ctx.report("params", flat_values(net->parameters()));
  });
  INFO(describe(first));
  for (const RankResult& r : first) REQUIRE(r.ok());

  for (bool sharded : {false, true}) {
    DYNAMIC_SECTION((sharded ? "sharded checkpoint" : "full checkpoint")) {
      auto resumed = run_ranks(2, [&](RankContext& ctx) {
        auto pg = ctx.gloo();
        auto net = make_uneven_mlp(999);
        const std::string path = sharded ? shard_path(ctx.rank) : full_path;
        const nn::Checkpoint ck = nn::load_tensors(path);
        nn::load_state_dict(*net, ck.get("model."), path);
        ZeroRedundancyOptimizer zero(net->parameters(), pg, sgd_momentum(), options);
        if (sharded) {
          zero.load_state_dict(ck.get("optim."), path);
        } else {
          zero.load_full_state_dict(ck.get("optim."), path);
        }
        zero_step(zero, *net, 2, ctx);
        zero_step(zero, *net, 3, ctx);
        ctx.report("params", flat_values(net->parameters()));
      });
      INFO(describe(resumed));
      for (const RankResult& r : resumed) REQUIRE(r.ok());
      REQUIRE(resumed[0].floats("params") == first[0].floats("params"));
      REQUIRE(resumed[1].floats("params") == first[0].floats("params"));
    }
  }

  // The full checkpoint in a plain SGD over the plain module, one process, whole batches.
  auto plain = make_uneven_mlp(999);
  auto sgd = sgd_momentum()(plain->parameters());
  const nn::Checkpoint ck = nn::load_tensors(full_path);
  nn::load_state_dict(*plain, ck.get("model."), full_path);
  sgd->load_state_dict(ck.get("optim."), full_path);
  for (int step : {2, 3}) {
    const ShardBatch b = make_shard_batch(static_cast<uint64_t>(50 + step));
    sgd->zero_grad();
    cross_entropy(plain->forward(b.x), b.y).backward();
    sgd->step();
  }
  require_close(flat_values(plain->parameters()), first[0].floats("params"));
}

TEST_CASE(
    "ZeroRedundancyOptimizer: a rank that dies makes the step's all-gather fail on the others") {
  auto results = run_ranks(2, [](RankContext& ctx) {
    auto pg = ctx.gloo(5s);
    auto net = make_uneven_mlp(3);
    auto ddp = std::make_shared<DistributedDataParallel>(net, pg);
    ZeroRedundancyOptimizer zero(net->parameters(), pg, sgd_momentum());
    zero_step(zero, *ddp, 0, ctx);  // a good step
    const ShardBatch b = local_slice(1, ctx.rank, ctx.world_size);
    zero.zero_grad();
    cross_entropy(ddp->forward(b.x), b.y).backward();  // the all-reduce: both ranks there
    if (ctx.rank == 1) ::raise(SIGKILL);
    const auto start = std::chrono::steady_clock::now();
    try {
      zero.step();
      ctx.report("step", std::string("returned"));
    } catch (const Error& e) {
      ctx.report("step", std::string(e.what()));
    }
    const double seconds =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    ctx.report("seconds", std::vector<float>{static_cast<float>(seconds)});
  });
  INFO(describe(results));
  REQUIRE(results[1].signal == SIGKILL);
  REQUIRE(results[0].ok());
  REQUIRE_THAT(results[0].text("step"), MG_CONTAINS("all_gather"));
  REQUIRE_THAT(results[0].text("step"), MG_CONTAINS("failed on rank 0 of 2"));
  CHECK(results[0].floats("seconds")[0] < 10.0f);
}

TEST_CASE("ZeroRedundancyOptimizer: errors name what is wrong") {
  auto pg = single_process_group();
  auto net = make_uneven_mlp(1);
  ZeroOptions options;
  options.stage = 3;
  REQUIRE_THROWS_WITH(
      ZeroRedundancyOptimizer(net->parameters(), pg, sgd_momentum(), options),
      MG_CONTAINS("stage must be 1 or 2, got 3 (stage 3 is FullyShardedDataParallel)"));
  auto other = make_uneven_mlp(2);
  REQUIRE_THROWS_WITH(
      ZeroRedundancyOptimizer(
          net->parameters(), pg,
          [&](std::vector<Tensor>) { return sgd_momentum()(other->parameters()); }),
      MG_CONTAINS("must build the optimizer over the 1 shard tensors it is given (it has 8"));
  std::vector<Tensor> twice{net->parameters()[0], net->parameters()[0]};
  REQUIRE_THROWS_WITH(ZeroRedundancyOptimizer(twice, pg, sgd_momentum()),
                      MG_CONTAINS("parameter 1 appears twice"));

  // Stage 2: a parameter without a gradient keeps its bucket from reducing; step names it.
  options.stage = 2;
  options.bucket_cap_mb = kTinyBuckets;
  auto unused = make_uneven_mlp(3);
  std::vector<Tensor> params = unused->parameters();
  Tensor extra = zeros(Shape{4});
  extra.set_requires_grad(true);
  params.push_back(extra);
  ZeroRedundancyOptimizer zero(params, pg, sgd_momentum(), options);
  const ShardBatch b = make_shard_batch(4);
  cross_entropy(unused->forward(b.x), b.y).backward();
  REQUIRE_THROWS_WITH(zero.step(), MG_CONTAINS("parameter(s) 'parameter 8' received no gradient"));
}

#endif  // MINIGRAD_WITH_GLOO
