// models::clip_mesh_grad_norm_ (gpt_mesh_clip.h): the global gradient norm of the GPT on a
// dp2 x pp2 x tp2 mesh (8 Gloo ranks), with and without sequence parallelism, and the
// interleaved schedule on pp2 x tp2, equals nn::utils::clip_grad_norm_ of the single-device
// GPT on the whole batch, and each rank's clipped gradients are the matching slices of the
// single-device clipped ones. Float32 (the norm's all-reduce is Gloo's float32 sum): 1e-5
// relative. Counting the head's copy of the tied shard too (the mistake the function
// avoids) moves the norm by far more and must differ.
#ifdef MINIGRAD_WITH_GLOO

#include <algorithm>
#include <cmath>

#include "catch_compat.h"
#include "multiprocess.h"

#include <minigrad/autograd/grad_mode.h>
#include <minigrad/core/ops.h>
#include <minigrad/models/gpt.h>
#include <minigrad/models/gpt_mesh_clip.h>
#include <minigrad/models/gpt_mesh_pipeline.h>
#include <minigrad/nn/utils/clip_grad.h>
#include <minigrad/parallel/c10d/device_mesh.h>

using namespace mg;
using namespace mg::test;
using models::GPT;

namespace {

double value(const Tensor& t) { return ops::to_dtype(t, DType::Float64).item<double>(); }
double max_abs(const Tensor& t) { return value(ops::abs_max(t)); }

// {relative error of the norm, worst relative error of a clipped gradient, the norm with
// the head's copy counted twice relative to the true one - 1}.
std::vector<float> clip_against_single_device(const parallel::DeviceMesh& mesh, bool sp, bool interleaved) {
  models::GPTConfig c;
  c.block_size = 16;
  c.vocab_size = 18;
  c.n_layer = interleaved ? 4 : 3;
  c.n_head = 2;
  c.n_embd = 10;
  c.dropout = 0.0;
  manual_seed(4321);
  GPT gpt(c);
  const Tensor x = randint(0, c.vocab_size, {5, 8}), y = randint(0, c.vocab_size, {5, 8});
  auto ref = std::static_pointer_cast<GPT>(gpt.clone());
  models::GPTMeshPipelineOptions options;
  options.pipeline.micro_batches = 2;
  options.tensor_parallel.sequence_parallel = sp;
  if (interleaved) {
    options.pipeline.schedule = parallel::Schedule::Interleaved1F1B;
    options.pipeline.model_chunks = 2;
  }
  auto model = models::pipeline_gpt_on_mesh(gpt, mesh, options);
  GPT::loss(ref->forward(x), y).backward();
  model->train_step(model->local_batch(x), model->local_batch(y));
  // The norm of the gradient is about 3 for this GPT: a max_norm of 0.5 clips.
  const double want = value(nn::utils::clip_grad_norm_(ref->parameters(), 0.5));
  // The wrong count: every gradient's square summed over all ranks' parameters but the
  // replicated ones' tp copies, the head's copy included (computed before the clip).
  double head = 0;
  for (const auto& [name, p] : model->named_parameters())
    if (name == "lm_head.weight") head += std::pow(value(nn::utils::get_total_norm({p.grad()})), 2);
  Tensor extra = full({1}, head, DType::Float32);
  mesh.group("pp")->allreduce({extra})->wait();
  mesh.group("tp")->allreduce({extra})->wait();
  const double got = value(models::clip_mesh_grad_norm_(*model, mesh, 0.5));
  const double wrong = std::sqrt(got * got + extra.to_vector<float>()[0]);
  double grad_error = 0;
  NoGradGuard no_grad;
  for (const auto& [name, p] : model->named_parameters()) {
    const Tensor expected = model->shard_of(name, ref->parameter(name == "lm_head.weight" ? "transformer.wte.weight" : name).grad());
    grad_error = std::max(grad_error, max_abs(p.grad() - expected) / std::max(max_abs(expected), 1e-6));
  }
  return {static_cast<float>(std::abs(got - want) / want), static_cast<float>(grad_error),
          static_cast<float>(wrong / want - 1)};
}

}  // namespace

TEST_CASE("clip_mesh_grad_norm_ on dp2 x pp2 x tp2 (8 Gloo ranks, with and without SP, and "
          "interleaved) equals the single-device clip_grad_norm_", "[gpt_4d]") {
  auto results = run_ranks(8, [](RankContext& ctx) {
    parallel::DeviceMesh mesh(ctx.gloo(), {{"dp", 2}, {"pp", 2}, {"tp", 2}});
    ctx.report("plain", clip_against_single_device(mesh, false, false));
    ctx.report("sp", clip_against_single_device(mesh, true, false));
    ctx.report("interleaved", clip_against_single_device(mesh, false, true));
  });
  INFO(describe(results));
  for (const RankResult& r : results)
    for (const char* run : {"plain", "sp", "interleaved"}) {
      INFO("rank " << r.rank << ", " << run);
      const std::vector<float> e = r.floats(run);
      REQUIRE(e[0] <= 1e-5f);
      REQUIRE(e[1] <= 1e-5f);
      REQUIRE(e[2] >= 1e-3f);  // the head's copy counted too would be caught
    }
}

#endif
