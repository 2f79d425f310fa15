// parallel::clip_grad_norm_ (minigrad/parallel/clip_grad.h) across Gloo ranks, one form at a
// time and their products: every rank runs the single-device model on the whole batch and
// its split on its part, clips both, and reports the two norms and the worst error of its
// clipped pieces against their parts of the single device's clipped gradients. The parent
// checks the norm (the same bits on every rank), every piece, and that the naive norm (each
// rank's tensors summed as they are) is wrong where replicas exist. Tolerances:
// tests/parallel/placement_check.h, from the elements n and the widest sum K = 12.
#ifdef MINIGRAD_WITH_GLOO

#include <cmath>
#include <limits>

#include "catch_compat.h"
#include "multiprocess.h"
#include "parallel/dp_check.h"
#include "parallel/placement_check.h"

#include <minigrad/core/fault_injection.h>
#include <minigrad/core/ops.h>
#include <minigrad/minigrad.h>

using namespace mg;
using namespace mg::test;
using GroupPtr = std::shared_ptr<parallel::ProcessGroup>;

namespace {

constexpr int64_t kBatch = 12;  // rows: divides over 2, 3 and 4 data-parallel ranks
constexpr int64_t kTerms = 12;  // the widest sum in a gradient element (rows, widths)
constexpr double kMaxNorm = 1e-3;
const double kInf = std::numeric_limits<double>::infinity();

// One rank's split after its backward: what it clips (its gradient-holding tensors, named
// as the single device names them where no placement does), and the world it clips over.
struct Split {
  std::vector<nn::NamedTensor> tensors;
  GroupPtr world;
  std::function<Tensor(double norm_type)> clip;  // the form's own clip when it has one
  std::vector<std::shared_ptr<void>> keep;       // what must live while it clips
};

// `build` makes this rank's split of `plain` and runs its backward on x, y (the whole
// batch: a data-parallel form takes its rows). Every rank clips the single device and the
// split for each norm type, and reports.
using Build = std::function<Split(RankContext&, nn::Sequential& plain, const Tensor& x, const Tensor& y)>;
using MakePlain = std::function<std::shared_ptr<nn::Sequential>()>;

struct Batch {
  Tensor x, y;
};
using MakeBatch = std::function<Batch()>;

Batch mlp_batch() {
  manual_seed(71);
  return {randn({kBatch, 6}), randint(0, 4, {kBatch})};
}

std::shared_ptr<nn::Sequential> mlp() {
  manual_seed(70);
  return std::static_pointer_cast<nn::Sequential>(mg::testing::make_mlp({6, 12, 6, 4}));
}

// The rows of data-parallel rank r of n.
Batch rows_of(const Batch& b, int r, int n) {
  const int64_t per = b.x.size(0) / n;
  return {b.x.narrow(0, r * per, per), b.y.narrow(0, r * per, per)};
}

void run_case(RankContext& ctx, const MakePlain& make_plain, const MakeBatch& make_batch, const Build& build,
              const std::vector<double>& norm_types, const std::function<Tensor(const Tensor&, const Tensor&)>& loss) {
  for (double norm_type : norm_types) {
    const std::string at = fmt::format(" {}", norm_type);
    auto plain = make_plain();
    const Batch b = make_batch();
    Split split = build(ctx, *plain, b.x, b.y);
    loss(plain->forward(b.x), b.y).backward();
    // The naive norm: every rank's gradients as they are, summed over the world.
    std::vector<Tensor> grads;
    for (const auto& [name, t] : split.tensors)
      if (t.grad().defined()) grads.push_back(t.grad());
    const Tensor naive = nn::utils::get_total_norm(grads, norm_type, false, [&](Tensor& partial, nn::utils::NormReduction op) {
      if (op == nn::utils::NormReduction::Sum) return split.world->allreduce(partial)->wait();
      Tensor all = empty(Shape{split.world->size()}, DType::Float32);
      split.world->all_gather(all, partial.reshape(Shape{1}))->wait();
      partial = ops::abs_max(all);
    });
    ctx.report("want" + at, nn::utils::clip_grad_norm_(plain->parameters(), kMaxNorm, norm_type));
    std::vector<Tensor> tensors;
    for (const auto& [name, t] : split.tensors) tensors.push_back(t);
    ctx.report("total" + at, split.clip ? split.clip(norm_type)
                                        : parallel::clip_grad_norm_(tensors, split.world, kMaxNorm, norm_type));
    ctx.report("naive" + at, naive);
    const auto e = mg::testing::compare_pieces(split.tensors, mg::testing::by_name(*plain, true), true);
    ctx.report("grad error" + at, std::vector<float>{static_cast<float>(e.worst), static_cast<float>(e.compared)});
    ctx.report("where" + at, e.where);
    ctx.report("elements", std::vector<float>{static_cast<float>(mg::testing::elements_of(plain->named_parameters()))});
  }
}

struct Expect {
  bool replicas = true;      // some tensor is held by several ranks: the naive norm is larger
  bool wrong = false;        // a deliberately wrong placement: the norm must miss
};

// Runs `build` on `world_size` ranks and checks every rank's reports; returns them.
std::vector<RankResult> check_case(const std::string& what, int world_size, const Build& build, Expect expect = {},
                const std::vector<double>& norm_types = {2.0, kInf}, const MakePlain& make_plain = mlp,
                const MakeBatch& make_batch = mlp_batch,
                const std::function<Tensor(const Tensor&, const Tensor&)>& loss =
                    [](const Tensor& out, const Tensor& y) { return cross_entropy(out, y); }) {
  auto results = run_ranks(world_size, [&](RankContext& ctx) {
    run_case(ctx, make_plain, make_batch, build, norm_types, loss);
  });
  INFO(what << "\n" << describe(results));
  for (const RankResult& r : results) REQUIRE(r.ok());
  const auto tol = mg::testing::clip_tolerance(static_cast<int64_t>(results[0].floats("elements")[0]), kTerms);
  for (double norm_type : norm_types) {
    const std::string at = fmt::format(" {}", norm_type);
    double worst_norm = 0.0, worst_grad = 0.0;
    for (const RankResult& r : results) {
      INFO("rank " << r.rank << ", norm " << norm_type << ": " << r.text("where" + at));
      const double want = r.floats("want" + at)[0], total = r.floats("total" + at)[0];
      REQUIRE(want > kMaxNorm);  // so the clip scales
      CHECK(r.floats("total" + at)[0] == results[0].floats("total" + at)[0]);  // the same bits everywhere
      const double norm_error = std::fabs(total - want) / want;
      const double grad_error = r.floats("grad error" + at)[0];
      if (expect.wrong) {  // its pieces do not even fit the single device's tensors
        CHECK(norm_error > 100 * tol.norm);
        continue;
      }
      CHECK(r.floats("grad error" + at)[1] > 0);  // something compared
      CHECK(norm_error <= tol.norm);
      CHECK(grad_error <= tol.gradient);
      if (expect.replicas && !std::isinf(norm_type)) CHECK(r.floats("naive" + at)[0] > want * (1 + 100 * tol.norm));
      worst_norm = std::max(worst_norm, norm_error);
      worst_grad = std::max(worst_grad, grad_error);
    }
    if (!expect.wrong)
      fmt::print("clip {} (norm {}): norm error {:.2e} (tolerance {:.2e}), clipped gradient error {:.2e} "
                 "(tolerance {:.2e})\n", what, norm_type, worst_norm, tol.norm, worst_grad, tol.gradient);
  }
  return results;
}

// ---- the forms ----

Split tensor_parallel(RankContext& ctx, nn::Sequential& plain, const Tensor& x, const Tensor& y) {
  Split s;
  s.world = ctx.gloo();
  auto shard = parallel::parallelize_mlp(plain, parallel::tensor_parallel_group(s.world));
  cross_entropy(shard->forward(x), y).backward();
  s.tensors = shard->named_parameters();
  s.keep.push_back(shard);
  return s;
}

Split data_parallel(RankContext& ctx, nn::Sequential& plain, const Tensor& x, const Tensor& y) {
  Split s;
  s.world = ctx.gloo();
  auto model = std::static_pointer_cast<nn::Sequential>(plain.clone());
  auto ddp = std::make_shared<parallel::DistributedDataParallel>(model, s.world);
  const Batch mine = rows_of({x, y}, ctx.rank, ctx.world_size);
  cross_entropy(ddp->forward(mine.x), mine.y).backward();
  s.tensors = model->named_parameters();
  s.keep.push_back(ddp);
  return s;
}

}  // namespace

TEST_CASE("distributed clip: tensor parallelism over 2 and 3 Gloo ranks (parallelize_mlp), 2-, 1- and "
          "infinity norms") {
  check_case("tp 2", 2, tensor_parallel, {}, {2.0, 1.0, kInf});
  check_case("tp 3", 3, tensor_parallel, {}, {2.0, 1.0, kInf});
}

TEST_CASE("distributed clip: a vocabulary-parallel embedding's rows counted once each (the old module-type "
          "clip counted them as replicated)") {
  const MakePlain embedding_model = [] {
    manual_seed(72);
    return std::make_shared<nn::Sequential>(std::initializer_list<nn::ModulePtr>{
        std::make_shared<nn::Embedding>(12, 4), std::make_shared<nn::Linear>(4, 3)});
  };
  const MakeBatch tokens = [] {
    manual_seed(73);
    return Batch{randint(0, 12, {kBatch}), randint(0, 3, {kBatch})};
  };
  const Build vocab = [](RankContext& ctx, nn::Sequential& plain, const Tensor& x, const Tensor& y) {
    Split s;
    s.world = ctx.gloo();
    auto group = parallel::tensor_parallel_group(s.world);
    auto head = plain[1]->clone();  // whole on every rank, as a plan leaves it
    for (const Tensor& p : head->parameters())
      parallel::record_placement(p, "", p.shape(), parallel::tensor_parallel_placement(*group, parallel::Placement::replicate()));
    auto split = std::make_shared<nn::Sequential>(std::initializer_list<nn::ModulePtr>{
        std::make_shared<nn::VocabParallelEmbedding>(static_cast<const nn::Embedding&>(*plain[0]), group), head});
    parallel::name_placements(split->named_parameters());
    cross_entropy(split->forward(x), y).backward();
    s.tensors = split->named_parameters();
    s.keep.push_back(split);
    return s;
  };
  check_case("vocabulary-parallel embedding, tp 2", 2, vocab, {}, {2.0, kInf}, embedding_model, tokens);
}

TEST_CASE("distributed clip: tensor and sequence parallelism, the row bias's Partial gradients summed by "
          "reduce_partial_gradients, whole and inside FSDP's flat shards") {
  constexpr int64_t kB = 2, kT = 6;
  // A column/row pair without the ReLU between (a Linear and a ReLU run fused, on 2-D inputs only).
  const MakePlain block = [] {
    manual_seed(74);
    return std::make_shared<nn::Sequential>(std::initializer_list<nn::ModulePtr>{
        std::make_shared<nn::Linear>(4, 12), std::make_shared<nn::Linear>(12, 4)});
  };
  const MakeBatch sequences = [] {
    manual_seed(75);
    return Batch{randn({kB, kT, 4}), randint(0, 4, {kB * kT})};
  };
  // The loss of [B, T', 4] outputs over their B * T' targets, as a share of the whole
  // batch's mean: the ranks' shares add up to it.
  const auto loss = [](const Tensor& out, const Tensor& y) {
    const int64_t rows = out.size(0) * out.size(1);
    return mul(cross_entropy(reshape(out, {rows, 4}), y), static_cast<double>(rows) / (kB * kT));
  };
  const Build sequence_parallel = [loss](RankContext& ctx, nn::Sequential& plain, const Tensor& x, const Tensor& y) {
    Split s;
    s.world = ctx.gloo();
    auto shard = parallel::parallelize_mlp(plain, parallel::tensor_parallel_group(s.world));
    std::static_pointer_cast<nn::ColumnParallelLinear>((*shard)[0])->set_sequence_parallel(true);
    auto row = std::static_pointer_cast<nn::RowParallelLinear>((*shard)[1]);
    row->set_sequence_parallel(true);
    // This rank's positions: [B, T/n, 4] in, [B, T/n, 4] out, their targets.
    const int64_t part = kT / ctx.world_size;
    const Tensor mine = contiguous(x.narrow(1, ctx.rank * part, part));
    const Tensor targets = contiguous(reshape(y, {kB, kT}).narrow(1, ctx.rank * part, part)).reshape(Shape{kB * part});
    loss(shard->forward(mine), targets).backward();
    const Tensor own_share = ops::clone(row->bias().grad());
    ctx.report("all-reduces", std::vector<float>{static_cast<float>(parallel::reduce_partial_gradients(shard->parameters()))});
    ctx.report("bias share", own_share);
    ctx.report("bias sum", row->bias().grad());
    s.tensors = shard->named_parameters();
    s.keep.push_back(shard);
    return s;
  };
  for (int ranks : {2, 3}) {
    const auto results = check_case(fmt::format("tp {} + sequence parallel", ranks), ranks, sequence_parallel, {},
                                    {2.0, kInf}, block, sequences, loss);
    for (const RankResult& r : results) {
      CHECK(r.floats("all-reduces")[0] == 1.0f);  // one coalesced all-reduce: the only Partial gradient
      // Before the sum each rank held the share of its positions, far from the whole.
      const std::vector<float> share = r.floats("bias share"), sum = r.floats("bias sum");
      float apart = 0.0f;
      for (size_t i = 0; i < sum.size(); ++i) apart = std::max(apart, std::fabs(share[i] - sum[i]));
      CHECK(apart > 1e-3f);
    }
  }
  // FSDP over dp 2 of that model over tp 2: the row bias's Partial range inside a flat shard
  // (each dp rank one sequence, each tp rank 3 of its positions), summed over tp in place.
  const Build fsdp_sequence_parallel = [loss](RankContext& ctx, nn::Sequential& plain, const Tensor& x,
                                              const Tensor& y) {
    Split s;
    auto mesh = std::make_shared<parallel::DeviceMesh>(ctx.gloo(), 2, 2);
    s.world = mesh->world();
    auto shard = parallel::parallelize_mlp(plain, parallel::tensor_parallel_group(mesh->tp_group()));
    std::static_pointer_cast<nn::ColumnParallelLinear>((*shard)[0])->set_sequence_parallel(true);
    std::static_pointer_cast<nn::RowParallelLinear>((*shard)[1])->set_sequence_parallel(true);
    auto sharded = std::make_shared<parallel::FullyShardedDataParallel>(shard, mesh->dp_group());
    const int64_t part = kT / 2, b = mesh->dp_rank(), t = mesh->tp_rank();
    const Tensor mine = contiguous(x.narrow(0, b, 1).narrow(1, t * part, part));
    const Tensor targets = contiguous(reshape(y, {kB, kT}).narrow(0, b, 1).narrow(1, t * part, part)).reshape(Shape{part});
    // FSDP averages over dp: each dp rank's share counts dp times.
    mul(loss(sharded->forward(mine), targets), 2.0).backward();
    ctx.report("all-reduces", std::vector<float>{static_cast<float>(parallel::reduce_partial_gradients(sharded->parameters()))});
    s.tensors = sharded->named_parameters();
    s.keep = {mesh, sharded};
    return s;
  };
  const auto results = check_case("FSDP 2 x tp 2 + sequence parallel", 4, fsdp_sequence_parallel, {}, {2.0, kInf},
                                  block, sequences, loss);
  // The bias ends the row unit, in dp rank 1's half of it: its tp group (ranks 2, 3) sums
  // that range; dp rank 0's holds nothing Partial and sums nothing.
  for (const RankResult& r : results) CHECK(r.floats("all-reduces")[0] == (r.rank >= 2 ? 1.0f : 0.0f));
}

TEST_CASE("distributed clip: FSDP over 2 and 3 ranks, uneven shards with padding") {
  // {6, 12, 6, 4}: units of 84, 78 and 28 elements, none a multiple of 3, 28 of 3 neither.
  const Build fsdp = [](RankContext& ctx, nn::Sequential& plain, const Tensor& x, const Tensor& y) {
    Split s;
    s.world = ctx.gloo();
    auto model = plain.clone();
    auto sharded = std::make_shared<parallel::FullyShardedDataParallel>(model, s.world);
    const Batch mine = rows_of({x, y}, ctx.rank, ctx.world_size);
    cross_entropy(sharded->forward(mine.x), mine.y).backward();
    s.tensors = sharded->named_parameters();
    s.clip = [sharded](double norm_type) { return sharded->clip_grad_norm_(kMaxNorm, norm_type); };
    s.keep.push_back(sharded);
    return s;
  };
  check_case("FSDP 2", 2, fsdp, {false});
  check_case("FSDP 3", 3, fsdp, {false});
}

TEST_CASE("distributed clip: ZeRO-2's gradient shards and ZeRO-1's full gradients under DDP, counted once") {
  const auto zero = [](int stage) {
    return Build([stage](RankContext& ctx, nn::Sequential& plain, const Tensor& x, const Tensor& y) {
      Split s;
      s.world = ctx.gloo();
      auto model = std::static_pointer_cast<nn::Sequential>(plain.clone());
      std::shared_ptr<parallel::DistributedDataParallel> ddp;
      if (stage == 1) ddp = std::make_shared<parallel::DistributedDataParallel>(model, s.world);
      parallel::ZeroOptions options;
      options.stage = stage;
      options.bucket_cap_mb = 256.0 / (1 << 20);  // several buckets
      auto opt = std::make_shared<parallel::ZeroRedundancyOptimizer>(
          model->named_parameters(), s.world,
          [](std::vector<Tensor> shards) { return std::make_unique<optim::AdamW>(std::move(shards)); }, options);
      const Batch mine = rows_of({x, y}, ctx.rank, ctx.world_size);
      cross_entropy(ddp ? ddp->forward(mine.x) : model->forward(mine.x), mine.y).backward();
      if (stage == 2) {
        for (size_t b = 0; b < opt->parameters().size(); ++b)
          s.tensors.emplace_back(fmt::format("shard {}", b), opt->parameters()[b]);
      } else {
        s.tensors = model->named_parameters();
      }
      s.clip = [opt](double norm_type) { return opt->clip_grad_norm_(kMaxNorm, norm_type); };
      s.keep.push_back(opt);
      s.keep.push_back(model);
      if (ddp) s.keep.push_back(ddp);
      return s;
    });
  };
  check_case("ZeRO-2, 2 ranks", 2, zero(2), {false});
  check_case("ZeRO-1 (DDP), 2 ranks", 2, zero(1));
}

TEST_CASE("distributed clip: DDP's replicas counted once") {
  check_case("DDP 2", 2, data_parallel);
  check_case("DDP 3", 3, data_parallel);
}

TEST_CASE("distributed clip: the 2-D mesh dp 2 x tp 2 (DDP around tensor parallelism), over the mesh") {
  const Build mesh_2d = [](RankContext& ctx, nn::Sequential& plain, const Tensor& x, const Tensor& y) {
    Split s;
    auto mesh = std::make_shared<parallel::DeviceMesh>(ctx.gloo(), 2, 2);
    s.world = mesh->world();
    auto shard = parallel::parallelize_mlp(plain, parallel::tensor_parallel_group(mesh->tp_group()));
    auto ddp = std::make_shared<parallel::DistributedDataParallel>(shard, mesh->dp_group());
    const Batch mine = rows_of({x, y}, mesh->dp_rank(), mesh->dp_size());
    cross_entropy(ddp->forward(mine.x), mine.y).backward();
    s.tensors = shard->named_parameters();
    s.clip = [mesh, shard](double norm_type) {
      return parallel::clip_grad_norm_(shard->parameters(), *mesh, kMaxNorm, norm_type);
    };
    s.keep = {mesh, ddp};
    return s;
  };
  check_case("dp 2 x tp 2", 4, mesh_2d);
}

TEST_CASE("distributed clip: FSDP x TP on the 2-D mesh (FSDP over dp of a parallelize_mlp model)") {
  const Build fsdp_tp = [](RankContext& ctx, nn::Sequential& plain, const Tensor& x, const Tensor& y) {
    Split s;
    auto mesh = std::make_shared<parallel::DeviceMesh>(ctx.gloo(), 2, 2);
    s.world = mesh->world();
    auto shard = parallel::parallelize_mlp(plain, parallel::tensor_parallel_group(mesh->tp_group()));
    auto sharded = std::make_shared<parallel::FullyShardedDataParallel>(shard, mesh->dp_group());
    const Batch mine = rows_of({x, y}, mesh->dp_rank(), mesh->dp_size());
    cross_entropy(sharded->forward(mine.x), mine.y).backward();
    s.tensors = sharded->named_parameters();
    s.keep = {mesh, sharded};
    return s;
  };
  check_case("FSDP 2 x tp 2", 4, fsdp_tp);
}

TEST_CASE("distributed clip: a sharded weight recorded as Replicate (the parity fault) makes the norm miss") {
  const Build wrong = [](RankContext& ctx, nn::Sequential& plain, const Tensor& x, const Tensor& y) {
    mg::testing::FaultGuard fault(mg::testing::Fault::PlacementReplicateWhereSharded);
    return tensor_parallel(ctx, plain, x, y);
  };
  // The 2-norm (the infinity norm's largest element lies elsewhere, so it would not see it).
  check_case("tp 2, a shard recorded as Replicate", 2, wrong, {true, true}, {2.0});
}

#endif  // MINIGRAD_WITH_GLOO
