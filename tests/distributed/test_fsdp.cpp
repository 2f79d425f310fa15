// FSDP (ZeRO-3) on CPU with Gloo, through FullyShardedDataParallel (a unit per Linear, made
// by fully_shard): its steps equal the single-process steps on the whole batch and DDP's,
// for shards that split tensors and shards of padding alone; wrong variants fail that
// comparison; its checkpoints round-trip; its errors, and fully_shard's for misuse.
#ifdef MINIGRAD_WITH_GLOO

#include <signal.h>

#include "sharding_helpers.h"
#include "temp_dir.h"

#include <minigrad/autograd/grad_mode.h>
#include <minigrad/nn/serialize.h>
#include <minigrad/parallel/c10d/gloo/process_group_gloo.h>
#include <minigrad/parallel/ddp/distributed_data_parallel.h>
#include <minigrad/parallel/partial_gradients.h>
#include <minigrad/parallel/placement.h>
#include <minigrad/parallel/sharded/fully_shard.h>
#include <minigrad/parallel/sharded/fully_sharded_data_parallel.h>
#include <minigrad/parallel/clip_grad.h>
#include <minigrad/parallel/sharded/sharded_state.h>

using namespace mg;
using namespace mg::parallel;
using namespace mg::test;
using namespace std::chrono_literals;

namespace {

const optim::SGDOptions kSgd = optim::SGDOptions(0.1).momentum(0.9);
constexpr int kSteps = 3;

std::shared_ptr<FullyShardedDataParallel> wrap(nn::ModulePtr module, std::shared_ptr<ProcessGroup> pg) {
  return std::make_shared<FullyShardedDataParallel>(std::move(module), std::move(pg));
}

std::vector<const FlatParameter*> units_of(const FullyShardedDataParallel& fsdp) {
  std::vector<const FlatParameter*> out;
  for (size_t u = 0; u < fsdp.num_units(); ++u) out.push_back(&fsdp.unit(u));
  return out;
}

// The full parameters in the wrapped module's order, from full_state_dict (rank 0).
std::vector<float> full_params(FullyShardedDataParallel& fsdp) {
  const nn::TensorDict full = fsdp.full_state_dict();
  std::vector<float> out;
  if (fsdp.process_group()->rank() != 0) return out;
  for (const auto& [name, p] : fsdp.module()->named_parameters()) {
    const auto v = full.at(name).to_vector<float>();
    out.insert(out.end(), v.begin(), v.end());
  }
  return out;
}

// How a rank trains: FSDP as it is, or one of the wrong variants the comparison must catch.
enum class Variant { Fsdp, NoCommunication, AveragedTwice };

void train_fsdp(RankContext& ctx, Variant variant, const MakeOptimizer& make,
                double max_norm = 0.0) {
  // No communication: a group of this rank alone, so nothing is reduced or gathered.
  auto pg = variant == Variant::NoCommunication ? single_process_group() : ctx.gloo();
  // Each rank starts from other weights: FSDP must start them all from rank 0's.
  auto net = make_uneven_mlp(77 + static_cast<uint64_t>(ctx.rank));
  auto fsdp = wrap(net, pg);
  auto opt = make(fsdp->parameters());  // over the shards
  std::vector<float> losses;
  for (int step = 0; step < kSteps; ++step) {
    const ShardBatch b = local_slice(step, ctx.rank, ctx.world_size);
    opt->zero_grad();
    Tensor loss = cross_entropy(fsdp->forward(b.x), b.y);
    losses.push_back(loss.item<float>());
    if (variant == Variant::AveragedTwice) loss = loss * (1.0 / ctx.world_size);
    loss.backward();
    if (max_norm > 0.0) fsdp->clip_grad_norm_(max_norm);
    if (step == 0)
      for (size_t u = 0; u < fsdp->num_units(); ++u)
        ctx.report(fmt::format("grad.{}", u), fsdp->unit(u).shard().grad());
    opt->step();
  }
  ctx.report("losses", losses);
  const auto params = full_params(*fsdp);
  if (pg->rank() == 0) ctx.report("params", params);
}

std::vector<float> ddp_params(RankContext& ctx, const MakeOptimizer& make) {
  auto net = make_uneven_mlp(77 + static_cast<uint64_t>(ctx.rank));
  DistributedDataParallel ddp(net, ctx.gloo());
  auto opt = make(net->parameters());
  for (int step = 0; step < kSteps; ++step) {
    const ShardBatch b = local_slice(step, ctx.rank, ctx.world_size);
    opt->zero_grad();
    cross_entropy(ddp.forward(b.x), b.y).backward();
    opt->step();
  }
  return flat_values(net->parameters());
}

// The numels of the uneven MLP's units (one per Linear).
const std::vector<int64_t> kUnitNumels{42, 16, 3, 6};

}  // namespace

TEST_CASE("FullyShardedDataParallel: steps equal the single-process whole-batch steps and DDP's") {
  for (bool use_adamw : {false, true}) {
    const MakeOptimizer make = use_adamw ? adamw() : sgd_momentum();
    for (double max_norm : {0.0, 0.5}) {
      const Reference ref = reference_run(77, kSteps, make, max_norm);
      for (int world : {2, 4}) {
        DYNAMIC_SECTION((use_adamw ? "AdamW, " : "SGD momentum, ")
                        << world << " ranks" << (max_norm > 0 ? ", clipped" : "")) {
          auto results = run_ranks(world, [&](RankContext& ctx) {
            train_fsdp(ctx, Variant::Fsdp, make, max_norm);
            if (max_norm == 0.0) ctx.report("ddp", ddp_params(ctx, make));
          });
          INFO(describe(results));
          for (const RankResult& r : results) REQUIRE(r.ok());
          // The loss of the whole batch is the mean of the ranks' losses on equal slices.
          require_close(mean_losses(results), ref.losses);
          // The shards of the averaged gradient, put back together, are the whole gradient.
          std::vector<float> grads;
          for (size_t u = 0; u < kUnitNumels.size(); ++u) {
            const auto unit = unshard_reports(results, fmt::format("grad.{}", u), kUnitNumels[u]);
            grads.insert(grads.end(), unit.begin(), unit.end());
          }
          require_close(grads, ref.first_grads);
          require_close(results[0].floats("params"), ref.params);
          if (max_norm == 0.0)
            for (const RankResult& r : results) require_close(r.floats("ddp"), ref.params);
          // On 4 ranks, rank 3's shard of unit 2 (3 elements) is padding alone.
          if (world == 4) REQUIRE(make_shard_layout({2, 1}, 4).real_numel(3) == 0);
        }
      }
    }
  }
}

TEST_CASE(
    "FullyShardedDataParallel: the comparison fails for a missing collective or a double average") {
  const Reference ref = reference_run(77, kSteps, sgd_momentum());
  for (Variant variant : {Variant::NoCommunication, Variant::AveragedTwice}) {
    DYNAMIC_SECTION((variant == Variant::NoCommunication ? "no communication" : "averaged twice")) {
      auto results = run_ranks(
          2, [variant](RankContext& ctx) { train_fsdp(ctx, variant, sgd_momentum()); });
      INFO(describe(results));
      for (const RankResult& r : results) REQUIRE(r.ok());
      CHECK_FALSE(all_close(results[0].floats("params"), ref.params));
    }
  }
}

namespace {

// One SGD step of the FSDP model on this rank's slice of step `step`'s batch.
void fsdp_step(FullyShardedDataParallel& fsdp, optim::SGD& sgd, int step, const RankContext& ctx) {
  const ShardBatch b = local_slice(step, ctx.rank, ctx.world_size);
  sgd.zero_grad();
  cross_entropy(fsdp.forward(b.x), b.y).backward();
  sgd.step();
}

}  // namespace

TEST_CASE("FullyShardedDataParallel: full and sharded checkpoints resume bit for bit, and the full "
          "one loads into the plain module") {
  mg::testing::TempDir dir;
  const std::string full_path = dir / "full.safetensors";
  auto shard_path = [&dir](int rank) { return dir / fmt::format("shard{}.safetensors", rank); };

  // Two steps, both checkpoints, two steps more.
  auto first = run_ranks(2, [&](RankContext& ctx) {
    auto pg = ctx.gloo();
    auto fsdp = wrap(make_uneven_mlp(31), pg);
    optim::SGD sgd(fsdp->parameters(), kSgd);
    fsdp_step(*fsdp, sgd, 0, ctx);
    fsdp_step(*fsdp, sgd, 1, ctx);
    const nn::TensorDict model = fsdp->full_state_dict();
    const nn::TensorDict optim =
        gather_full_optimizer_state(sgd.state_dict(), units_of(*fsdp), *pg);
    if (ctx.rank == 0) {
      MG_CHECK(model.count("2.weight") == 1, "full_state_dict: no 2.weight");  // the plain names
      nn::Checkpoint ck;
      ck.put("model.", model);
      ck.put("optim.", optim);
      nn::save_tensors(ck, full_path);
    }
    nn::Checkpoint shard;
    shard.put("model.", nn::state_dict(*fsdp));  // "flat_shard_<u>": this rank's shards
    shard.put("optim.", sgd.state_dict());
    nn::save_tensors(shard, shard_path(ctx.rank));
    fsdp_step(*fsdp, sgd, 2, ctx);
    fsdp_step(*fsdp, sgd, 3, ctx);
    const auto params = full_params(*fsdp);
    if (ctx.rank == 0) ctx.report("params", params);
  });
  INFO(describe(first));
  for (const RankResult& r : first) REQUIRE(r.ok());

  for (bool sharded : {false, true}) {
    DYNAMIC_SECTION((sharded ? "sharded checkpoint" : "full checkpoint")) {
      auto resumed = run_ranks(2, [&](RankContext& ctx) {
        auto pg = ctx.gloo();
        // Other initial weights: the checkpoint must replace every one of them.
        auto fsdp = wrap(make_uneven_mlp(999), pg);
        optim::SGD sgd(fsdp->parameters(), kSgd);
        if (sharded) {
          const std::string path = shard_path(ctx.rank);
          const nn::Checkpoint ck = nn::load_tensors(path);
          nn::load_state_dict(*fsdp, ck.get("model."), path);
          sgd.load_state_dict(ck.get("optim."), path);
        } else {
          const nn::Checkpoint ck = nn::load_tensors(full_path);
          fsdp->load_full_state_dict(ck.get("model."), full_path);
          sgd.load_state_dict(
              shard_full_optimizer_state(ck.get("optim."), units_of(*fsdp), full_path), full_path);
        }
        fsdp_step(*fsdp, sgd, 2, ctx);
        fsdp_step(*fsdp, sgd, 3, ctx);
        const auto params = full_params(*fsdp);
        if (ctx.rank == 0) ctx.report("params", params);
      });
      INFO(describe(resumed));
      for (const RankResult& r : resumed) REQUIRE(r.ok());
      REQUIRE(resumed[0].floats("params") == first[0].floats("params"));
    }
  }

  // The full checkpoint in a plain module and SGD, one process, whole batches.
  auto plain = make_uneven_mlp(999);
  optim::SGD sgd(plain->parameters(), kSgd);
  const nn::Checkpoint ck = nn::load_tensors(full_path);
  nn::load_state_dict(*plain, ck.get("model."), full_path);
  sgd.load_state_dict(ck.get("optim."), full_path);
  for (int step : {2, 3}) {
    const ShardBatch b = make_shard_batch(static_cast<uint64_t>(50 + step));
    sgd.zero_grad();
    cross_entropy(plain->forward(b.x), b.y).backward();
    sgd.step();
  }
  require_close(flat_values(plain->parameters()), first[0].floats("params"));
}

TEST_CASE(
    "FullyShardedDataParallel: a rank that dies makes the next all-gather fail on the others") {
  auto results = run_ranks(2, [](RankContext& ctx) {
    auto fsdp = wrap(make_uneven_mlp(3), ctx.gloo(5s));
    optim::SGD sgd(fsdp->parameters(), kSgd);
    fsdp_step(*fsdp, sgd, 0, ctx);  // a good step
    if (ctx.rank == 1) ::raise(SIGKILL);
    const ShardBatch b = local_slice(1, ctx.rank, ctx.world_size);
    const auto start = std::chrono::steady_clock::now();
    try {
      fsdp->forward(b.x);
      ctx.report("forward", std::string("returned"));
    } catch (const Error& e) {
      ctx.report("forward", std::string(e.what()));
    }
    const double seconds =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    ctx.report("seconds", std::vector<float>{static_cast<float>(seconds)});
    try {
      fsdp->forward(b.x);
      ctx.report("again", std::string("returned"));
    } catch (const Error& e) {
      ctx.report("again", std::string(e.what()));
    }
  });
  INFO(describe(results));
  REQUIRE(results[1].signal == SIGKILL);
  REQUIRE(results[0].ok());
  REQUIRE_THAT(results[0].text("forward"), MG_CONTAINS("all_gather"));
  REQUIRE_THAT(results[0].text("forward"), MG_CONTAINS("failed on rank 0 of 2"));
  CHECK(results[0].floats("seconds")[0] < 10.0f);  // bounded by the 5 s timeout
  REQUIRE_THAT(results[0].text("again"), MG_CONTAINS("gathering parameters failed earlier"));
}

TEST_CASE("FullyShardedDataParallel: errors name what is wrong") {
  auto pg = single_process_group();
  SECTION("the wrapped module's parameters are freed outside forward and backward") {
    auto net = make_uneven_mlp(1);
    auto fsdp = wrap(net, pg);
    REQUIRE(fsdp->num_units() == 4);
    REQUIRE(fsdp->named_parameters()[0].first == "flat_shard_0");
    REQUIRE_THROWS_WITH(net->parameter("0.weight").to_vector<float>(),
                        MG_CONTAINS("has been freed (Storage::resize_(0)). FSDP (fully_shard)"));
    REQUIRE_THROWS_WITH(fsdp->clone(), MG_CONTAINS("FullyShardedDataParallel cannot be copied"));
  }
  SECTION("a parameter that does not require grad") {
    auto net = make_uneven_mlp(1);
    net->parameter("2.bias").set_requires_grad(false);
    REQUIRE_THROWS_WITH(wrap(net, pg), MG_CONTAINS("fully_shard(Linear): parameter 'bias' does not require grad"));
  }
  SECTION("a parameter that gets no gradient is named at the next forward") {
    // One unit (not a Sequential): only the first Linear takes part.
    class FirstOnly : public nn::Cloneable<FirstOnly> {
     public:
      FirstOnly() : nn::Cloneable<FirstOnly>("FirstOnly") {
        a_ = register_module("a", std::make_shared<nn::Linear>(kShardIn, kShardClasses));
        b_ = register_module("b", std::make_shared<nn::Linear>(kShardIn, kShardClasses));
      }
      Tensor forward(const Tensor& x) override { return a_->forward(x); }

     private:
      nn::ModulePtr a_, b_;
    };
    auto fsdp = wrap(std::make_shared<FirstOnly>(), pg);
    REQUIRE(fsdp->num_units() == 1);
    const ShardBatch b = make_shard_batch(2);
    cross_entropy(fsdp->forward(b.x), b.y).backward();
    REQUIRE_THROWS_WITH(fsdp->forward(b.x),
                        MG_CONTAINS("parameter(s) 'b.weight', 'b.bias' received no gradient"));
  }
}

namespace {

// A root with a parameter of its own and two children; `tied`: b's weight is a's tensor.
class TwoLayers : public nn::Cloneable<TwoLayers> {
 public:
  explicit TwoLayers(bool tied) : nn::Cloneable<TwoLayers>("TwoLayers") {
    register_parameter("scale", ones(Shape{kShardIn}));
    register_module("a", std::make_shared<nn::Linear>(kShardIn, kShardIn));
    register_module("b", std::make_shared<nn::Linear>(kShardIn, kShardIn));
    if (tied) child("b")->set_parameter("weight", child("a")->parameter("weight"));
  }
  Tensor forward(const Tensor& x) override { return (*child("b"))((*child("a"))(mul(x, parameter("scale")))); }
};

}  // namespace

TEST_CASE("fully_shard: units per module in module order, their pieces, and misuse named") {
  auto pg = single_process_group();
  const ShardBatch batch = make_shard_batch(3);
  SECTION("children, then the root: a unit each, the root's own first") {
    auto model = std::make_shared<TwoLayers>(false);
    auto a = fully_shard(model->child("a"), pg);
    fully_shard(model->child("b"), pg);
    REQUIRE(a->is_root());
    auto root = fully_shard(model, pg);
    REQUIRE(root->is_root());
    REQUIRE_FALSE(a->is_root());
    REQUIRE(root->num_units() == 3);
    CHECK(root->unit_module(0).empty());
    CHECK(root->unit_module(1) == "a");
    CHECK(root->unit_module(2) == "b");
    CHECK(a->unit_module(0).empty());
    // Numbered among the root's parameters (scale, a.weight, a.bias, b.weight, b.bias).
    CHECK(root->unit(1).indices() == std::vector<size_t>{1, 2});
    CHECK(root->parameters().size() == 3);
    // The shard records what it holds of which single-device parameter (placement.h).
    const parallel::ParameterSpec* spec = parallel::spec_of(root->unit(1).shard());
    REQUIRE(spec != nullptr);
    REQUIRE(spec->pieces.size() == 2);
    CHECK(spec->pieces[0].name == "a.weight");
    CHECK(spec->pieces[1].name == "a.bias");
    REQUIRE(spec->pieces[1].flat.has_value());
    CHECK(spec->pieces[1].flat->local_offset == 25);
    CHECK(spec->pieces[1].flat->numel == 5);
    // FSDP2's contract: call the module, not forward(), or the root's own unit stays freed.
    REQUIRE_THROWS_WITH(model->forward(batch.x), MG_CONTAINS("call the module through operator()"));
    cross_entropy((*model)(batch.x), batch.y).backward();
    CHECK(root->stats().gathered_bytes == 0);
    CHECK(root->unit(0).shard().grad().defined());
  }
  SECTION("a tied parameter left unsharded lands in the nearest common ancestor's unit") {
    auto model = std::make_shared<TwoLayers>(true);
    auto root = fully_shard(model, pg);
    REQUIRE(root->num_units() == 1);
    CHECK(root->unit(0).params().size() == 4);  // scale, a.weight (b.weight too), a.bias, b.bias
    cross_entropy((*model)(batch.x), batch.y).backward();
    CHECK(root->unit(0).shard().grad().defined());
  }
  SECTION("sharded twice") {
    auto model = std::make_shared<TwoLayers>(false);
    fully_shard(model, pg);
    REQUIRE_THROWS_WITH(fully_shard(model, pg),
                        MG_CONTAINS("fully_shard(TwoLayers): this module is sharded already"));
  }
  SECTION("the parent before its children") {
    auto model = std::make_shared<TwoLayers>(false);
    fully_shard(model, pg);
    REQUIRE_THROWS_WITH(fully_shard(model->child("a"), pg),
                        MG_CONTAINS("fully_shard(Linear): parameter 'weight' is in the unit of a TwoLayers "
                                    "sharded earlier; shard children before their parent"));
  }
  SECTION("a tied parameter in the unit of one holder, the other outside it") {
    auto model = std::make_shared<TwoLayers>(true);
    fully_shard(model->child("a"), pg);
    REQUIRE_THROWS_WITH(fully_shard(model, pg),
                        MG_CONTAINS("parameter 'b.weight' is in the unit of 'a' (sharded earlier), but 'b' "
                                    "holds it too"));
  }
}

#endif  // MINIGRAD_WITH_GLOO
