// parallel::clip_grad_norm_ (parallel/clip_grad.h) on the GPT's splits: the norm read off
// the placements equals nn::utils::clip_grad_norm_ of the single-device GPT on the whole
// batch, every rank gets the same norm, and each rank's clipped gradients are the matching
// parts of the single-device clipped ones -- on dp2 x pp2 x tp2 (8 Gloo ranks; with and
// without sequence parallelism, and interleaved), where the head's copy of the tied shard
// must count once, and on cp2 x tp2 (4 ranks), where every cp replica must count once.
// Float32 (the norm's all-reduce is Gloo's float32 sum): 1e-5 relative. Counting the
// head's copy too (the mistake the tie's placement prevents) moves the norm by far more.
#ifdef MINIGRAD_WITH_GLOO

#include <algorithm>
#include <cmath>

#include "catch_compat.h"
#include "multiprocess.h"

#include <minigrad/autograd/grad_mode.h>
#include <minigrad/core/ops.h>
#include <minigrad/models/gpt.h>
#include <minigrad/models/gpt_plan.h>
#include <minigrad/nn/utils/clip_grad.h>
#include <minigrad/parallel/c10d/device_mesh.h>
#include <minigrad/parallel/clip_grad.h>
#include <minigrad/parallel/context_parallel/sequence_layout.h>
#include <minigrad/parallel/loss_parallel.h>
#include <minigrad/parallel/partial_gradients.h>
#include <minigrad/parallel/pipeline/mesh_pipeline.h>
#include <minigrad/parallel/placement.h>

using namespace mg;
using namespace mg::test;
using models::GPT;

namespace {

double value(const Tensor& t) { return ops::to_dtype(t, DType::Float64).item<double>(); }
double max_abs(const Tensor& t) { return value(ops::abs_max(t)); }

Tensor part_of(const Tensor& p, const Tensor& full) {
  const parallel::ParameterSpec* spec = parallel::spec_of(p);
  return spec ? parallel::local_part(spec->pieces[0], full) : full;
}

models::GPTConfig config(int64_t n_layer) {
  models::GPTConfig c;
  c.block_size = 16;
  c.vocab_size = 18;
  c.n_layer = n_layer;
  c.n_head = 2;
  c.n_embd = 10;
  c.dropout = 0.0;
  return c;
}

// {relative error of the norm, worst relative error of a clipped gradient, the norm with
// the tied copies counted twice relative to the true one - 1, the norm itself}.
std::vector<float> clip_against_single_device(const parallel::DeviceMesh& mesh, bool sp, bool interleaved) {
  const models::GPTConfig c = config(interleaved ? 4 : 3);
  manual_seed(4321);
  GPT gpt(c);
  const Tensor x = randint(0, c.vocab_size, {5, 8}), y = randint(0, c.vocab_size, {5, 8});
  auto ref = std::static_pointer_cast<GPT>(gpt.clone());
  models::parallelize_gpt(gpt, mesh, sp);
  parallel::MeshPipelineOptions options;
  options.micro_batches = 2;
  if (interleaved) options.schedule = parallel::Schedule::Interleaved1F1B;
  parallel::MeshPipeline model(gpt, mesh, models::gpt_pipeline_cut(c, mesh.size("pp"), interleaved ? 2 : 1),
                               options);
  GPT::loss(ref->forward(x), y).backward();
  model.train_step(model.local_batch(x), model.local_batch(y), [&mesh](const Tensor& out, const Tensor& t) {
    parallel::LossParallel loss_parallel(mesh);
    return mul(GPT::loss(out, t, Reduction::Sum), 1.0 / 40.0);
  });
  // The norm of the gradient is about 3 for this GPT: a max_norm of 0.5 clips.
  const double want = value(nn::utils::clip_grad_norm_(ref->parameters(), 0.5));
  // The wrong count: the tied copies (on the last stage) counted too, once per tp shard
  // on dp rank 0 (the dp replicas count once).
  double tied = 0;
  for (const auto& [name, p] : model.named_parameters())
    if (name == "lm_head.weight" && mesh.rank("dp") == 0)
      tied += std::pow(value(nn::utils::get_total_norm({p.grad()})), 2);
  Tensor extra = full({1}, tied, DType::Float32);
  mesh.world()->allreduce({extra})->wait();
  const double got = value(parallel::clip_grad_norm_(model.parameters(), mesh, 0.5));
  const double wrong = std::sqrt(got * got + extra.to_vector<float>()[0]);
  double grad_error = 0;
  NoGradGuard no_grad;
  for (const auto& [name, p] : model.named_parameters()) {
    const Tensor expected =
        part_of(p, ref->parameter(name == "lm_head.weight" ? "transformer.wte.weight" : name).grad());
    grad_error = std::max(grad_error, max_abs(p.grad() - expected) / std::max(max_abs(expected), 1e-6));
  }
  return {static_cast<float>(std::abs(got - want) / want), static_cast<float>(grad_error),
          static_cast<float>(wrong / want - 1), static_cast<float>(got)};
}

// cp x tp without a pipeline: every parameter Replicate over cp (each cp rank's copy counts
// once), the tp shards by their placements. {norm error, clipped-gradient error, the norm
// with every cp replica counted, relative - 1, the norm}.
std::vector<float> clip_cp_tp(const parallel::DeviceMesh& mesh) {
  const models::GPTConfig c = config(2);
  manual_seed(99);
  GPT gpt(c);
  const Tensor x = randint(0, c.vocab_size, {3, 8}), y = randint(0, c.vocab_size, {3, 8});
  auto ref = std::static_pointer_cast<GPT>(gpt.clone());
  models::parallelize_gpt(gpt, mesh, true);
  const auto local = [&](const Tensor& t) {
    return parallel::context_parallel::shard_sequence(t, mesh.rank("cp"), mesh.size("cp"));
  };
  GPT::loss(ref->forward(x), y).backward();
  {
    parallel::LossParallel loss_parallel(mesh);
    GPT::loss(gpt.forward(local(x)), local(y)).backward();
  }
  parallel::reduce_partial_gradients(gpt.parameters());
  const double want = value(nn::utils::clip_grad_norm_(ref->parameters(), 0.5));
  // Counting every cp replica: the sum over the world without the cp rank-0 rule, i.e. cp
  // times the counted squares.
  double counted = 0;
  for (const Tensor& g : parallel::counted_gradients(gpt.parameters()))
    counted += std::pow(value(nn::utils::get_total_norm({g})), 2);
  Tensor every = full({1}, counted * (mesh.rank("cp") == 0 ? mesh.size("cp") : 0), DType::Float32);
  mesh.world()->allreduce({every})->wait();
  const double got = value(parallel::clip_grad_norm_(gpt.parameters(), mesh, 0.5));
  double grad_error = 0;
  NoGradGuard no_grad;
  for (const auto& [name, p] : gpt.named_parameters()) {
    const Tensor expected = part_of(p, ref->parameter(name).grad());
    grad_error = std::max(grad_error, max_abs(p.grad() - expected) / std::max(max_abs(expected), 1e-6));
  }
  return {static_cast<float>(std::abs(got - want) / want), static_cast<float>(grad_error),
          static_cast<float>(std::sqrt(every.to_vector<float>()[0]) / want - 1), static_cast<float>(got)};
}

void require_clipped(const std::vector<RankResult>& results, const char* run) {
  const float norm = results.front().floats(run)[3];
  for (const RankResult& r : results) {
    INFO("rank " << r.rank << ", " << run);
    const std::vector<float> e = r.floats(run);
    REQUIRE(e[0] <= 1e-5f);
    REQUIRE(e[1] <= 1e-5f);
    REQUIRE(e[2] >= 1e-3f);  // a wrong count would be caught
    REQUIRE(e[3] == norm);   // the same norm on every rank, bit for bit
  }
}

}  // namespace

TEST_CASE("parallel::clip_grad_norm_ on the GPT's dp2 x pp2 x tp2 (with and without SP, and interleaved) "
          "equals the single-device clip_grad_norm_, the tied copies counted once", "[gpt_4d]") {
  auto results = run_ranks(8, [](RankContext& ctx) {
    parallel::DeviceMesh mesh(ctx.gloo(), {{"dp", 2}, {"pp", 2}, {"tp", 2}});
    ctx.report("plain", clip_against_single_device(mesh, false, false));
    ctx.report("sp", clip_against_single_device(mesh, true, false));
    ctx.report("interleaved", clip_against_single_device(mesh, false, true));
  });
  INFO(describe(results));
  for (const RankResult& r : results) REQUIRE(r.ok());
  for (const char* run : {"plain", "sp", "interleaved"}) require_clipped(results, run);
}

TEST_CASE("parallel::clip_grad_norm_ on the GPT's cp2 x tp2 + SP equals the single-device clip_grad_norm_, "
          "each cp replica counted once", "[gpt_mesh]") {
  auto results = run_ranks(4, [](RankContext& ctx) {
    parallel::DeviceMesh mesh(ctx.gloo(), {{"cp", 2}, {"tp", 2}});
    ctx.report("cp tp", clip_cp_tp(mesh));
  });
  INFO(describe(results));
  for (const RankResult& r : results) REQUIRE(r.ok());
  require_clipped(results, "cp tp");
}

#endif
