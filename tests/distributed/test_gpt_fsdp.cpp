// A GPT sharded with FSDP, fully_shard on each block then on the GPT (models/gpt_plan.h's
// fully_shard_gpt), with and without activation checkpointing, and under ZeRO-1 (with DDP)
// and ZeRO-2, on 2 and 3 Gloo ranks with an uneven split of the batch: the loss, every
// gradient (put back together from the shards) and the parameters after 3 AdamW steps equal
// the single-process GPT on the whole batch, with the root's unit and at most two blocks
// gathered at once; a missing reduction, or averaging the ranks' means where their rows
// must be summed, fails the comparison; with dropout, recomputed blocks under FSDP take the
// same steps as stored ones; misuse of fully_shard on the GPT is named.
#ifdef MINIGRAD_WITH_GLOO

#include "sharding_helpers.h"

#include <minigrad/autograd/grad_mode.h>
#include <minigrad/core/fault_injection.h>
#include <minigrad/models/gpt.h>
#include <minigrad/models/gpt_checkpointing.h>
#include <minigrad/models/gpt_plan.h>
#include <minigrad/nn/checkpoint.h>
#include <minigrad/parallel/ddp/distributed_data_parallel.h>
#include <minigrad/parallel/sharded/fully_shard.h>
#include <minigrad/parallel/sharded/zero_redundancy_optimizer.h>

using namespace mg;
using namespace mg::parallel;
using namespace mg::test;
using models::GPT;
using models::GPTConfig;

namespace {

constexpr int kSteps = 3;
constexpr int64_t kRows = 5;  // 3 + 2 on two ranks, 2 + 2 + 1 on three
constexpr int64_t kT = 7;
constexpr float kTol = 5e-5f;

GPTConfig config() {
  GPTConfig c;
  c.block_size = 8;
  c.vocab_size = 19;
  c.n_layer = 3;
  c.n_head = 2;
  c.n_embd = 12;
  c.dropout = 0.0;
  return c;
}

std::shared_ptr<GPT> make_gpt(uint64_t seed, double dropout = 0.0) {
  manual_seed(seed);
  GPTConfig c = config();
  c.dropout = dropout;
  return std::make_shared<GPT>(c);
}

MakeOptimizer gpt_adamw() {
  return [](std::vector<Tensor> params) {
    return std::make_unique<optim::AdamW>(std::move(params),
                                          optim::AdamWOptions().lr(0.01).weight_decay(0.1));
  };
}

struct Batch {
  Tensor idx, targets;
};

Batch whole_batch(int step) {
  manual_seed(static_cast<uint64_t>(300 + step));
  return {randint(0, 19, Shape{kRows, kT}), randint(0, 19, Shape{kRows, kT})};
}

// This rank's rows (the first kRows % world ranks take one more), and its loss weight:
// the loss is a mean over the rank's rows and the gradients are averaged over the ranks,
// so the mean of the whole batch needs rows_r * world / rows.
struct Local {
  Batch batch;
  double weight;
};

Local local_batch(int step, int rank, int world) {
  const Batch all = whole_batch(step);
  const int64_t base = kRows / world, extra = kRows % world;
  const int64_t rows = base + (rank < extra ? 1 : 0);
  const int64_t begin = rank * base + std::min<int64_t>(rank, extra);
  return {{all.idx.narrow(0, begin, rows), all.targets.narrow(0, begin, rows)},
          static_cast<double>(rows * world) / static_cast<double>(kRows)};
}

std::vector<int64_t> param_numels() {
  std::vector<int64_t> out;
  for (const Tensor& p : make_gpt(0)->parameters()) out.push_back(p.numel());
  return out;
}

Reference gpt_reference() {
  auto gpt = make_gpt(11);
  auto opt = gpt_adamw()(gpt->parameters());
  Reference ref;
  for (int step = 0; step < kSteps; ++step) {
    const Batch b = whole_batch(step);
    opt->zero_grad();
    const Tensor loss = GPT::loss(gpt->forward(b.idx), b.targets);
    loss.backward();
    ref.losses.push_back(loss.item<float>());
    if (step == 0) ref.first_grads = flat_values(gpt->parameters(), true);
    opt->step();
  }
  ref.params = flat_values(gpt->parameters());
  return ref;
}

// How a rank trains: right, or one of the wrong variants the comparison must catch.
enum class Variant { Right, NoCommunication, MeansAveraged };

struct Setup {
  Variant variant = Variant::Right;
  bool checkpointing = false;
  int zero_stage = 0;  // 0: FSDP; 1: ZeRO-1 with DDP; 2: ZeRO-2
  double dropout = 0.0;
};

Tensor rank_loss(const Tensor& logits, const Local& local, Variant variant) {
  Tensor loss = GPT::loss(logits, local.batch.targets);
  return variant == Variant::MeansAveraged ? loss : loss * local.weight;
}

void train_fsdp(RankContext& ctx, const Setup& setup) {
  auto pg = setup.variant == Variant::NoCommunication ? single_process_group() : ctx.gloo();
  auto gpt = make_gpt(11 + static_cast<uint64_t>(ctx.rank), setup.dropout);  // rank 0's win
  if (setup.checkpointing) models::set_block_checkpointing(*gpt);
  auto fsdp = models::fully_shard_gpt(gpt, pg);
  manual_seed(1000 + static_cast<uint64_t>(ctx.rank));  // each rank's dropout masks
  // The root's unit (wte, which is the head's weight too, wpe, ln_f), then a unit per block.
  MG_CHECK(fsdp->num_units() == 4, "expected 4 units, got {}", fsdp->num_units());
  MG_CHECK(fsdp->unit_module(0).empty() && fsdp->unit_module(1) == "transformer.h.0",
           "units of '{}' and '{}'", fsdp->unit_module(0), fsdp->unit_module(1));
  auto opt = gpt_adamw()(fsdp->parameters());
  std::vector<float> losses;
  const size_t recomputed = nn::checkpoint_recomputations();
  const size_t root_bytes = fsdp->unit(0).full().nbytes();
  size_t block_bytes = 0;
  for (size_t u = 1; u < fsdp->num_units(); ++u) block_bytes = std::max(block_bytes, fsdp->unit(u).full().nbytes());
  for (int step = 0; step < kSteps; ++step) {
    const Local local = local_batch(step, ctx.rank, ctx.world_size);
    opt->zero_grad();
    fsdp->reset_peak_stats();
    const Tensor loss = rank_loss((*gpt)(local.batch.idx), local, setup.variant);
    losses.push_back(loss.item<float>());
    loss.backward();
    // At rest again: only the shards (every unit freed after its reduce-scatter).
    MG_CHECK(fsdp->stats().gathered_bytes == 0, "{} bytes still gathered after backward",
             fsdp->stats().gathered_bytes);
    // The root's unit once (kept from its forward to the end of backward), each block once in
    // forward and once in backward but the last (kept from its forward to its backward).
    MG_CHECK(fsdp->stats().all_gathers == static_cast<size_t>(2 * config().n_layer),
             "{} all-gathers in a step of {} blocks", fsdp->stats().all_gathers, config().n_layer);
    // The root's unit and at most two blocks at once: the one computing and the one prefetched.
    MG_CHECK(fsdp->stats().peak_gathered_bytes <= root_bytes + 2 * block_bytes,
             "{} bytes gathered at once, more than the root's {} and two blocks of {}",
             fsdp->stats().peak_gathered_bytes, root_bytes, block_bytes);
    if (step == 0)
      for (size_t u = 0; u < fsdp->num_units(); ++u) {
        ctx.report(fmt::format("grad.{}", u), fsdp->unit(u).shard().grad());
        std::vector<float> indices;
        for (size_t i : fsdp->unit(u).indices()) indices.push_back(static_cast<float>(i));
        ctx.report(fmt::format("indices.{}", u), indices);
      }
    opt->step();
  }
  ctx.report("recomputed",
             std::vector<float>{static_cast<float>(nn::checkpoint_recomputations() - recomputed)});
  ctx.report("losses", losses);
  const nn::TensorDict full = fsdp->full_state_dict();
  if (pg->rank() == 0) {
    std::vector<float> params;
    for (const auto& [name, p] : gpt->named_parameters()) {
      const auto v = full.at(name).to_vector<float>();
      params.insert(params.end(), v.begin(), v.end());
    }
    ctx.report("params", params);
  }
}

void train_zero(RankContext& ctx, const Setup& setup) {
  auto pg = setup.variant == Variant::NoCommunication ? single_process_group() : ctx.gloo();
  auto gpt = make_gpt(11 + static_cast<uint64_t>(ctx.rank));
  std::shared_ptr<DistributedDataParallel> ddp;
  if (setup.zero_stage == 1) ddp = std::make_shared<DistributedDataParallel>(gpt, pg);
  if (setup.checkpointing) models::set_block_checkpointing(*gpt);
  ZeroOptions options;
  options.stage = setup.zero_stage;
  options.bucket_cap_mb = 2048.0 / (1 << 20);  // 2 KiB: several buckets
  if (setup.zero_stage == 2) {  // no DDP to start every rank from rank 0's weights
    NoGradGuard no_grad;
    for (const Tensor& p : gpt->parameters()) pg->broadcast(p, 0)->wait();
  }
  ZeroRedundancyOptimizer zero(gpt->parameters(), pg, gpt_adamw(), options);
  std::vector<float> losses;
  for (int step = 0; step < kSteps; ++step) {
    const Local local = local_batch(step, ctx.rank, ctx.world_size);
    zero.zero_grad();
    const Tensor logits = ddp ? ddp->forward(local.batch.idx) : gpt->forward(local.batch.idx);
    const Tensor loss = rank_loss(logits, local, setup.variant);
    losses.push_back(loss.item<float>());
    loss.backward();
    if (step == 0) {
      if (setup.zero_stage == 1) ctx.report("grads", flat_values(gpt->parameters(), true));
      for (size_t k = 0; k < zero.num_buckets() && setup.zero_stage == 2; ++k) {
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
  ctx.report("params", flat_values(gpt->parameters()));
}

// ZeRO-2's first-step gradient in parameter order, from its bucket shards.
std::vector<float> gradient_from_buckets(const std::vector<RankResult>& results) {
  const std::vector<int64_t> numels = param_numels();
  std::vector<std::vector<float>> per_param(numels.size());
  const auto buckets = static_cast<size_t>(results[0].floats("buckets")[0]);
  for (size_t k = 0; k < buckets; ++k) {
    std::vector<int64_t> bucket_numels;
    const auto members = results[0].floats(fmt::format("members.{}", k));
    for (float m : members) bucket_numels.push_back(numels[static_cast<size_t>(m)]);
    const ShardLayout layout = make_shard_layout(bucket_numels, static_cast<int>(results.size()));
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

// FSDP's first-step gradient in the GPT's parameter order, from its units' shards: each
// unit's parameters are the GPT's named by its indices.
std::vector<float> gradient_from_units(const std::vector<RankResult>& results) {
  const std::vector<int64_t> numels = param_numels();
  std::vector<std::vector<float>> per_param(numels.size());
  for (size_t u = 0; u < 4; ++u) {
    std::vector<int64_t> unit_numels;
    const auto indices = results[0].floats(fmt::format("indices.{}", u));
    for (float i : indices) unit_numels.push_back(numels[static_cast<size_t>(i)]);
    const ShardLayout layout = make_shard_layout(unit_numels, static_cast<int>(results.size()));
    const auto flat = unshard_reports(results, fmt::format("grad.{}", u), layout.numel);
    for (size_t j = 0; j < indices.size(); ++j) {
      const auto begin = flat.begin() + layout.offsets[j];
      per_param[static_cast<size_t>(indices[j])].assign(begin, begin + layout.numels[j]);
    }
  }
  std::vector<float> out;
  for (const auto& p : per_param) out.insert(out.end(), p.begin(), p.end());
  return out;
}

std::vector<RankResult> run(int world, const Setup& setup) {
  auto results = run_ranks(world, [&](RankContext& ctx) {
    if (setup.zero_stage == 0) train_fsdp(ctx, setup);
    else train_zero(ctx, setup);
  });
  INFO(describe(results));
  for (const RankResult& r : results) REQUIRE(r.ok());
  return results;
}

void require_same_steps(const std::vector<RankResult>& results, const Setup& setup,
                        const Reference& ref) {
  // The weighted losses' mean is the whole batch's loss.
  require_close(mean_losses(results), ref.losses, kTol);
  if (setup.zero_stage == 0) require_close(gradient_from_units(results), ref.first_grads, kTol);
  if (setup.zero_stage == 1) require_close(results[0].floats("grads"), ref.first_grads, kTol);
  if (setup.zero_stage == 2) require_close(gradient_from_buckets(results), ref.first_grads, kTol);
  for (const RankResult& r : results)
    if (setup.zero_stage != 0 || r.rank == 0) require_close(r.floats("params"), ref.params, kTol);
}

}  // namespace

TEST_CASE("GPT FSDP: a block per unit, the tied head, steps equal the whole-batch GPT's") {
  const Reference ref = gpt_reference();
  for (int world : {2, 3}) {
    for (bool checkpointing : {false, true}) {
      DYNAMIC_SECTION(world << " ranks" << (checkpointing ? ", blocks recomputed" : "")) {
        Setup setup;
        setup.checkpointing = checkpointing;
        const auto results = run(world, setup);
        require_same_steps(results, setup, ref);
        CHECK(results[0].floats("recomputed")[0] == (checkpointing ? 3.0f * kSteps : 0.0f));
      }
    }
  }
}

TEST_CASE("GPT ZeRO-1 (with DDP) and ZeRO-2: steps equal the whole-batch GPT's") {
  const Reference ref = gpt_reference();
  for (int stage : {1, 2}) {
    for (int world : {2, 3}) {
      DYNAMIC_SECTION("stage " << stage << ", " << world << " ranks") {
        Setup setup;
        setup.zero_stage = stage;
        setup.checkpointing = stage == 2 && world == 3;  // ZeRO-2's hooks under a recompute
        require_same_steps(run(world, setup), setup, ref);
      }
    }
  }
}

TEST_CASE("GPT FSDP and ZeRO: a missing reduction or averaged means fail the comparison") {
  const Reference ref = gpt_reference();
  for (int stage : {0, 2}) {
    for (Variant variant : {Variant::NoCommunication, Variant::MeansAveraged}) {
      DYNAMIC_SECTION((stage == 0 ? "FSDP, " : "ZeRO-2, ")
                      << (variant == Variant::NoCommunication ? "no communication"
                                                              : "means averaged")) {
        Setup setup;
        setup.zero_stage = stage;
        setup.variant = variant;
        const auto results = run(2, setup);
        CHECK_FALSE(all_close(results[0].floats("params"), ref.params, kTol));
      }
    }
  }
}

TEST_CASE("GPT FSDP: with dropout, recomputed blocks take the same steps as stored ones") {
  // Each rank draws its own masks, so no single-process run compares; but the recompute
  // must draw the very masks of the forward, under FSDP's gathering as without it.
  Setup stored;
  stored.dropout = 0.2;
  Setup recomputed = stored;
  recomputed.checkpointing = true;
  const auto a = run(3, stored);
  const auto b = run(3, recomputed);
  REQUIRE(b[0].floats("recomputed")[0] == 3.0f * kSteps);
  CHECK(a[0].floats("losses") == b[0].floats("losses"));
  CHECK(a[0].floats("params") == b[0].floats("params"));
  for (size_t u = 0; u < 4; ++u)
    for (size_t r = 0; r < 3; ++r)
      CHECK(a[r].floats(fmt::format("grad.{}", u)) == b[r].floats(fmt::format("grad.{}", u)));
  // A recompute with fresh masks (the test-only fault; the forked ranks inherit it) differs.
  mg::testing::FaultGuard fault(mg::testing::Fault::CheckpointFreshDropout);
  const auto c = run(3, recomputed);
  CHECK(c[0].floats("losses")[0] == a[0].floats("losses")[0]);  // the first forward is untouched
  CHECK(c[0].floats("params") != a[0].floats("params"));
}

TEST_CASE("GPT FSDP: fully_shard's misuse on the GPT is named") {
  auto pg = single_process_group();
  auto gpt = make_gpt(1);
  const nn::ModulePtr wte = gpt->child("transformer")->child("wte");
  SECTION("the tied embedding sharded on its own: the head holds it too") {
    parallel::fully_shard(wte, pg);
    REQUIRE_THROWS_WITH(models::fully_shard_gpt(gpt, pg),
                        MG_CONTAINS("parameter 'lm_head.weight' is in the unit of 'transformer.wte' (sharded "
                                    "earlier), but 'lm_head' holds it too, outside that module; a parameter two "
                                    "modules hold belongs to the unit of their nearest common ancestor"));
  }
  SECTION("the GPT before its blocks") {
    parallel::fully_shard(gpt, pg);
    REQUIRE_THROWS_WITH(parallel::fully_shard(gpt->child("transformer")->child("h")->children()[0], pg),
                        MG_CONTAINS("fully_shard(Block): parameter 'ln_1.weight' is in the unit of a GPT sharded "
                                    "earlier; shard children before their parent"));
  }
  SECTION("sharded twice") {
    models::fully_shard_gpt(gpt, pg);
    REQUIRE_THROWS_WITH(models::fully_shard_gpt(gpt, pg),
                        MG_CONTAINS("fully_shard(Block): this module is sharded already"));
  }
  SECTION("forward() instead of calling the GPT: the root's unit is not gathered") {
    models::fully_shard_gpt(gpt, pg);
    REQUIRE_THROWS_WITH(gpt->forward(whole_batch(0).idx), MG_CONTAINS("call the module through operator()"));
  }
}

#endif  // MINIGRAD_WITH_GLOO
