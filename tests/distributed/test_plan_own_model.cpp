// A user's own model split by a plan: a small transformer written here, in the test file
// -- not a library model -- with separate q, k, v projections (Llama's, not the GPT's fused
// c_attn), an untied head and a learned position embedding. The plan below (tp, with and
// without sequence parallelism, and cp: under 30 lines; FSDP: fully_shard on each block,
// then on the model, 3 lines) is all it takes; on Gloo ranks its loss, every gradient and
// the parameters after 3 AdamW steps equal the plain model's on the whole batch, in float64
// (only the order of sums differs: held to 1e-10 relative for the gradients, 1e-12 absolute
// for the parameters, as the GPT's composed-mesh test). FSDP, alone over dp 2 and 4 and
// beside tp (+ SP) on a dp 2 x tp 2 mesh, runs in float32 (FSDP's flat shards and Gloo's
// reduce-scatter are float32): held to 1e-5 relative for the loss and the gradients, 1e-5
// absolute for the parameters (a hundredth of one step of lr 1e-3).
#ifdef MINIGRAD_WITH_GLOO

#include "catch_compat.h"
#include "gpt_split_check.h"
#include "multiprocess.h"

#include <minigrad/autograd/functions.h>
#include <minigrad/autograd/grad_mode.h>
#include <minigrad/core/ops.h>
#include <minigrad/nn/layers.h>
#include <minigrad/nn/optim/adam.h>
#include <minigrad/nn/transformer_layers.h>
#include <minigrad/parallel/c10d/device_mesh.h>
#include <minigrad/parallel/context_parallel/sequence_layout.h>
#include <minigrad/parallel/context_parallel/style.h>
#include <minigrad/parallel/loss_parallel.h>
#include <minigrad/parallel/parallelize.h>
#include <minigrad/parallel/partial_gradients.h>
#include <minigrad/parallel/placement.h>
#include <minigrad/parallel/sharded/fully_shard.h>
#include <minigrad/parallel/tensor_parallel/styles.h>

using namespace mg;
using namespace mg::test;

namespace {

constexpr int64_t kVocab = 16, kWidth = 12, kHeadSize = 3, kBlockSize = 16;

// Causal self-attention through q, k, v projections of its own; the heads are as many as
// q's output holds (all 4, or a rank's share), and the attention function may be replaced.
class Attention : public nn::Cloneable<Attention>, public nn::AttentionHost {
 public:
  Attention() : nn::Cloneable<Attention>("Attention") {
    for (const char* name : {"q", "k", "v"}) register_module(name, std::make_shared<nn::Linear>(kWidth, kWidth, false));
    register_module("o", std::make_shared<nn::Linear>(kWidth, kWidth, false));
  }
  void set_attention_function(AttentionFunction f) override { attention_ = std::move(f); }
  Tensor forward(const Tensor& x) override {
    const int64_t B = x.size(0), T = x.size(1);
    const auto heads = [&](const char* name) {
      const Tensor t = (*child(name))(x);
      return transpose(reshape(t, {B, T, t.size(2) / kHeadSize, kHeadSize}), 1, 2);
    };
    const Tensor q = heads("q"), k = heads("k"), v = heads("v");
    const Tensor y = attention_ ? attention_(q, k, v, 0.0) : scaled_dot_product_attention(q, k, v, true, 0.0);
    return (*child("o"))(reshape(contiguous(transpose(y, 1, 2)), {B, T, y.size(1) * kHeadSize}));
  }

 private:
  AttentionFunction attention_;
};

class Block : public nn::Cloneable<Block> {
 public:
  Block() : nn::Cloneable<Block>("Block") {
    register_module("norm1", std::make_shared<nn::LayerNorm>(kWidth));
    register_module("attn", std::make_shared<Attention>());
    register_module("norm2", std::make_shared<nn::LayerNorm>(kWidth));
    register_module("up", std::make_shared<nn::Linear>(kWidth, 2 * kWidth));
    register_module("down", std::make_shared<nn::Linear>(2 * kWidth, kWidth));
  }
  Tensor forward(const Tensor& x) override {
    const Tensor h = x + (*child("attn"))((*child("norm1"))(x));
    return h + (*child("down"))(relu((*child("up"))((*child("norm2"))(h))));
  }
};

class TinyTransformer : public nn::Cloneable<TinyTransformer> {
 public:
  TinyTransformer() : nn::Cloneable<TinyTransformer>("TinyTransformer") {
    register_module("tok", std::make_shared<nn::Embedding>(kVocab, kWidth));
    register_module("pos", std::make_shared<nn::Embedding>(kBlockSize, kWidth));
    auto blocks = std::make_shared<nn::Sequential>();
    for (int i = 0; i < 2; ++i) blocks->push_back(std::make_shared<Block>());
    register_module("blocks", blocks);
    register_module("norm", std::make_shared<nn::LayerNorm>(kWidth));
    register_module("head", std::make_shared<nn::Linear>(kWidth, kVocab, false));
  }
  Tensor forward(const Tensor& idx) override {
    const Tensor positions = arange(static_cast<double>(idx.size(1)), DType::Int64);
    const Tensor x = (*child("tok"))(idx) + (*child("pos"))(positions);
    return (*child("head"))((*child("norm"))((*child("blocks"))(x)));
  }
};

// ---- the plans: all the parallel code this model brings ----
parallel::ParallelPlan tp_plan(bool sequence_parallel) {
  using namespace parallel;
  const Layout stream = sequence_parallel ? Layout::shard(1) : Layout::replicate();
  auto colwise = std::make_shared<ColwiseParallel>();
  ParallelPlan plan{"tp",
                    {{"tok", std::make_shared<RowwiseParallel>(Layout::replicate(), stream)},
                     {"blocks.*.attn", std::make_shared<PrepareModuleInput>(stream, Layout::replicate())},
                     {"blocks.*.attn.[qkv]", colwise},
                     {"blocks.*.attn.o", std::make_shared<RowwiseParallel>(Layout::shard(-1), stream)},
                     {"blocks.*.up", std::make_shared<ColwiseParallel>(stream, Layout::shard(-1))},
                     {"blocks.*.down", std::make_shared<RowwiseParallel>(Layout::shard(-1), stream)},
                     {"head", std::make_shared<ColwiseParallel>(stream, Layout::shard(-1))}}};
  if (!sequence_parallel) return plan;
  plan.styles.push_back({"pos", std::make_shared<PrepareModuleInput>(Layout::replicate(), Layout::shard(0))});
  for (const char* on_stream : {"pos", "blocks.*.norm[12]", "norm"})
    plan.styles.push_back({on_stream, std::make_shared<SequenceParallel>()});
  return plan;
}

parallel::ParallelPlan cp_plan() {
  return {"cp",
          {{"blocks.*.attn", std::make_shared<parallel::ContextParallel>()},
           {"pos", std::make_shared<parallel::ContextParallelPositions>()}}};
}

std::shared_ptr<parallel::FSDPModule> fsdp(const std::shared_ptr<TinyTransformer>& model, const parallel::DeviceMesh& mesh) {
  for (const nn::ModulePtr& block : model->child("blocks")->children()) parallel::fully_shard(block, mesh);
  return parallel::fully_shard(model, mesh);
}
// ---- end of the plans ----

std::shared_ptr<TinyTransformer> make_model(DType dtype = DType::Float64) {
  manual_seed(31);
  auto model = std::make_shared<TinyTransformer>();
  if (dtype != DType::Float32) model->to(dtype);
  return model;
}

// The model split over `mesh` (cp and tp, where the mesh has them) against the plain one.
SplitErrors against_plain(const parallel::DeviceMesh& mesh, bool sequence_parallel, int64_t B, int64_t T) {
  auto plain = make_model(), split = make_model();
  if (mesh.size("cp") > 1) parallel::parallelize_module(*split, mesh, cp_plan());
  if (mesh.size("tp") > 1) parallel::parallelize_module(*split, mesh, tp_plan(sequence_parallel));
  manual_seed(5);
  const Tensor x = randint(0, kVocab, {B, T}), y = randint(0, kVocab, {B, T});
  const auto local = [&](const Tensor& t) {
    return parallel::context_parallel::shard_sequence(t, mesh.rank("cp"), mesh.size("cp"));
  };
  const auto part_of = [&](const std::string& name, const Tensor& full) {
    const parallel::ParameterSpec* spec = parallel::spec_of(split->parameter(name));
    return spec ? parallel::local_part(spec->pieces[0], full) : full;
  };
  optim::AdamW plain_opt(plain->parameters(), optim::AdamWOptions(1e-2));
  optim::AdamW split_opt(split->parameters(), optim::AdamWOptions(1e-2));
  SplitErrors out;
  for (int step = 0; step < 3; ++step) {
    plain_opt.zero_grad();
    split_opt.zero_grad();
    const Tensor want = cross_entropy(reshape(plain->forward(x), {B * T, kVocab}), reshape(y, {B * T}));
    want.backward();
    Tensor got;
    {
      parallel::LossParallel loss_parallel(mesh);
      const Tensor logits = split->forward(local(x));
      got = cross_entropy(reshape(logits, {-1, logits.size(2)}), reshape(local(y), {-1}));
    }
    got.backward();
    parallel::reduce_partial_gradients(split->parameters());
    if (step == 0) {
      out.loss_error = std::abs(as_double(got) - as_double(want)) / std::abs(as_double(want));
      out.compare_grads(split->named_parameters(),
                        [&](const std::string& name) { return part_of(name, plain->parameter(name).grad()); });
    }
    plain_opt.step();
    split_opt.step();
  }
  NoGradGuard no_grad;
  out.compare_params(split->named_parameters(),
                     [&](const std::string& name) { return part_of(name, plain->parameter(name)); });
  return out;
}

// FSDP over the mesh's dp (after the tp plan where the mesh has tp), float32, each dp rank
// on its rows of the batch (uneven when dp does not divide B), against the plain model: the
// shards' pieces against the parts of the plain tensors they hold (their placements: a
// flat range over dp, after tp's split).
SplitErrors against_plain_fsdp(const parallel::DeviceMesh& mesh, bool sequence_parallel, int64_t B, int64_t T) {
  auto plain = make_model(DType::Float32), split = make_model(DType::Float32);
  if (mesh.size("tp") > 1) parallel::parallelize_module(*split, mesh, tp_plan(sequence_parallel));
  const std::shared_ptr<parallel::FSDPModule> sharded = fsdp(split, mesh);
  manual_seed(5);
  const Tensor x = randint(0, kVocab, {B, T}), y = randint(0, kVocab, {B, T});
  const auto& dp = mesh.group("dp");
  const auto [start, rows] = rows_of(B, dp->size(), dp->rank());
  const Tensor x_mine = ops::contiguous(x.narrow(0, start, rows)), y_mine = ops::contiguous(y.narrow(0, start, rows));
  // The rank's mean over its rows, weighted so that FSDP's average over dp is the batch's mean.
  const double weight = static_cast<double>(rows * dp->size()) / static_cast<double>(B);
  // Each piece of each shard against the part of the plain tensor it holds.
  const auto compare = [&](bool grads, double& worst, std::string& where) {
    for (const Tensor& shard : sharded->parameters()) {
      const Tensor values = grads ? shard.grad() : shard;
      for (const parallel::ParameterPiece& piece : parallel::spec_of(shard)->pieces) {
        const Tensor full = grads ? plain->parameter(piece.name).grad() : plain->parameter(piece.name);
        const Tensor want = parallel::local_part(piece, full);
        const Tensor got = values.narrow(0, piece.flat->local_offset, piece.flat->numel);
        const double err = max_abs(got - want) / (grads ? std::max(max_abs(full), 1e-6) : 1.0);
        if (err >= worst) {
          worst = err;
          where = piece.str();
        }
      }
    }
  };
  optim::AdamW plain_opt(plain->parameters(), optim::AdamWOptions(1e-3));
  optim::AdamW split_opt(sharded->parameters(), optim::AdamWOptions(1e-3));
  SplitErrors out;
  for (int step = 0; step < 3; ++step) {
    plain_opt.zero_grad();
    split_opt.zero_grad();
    const Tensor want = cross_entropy(reshape(plain->forward(x), {B * T, kVocab}), reshape(y, {B * T}));
    want.backward();
    Tensor got;
    {
      parallel::LossParallel loss_parallel(mesh);
      const Tensor logits = (*split)(x_mine);  // through the hooks: the root begins the step
      got = mul(cross_entropy(reshape(logits, {-1, logits.size(2)}), reshape(y_mine, {-1})), weight);
    }
    got.backward();  // reduce-scatters each unit's gradient over dp
    parallel::reduce_partial_gradients(sharded->parameters());  // SP's sums over tp, on the shards
    if (step == 0) {
      Tensor loss = ops::clone(got.detach());
      dp->allreduce(loss, parallel::ReduceOp::Average)->wait();  // the weighted means' average
      out.loss_error = std::abs(as_double(loss) - as_double(want)) / std::abs(as_double(want));
      compare(true, out.grad_error, out.worst_grad);
    }
    plain_opt.step();
    split_opt.step();
  }
  NoGradGuard no_grad;
  compare(false, out.param_error, out.worst_param);
  return out;
}

void require_equal(const RankResult& r, const std::string& prefix) {
  INFO("rank " << r.rank << ", " << prefix << ": " << r.text(prefix + " where"));
  const std::vector<float> e = r.floats(prefix + " errors");
  const bool fsdp = prefix.rfind("fsdp", 0) == 0;  // float32
  REQUIRE(e[0] <= (fsdp ? 1e-5f : 1e-10f));
  REQUIRE(e[1] <= (fsdp ? 1e-5f : 1e-10f));
  REQUIRE(e[2] <= (fsdp ? 1e-5f : 1e-12f));
}

}  // namespace

TEST_CASE("a user's own transformer split by a plan of its own: tp, tp + SP, cp and cp x tp equal the plain "
          "model", "[plan]") {
  auto results = run_ranks(4, [](RankContext& ctx) {
    const auto world = ctx.gloo();
    // tp 2 and tp 2 + SP on ranks {0, 1} and {2, 3}; cp 2 likewise; then cp 2 x tp 2.
    parallel::DeviceMesh pairs(world, {{"dp", 2}, {"tp", 2}});
    report_errors(ctx, "tp2", against_plain(pairs, false, 3, 8));
    report_errors(ctx, "tp2 sp", against_plain(pairs, true, 3, 8));
    parallel::DeviceMesh cp_pairs(world, {{"dp", 2}, {"cp", 2}});
    report_errors(ctx, "cp2", against_plain(cp_pairs, false, 3, 8));
    parallel::DeviceMesh both(world, {{"cp", 2}, {"tp", 2}});
    report_errors(ctx, "cp2 tp2 sp", against_plain(both, true, 3, 8));
  });
  INFO(describe(results));
  for (const RankResult& r : results) {
    REQUIRE(r.ok());
    for (const char* prefix : {"tp2", "tp2 sp", "cp2", "cp2 tp2 sp"}) require_equal(r, prefix);
  }
}

TEST_CASE("a user's own transformer under FSDP (a unit per block, then the model), alone and beside its tp "
          "plan, equals the plain model", "[plan]") {
  auto results = run_ranks(4, [](RankContext& ctx) {
    const auto world = ctx.gloo();
    report_errors(ctx, "fsdp4", against_plain_fsdp(parallel::DeviceMesh(world, {{"dp", 4}}), false, 6, 8));
    parallel::DeviceMesh pairs(world, {{"dp", 2}, {"tp", 2}});
    report_errors(ctx, "fsdp2 tp2", against_plain_fsdp(pairs, false, 3, 8));
    report_errors(ctx, "fsdp2 tp2 sp", against_plain_fsdp(pairs, true, 3, 8));
  });
  INFO(describe(results));
  for (const RankResult& r : results) {
    REQUIRE(r.ok());
    for (const char* prefix : {"fsdp4", "fsdp2 tp2", "fsdp2 tp2 sp"}) require_equal(r, prefix);
  }
}

#endif  // MINIGRAD_WITH_GLOO
