// The full state dicts (minigrad/parallel/full_state_dict.h, full_optimizer_state.h) across
// Gloo ranks: a checkpoint saved under one split -- tensor parallelism over 2 ranks, FSDP
// over 3, ZeRO-2 over 2, the mesh dp 2 x tp 2, a 2-stage pipeline -- is the single-device
// checkpoint (the model's state dict, and AdamW's state under the single-device indices),
// and loads under another. Each rank writes what it gathered to a file of its own; the
// parent compares. Checked:
//   - the parameters gathered from any split: the single device's, bit for bit; loaded into
//     another split (another world size, another model's values) and gathered again: the
//     same bits;
//   - after 2 AdamW steps under one split, parameters and state against the single device's
//     2 steps; resumed under another split for 2 more, against its 4 steps (tolerance
//     below); and resumed under the same split, bit for bit the unbroken run.
// Tolerance of the trained values: the splits' gradients differ from the single device's
// by their rounding, at most K u of their scale (tests/parallel/placement_check.h, K = 12);
// AdamW's update lr m / (sqrt(v) + eps) moves by a few times that relative error of lr per
// step, its state by K u of its scale: 4 steps stay within 64 K u = 4.6e-5 of each
// tensor's scale (normwise, max |got - want| / max |want|).
#ifdef MINIGRAD_WITH_GLOO

#include <cmath>

#include "catch_compat.h"
#include "multiprocess.h"
#include "parallel/dp_check.h"
#include "parallel/placement_check.h"
#include "temp_dir.h"

#include <minigrad/minigrad.h>

using namespace mg;
using namespace mg::test;
using GroupPtr = std::shared_ptr<parallel::ProcessGroup>;

namespace {

constexpr int64_t kBatch = 12;
constexpr double kLr = 1e-2;
constexpr double kTrainedTolerance = 64 * 12 * mg::testing::kUnitRoundoff;

std::shared_ptr<nn::Sequential> mlp(uint64_t seed) {
  manual_seed(seed);
  return std::static_pointer_cast<nn::Sequential>(mg::testing::make_mlp({6, 12, 6, 4}));
}

std::vector<std::string> single_device_names() {
  std::vector<std::string> names;
  for (const auto& [name, p] : mlp(0)->named_parameters()) names.push_back(name);
  return names;
}

struct Batch {
  Tensor x, y;
};

Batch batch(int step) {
  manual_seed(static_cast<uint64_t>(100 + step));
  return {randn({kBatch, 6}), randint(0, 4, {kBatch})};
}

Batch rows_of(const Batch& b, int r, int n) {
  const int64_t per = b.x.size(0) / n;
  return {b.x.narrow(0, r * per, per), b.y.narrow(0, r * per, per)};
}

std::unique_ptr<optim::Optimizer> adamw(std::vector<Tensor> params) {
  return std::make_unique<optim::AdamW>(std::move(params), optim::AdamWOptions(kLr));
}

// One rank's split of the MLP, ready to train and to save.
struct Split {
  std::vector<nn::NamedTensor> named;  // what full_state_dict reads
  std::shared_ptr<optim::Optimizer> opt;
  std::function<void(int step)> train;  // one step on batch(step)
  GroupPtr world;
  std::vector<std::shared_ptr<void>> keep;
};
using MakeSplit = std::function<Split(RankContext&, uint64_t seed)>;

Split tensor_parallel(RankContext& ctx, uint64_t seed) {
  Split s;
  s.world = ctx.gloo();
  auto shard = parallel::parallelize_mlp(*mlp(seed), parallel::tensor_parallel_group(s.world));
  s.opt = adamw(shard->parameters());
  s.train = [shard, opt = s.opt](int step) {
    const Batch b = batch(step);
    opt->zero_grad();
    cross_entropy(shard->forward(b.x), b.y).backward();
    opt->step();
  };
  s.named = shard->named_parameters();
  s.keep.push_back(shard);
  return s;
}

Split fsdp(RankContext& ctx, uint64_t seed) {
  Split s;
  s.world = ctx.gloo();
  auto sharded = std::make_shared<parallel::FullyShardedDataParallel>(mlp(seed), s.world);
  s.opt = adamw(sharded->parameters());
  s.train = [sharded, opt = s.opt, r = ctx.rank, n = ctx.world_size](int step) {
    const Batch b = rows_of(batch(step), r, n);
    opt->zero_grad();
    cross_entropy(sharded->forward(b.x), b.y).backward();
    opt->step();
  };
  s.named = sharded->named_parameters();
  s.keep.push_back(sharded);
  return s;
}

Split zero2(RankContext& ctx, uint64_t seed) {
  Split s;
  s.world = ctx.gloo();
  auto model = mlp(seed);
  parallel::ZeroOptions options;
  options.stage = 2;
  options.bucket_cap_mb = 256.0 / (1 << 20);  // several buckets, boundaries inside tensors
  auto zero = std::make_shared<parallel::ZeroRedundancyOptimizer>(model->named_parameters(), s.world, adamw, options);
  s.opt = zero;
  s.train = [model, zero, r = ctx.rank, n = ctx.world_size](int step) {
    const Batch b = rows_of(batch(step), r, n);
    zero->zero_grad();
    cross_entropy(model->forward(b.x), b.y).backward();
    zero->step();
  };
  s.named = model->named_parameters();
  s.keep.push_back(model);
  return s;
}

Split mesh_2d(RankContext& ctx, uint64_t seed) {
  Split s;
  auto mesh = std::make_shared<parallel::DeviceMesh>(ctx.gloo(), 2, 2);
  s.world = mesh->world();
  auto shard = parallel::parallelize_mlp(*mlp(seed), parallel::tensor_parallel_group(mesh->tp_group()));
  auto ddp = std::make_shared<parallel::DistributedDataParallel>(shard, mesh->dp_group());
  s.opt = adamw(shard->parameters());
  s.train = [ddp, opt = s.opt, mesh](int step) {
    const Batch b = rows_of(batch(step), mesh->dp_rank(), mesh->dp_size());
    opt->zero_grad();
    cross_entropy(ddp->forward(b.x), b.y).backward();
    opt->step();
  };
  s.named = shard->named_parameters();
  s.keep = {mesh, ddp};
  return s;
}

// Two stages: rank 0 the first Linear and its ReLU, rank 1 the rest. Each stage's
// parameters go under the single-device names (a stage numbers its layers from 0).
Split pipeline(RankContext& ctx, uint64_t seed) {
  Split s;
  s.world = ctx.gloo();
  auto plain = mlp(seed);
  const std::vector<int64_t> balance{2, 3};
  parallel::PipelineStageOptions options;
  options.chunks = 2;
  auto stage = std::make_shared<parallel::PipelineStage>(parallel::split_stage(plain, balance, ctx.rank), s.world,
                                                         options);
  const std::vector<std::string> names = single_device_names();
  const size_t first = ctx.rank == 0 ? 0 : 2;
  const auto params = stage->module()->parameters();
  for (size_t k = 0; k < params.size(); ++k) s.named.emplace_back(names[first + k], params[k]);
  s.opt = adamw(params);
  s.train = [stage, opt = s.opt, r = ctx.rank](int step) {
    const Batch b = batch(step);
    opt->zero_grad();
    stage->train_step(r == 0 ? b.x : Tensor(), r == 1 ? b.y : Tensor(),
                      [](const Tensor& out, const Tensor& y) { return cross_entropy(out, y); });
    opt->step();
  };
  s.keep.push_back(stage);
  return s;
}

// Every rank gathers the model and the optimizer state and writes them, as the single
// device's checkpoint, to path.rank<r>.
void save(RankContext& ctx, Split& s, const std::string& path) {
  nn::Checkpoint ck;
  ck.put("model.", parallel::full_state_dict(s.named, s.world));
  ck.put("optim.", parallel::indexed_optimizer_state(parallel::full_optimizer_state(*s.opt, s.named, s.world),
                                                     single_device_names()));
  nn::save_tensors(ck, fmt::format("{}.rank{}", path, ctx.rank));
}

void load(Split& s, const std::string& path) {
  const nn::Checkpoint ck = nn::load_tensors(path);
  parallel::load_full_state_dict(s.named, ck.get("model."), path);
  parallel::load_full_optimizer_state(*s.opt, s.named,
                                      parallel::named_optimizer_state(ck.get("optim."), single_device_names()), path);
}

// The single device: its checkpoint after `steps` AdamW steps from seed 5.
nn::Checkpoint single_device(int steps) {
  auto model = mlp(5);
  auto opt = adamw(model->parameters());
  for (int step = 0; step < steps; ++step) {
    const Batch b = batch(step);
    opt->zero_grad();
    cross_entropy(model->forward(b.x), b.y).backward();
    opt->step();
  }
  nn::Checkpoint ck;
  ck.put("model.", nn::state_dict(*model));
  ck.put("optim.", opt->state_dict());
  return ck;
}

// Every rank's file is the same; returns rank 0's.
nn::Checkpoint read_ranks(const std::string& path, int world_size) {
  const nn::Checkpoint first = nn::load_tensors(path + ".rank0");
  for (int r = 1; r < world_size; ++r) {
    INFO("rank " << r);
    const nn::Checkpoint other = nn::load_tensors(fmt::format("{}.rank{}", path, r));
    REQUIRE(other.tensors.size() == first.tensors.size());
    for (const auto& [name, t] : first.tensors) {
      INFO(name);
      REQUIRE(other.tensors.count(name) == 1);
      CHECK(other.tensors.at(name).to(DType::Float64).to_vector<double>() == t.to(DType::Float64).to_vector<double>());
    }
  }
  return first;
}

// The worst normwise error of `got` against `want` over every tensor (names must match);
// bitwise: every tensor equal.
double worst_error(const nn::TensorDict& got, const nn::TensorDict& want, bool bitwise) {
  REQUIRE(got.size() == want.size());
  double worst = 0.0;
  for (const auto& [name, w] : want) {
    INFO(name);
    REQUIRE(got.count(name) == 1);
    const Tensor& g = got.at(name);
    REQUIRE(g.shape() == w.shape());
    REQUIRE(g.dtype() == w.dtype());
    const std::vector<double> a = g.to(DType::Float64).contiguous().to_vector<double>();
    const std::vector<double> b = w.to(DType::Float64).contiguous().to_vector<double>();
    if (bitwise) {
      CHECK(a == b);
      continue;
    }
    double scale = 0.0, diff = 0.0;
    for (size_t i = 0; i < a.size(); ++i) {
      scale = std::max(scale, std::fabs(b[i]));
      diff = std::max(diff, std::fabs(a[i] - b[i]));
    }
    worst = std::max(worst, scale > 0 ? diff / scale : diff);
  }
  return worst;
}

void run(int world_size, const std::function<void(RankContext&)>& body) {
  const auto results = run_ranks(world_size, body);
  INFO(describe(results));
  for (const RankResult& r : results) REQUIRE(r.ok());
}

}  // namespace

TEST_CASE("full_state_dict across Gloo ranks: tp 2 -> FSDP 3 -> ZeRO-2 -> dp 2 x tp 2 -> pipeline 2, each the "
          "single device's state dict, bit for bit") {
  mg::testing::TempDir dir;
  const nn::TensorDict want = nn::state_dict(*mlp(5));
  struct Hop {
    const char* what;
    int ranks;
    MakeSplit make;
  };
  const std::vector<Hop> hops = {{"tp 2", 2, tensor_parallel}, {"FSDP 3", 3, fsdp}, {"ZeRO-2 on 2", 2, zero2},
                                 {"dp 2 x tp 2", 4, mesh_2d}, {"pipeline of 2 stages", 2, pipeline}};
  std::string previous;
  for (const Hop& hop : hops) {
    INFO(hop.what);
    const std::string path = dir / hop.what;
    run(hop.ranks, [&](RankContext& ctx) {
      // The first hop starts from the model itself; every later one from another model's
      // values, with the checkpoint the hop before saved loaded over them.
      Split s = hop.make(ctx, previous.empty() ? 5 : 6);
      if (!previous.empty()) load(s, previous);
      save(ctx, s, path);
    });
    worst_error(read_ranks(path, hop.ranks).get("model."), want, /*bitwise=*/true);
    previous = path + ".rank0";
  }
}

TEST_CASE("full_optimizer_state across Gloo ranks: 2 AdamW steps under one split, 2 more under another, against "
          "the single device's 2 and 4 steps, and a resume under the same split is the unbroken run, bit for bit") {
  mg::testing::TempDir dir;
  const nn::Checkpoint two = single_device(2), four = single_device(4);
  struct Pair {
    const char* what;
    int ranks_a;
    MakeSplit a;
    int ranks_b;
    MakeSplit b;
  };
  for (const Pair& p : {Pair{"tp 2 -> FSDP 3", 2, tensor_parallel, 3, fsdp},
                        Pair{"ZeRO-2 on 2 -> dp 2 x tp 2", 2, zero2, 4, mesh_2d},
                        Pair{"FSDP 3 -> pipeline of 2 stages", 3, fsdp, 2, pipeline}}) {
    INFO(p.what);
    const std::string a = dir / (std::string(p.what) + " a"), b = dir / (std::string(p.what) + " b");
    const std::string loaded = dir / (std::string(p.what) + " loaded");
    run(p.ranks_a, [&](RankContext& ctx) {
      Split s = p.a(ctx, 5);
      s.train(0);
      s.train(1);
      save(ctx, s, a);
    });
    const nn::Checkpoint after_a = read_ranks(a, p.ranks_a);
    const double error_a = std::max(worst_error(after_a.get("model."), two.get("model."), false),
                                    worst_error(after_a.get("optim."), two.get("optim."), false));
    run(p.ranks_b, [&](RankContext& ctx) {
      Split s = p.b(ctx, 6);
      load(s, a + ".rank0");
      save(ctx, s, loaded);  // straight back: the file it loaded
      s.train(2);
      s.train(3);
      save(ctx, s, b);
    });
    worst_error(read_ranks(loaded, p.ranks_b).tensors, after_a.tensors, /*bitwise=*/true);
    const nn::Checkpoint after_b = read_ranks(b, p.ranks_b);
    const double error_b = std::max(worst_error(after_b.get("model."), four.get("model."), false),
                                    worst_error(after_b.get("optim."), four.get("optim."), false));
    fmt::print("resume {}: after 2 steps {:.2e}, after 4 steps {:.2e} of the single device's (tolerance {:.2e})\n",
               p.what, error_a, error_b, kTrainedTolerance);
    CHECK(error_a <= kTrainedTolerance);
    CHECK(error_b <= kTrainedTolerance);
  }
  // The same split, broken after 2 steps and resumed from the file in a new model, is the
  // unbroken run of 4: the state went through the single-device layout unchanged.
  for (const auto& [what, ranks, make] : {std::tuple<const char*, int, MakeSplit>{"FSDP 3", 3, fsdp},
                                          std::tuple<const char*, int, MakeSplit>{"ZeRO-2 on 2", 2, zero2},
                                          std::tuple<const char*, int, MakeSplit>{"dp 2 x tp 2", 4, mesh_2d}}) {
    INFO(what);
    const std::string unbroken = dir / (std::string(what) + " unbroken"), half = dir / (std::string(what) + " half");
    const std::string resumed = dir / (std::string(what) + " resumed");
    run(ranks, [&, make = make](RankContext& ctx) {
      Split whole = make(ctx, 5);
      for (int step = 0; step < 4; ++step) whole.train(step);
      save(ctx, whole, unbroken);
      Split first = make(ctx, 5);
      first.train(0);
      first.train(1);
      save(ctx, first, half);
      Split second = make(ctx, 6);
      load(second, half + ".rank" + std::to_string(ctx.rank));
      second.train(2);
      second.train(3);
      save(ctx, second, resumed);
    });
    worst_error(read_ranks(resumed, ranks).tensors, read_ranks(unbroken, ranks).tensors, /*bitwise=*/true);
  }
}

#endif  // MINIGRAD_WITH_GLOO
