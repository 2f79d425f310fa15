// The GPT on all four dimensions: split by its plans over cp and tp (models/gpt_plan.h),
// then cut over pp by its pipeline cut and replicated over dp (parallel::MeshPipeline), on
// Gloo ranks, tp2 x pp2 (4 ranks), dp2 x pp2 (4), dp2 x tp2 x pp2 (8) and dp2 x pp2 x cp2 x
// tp2 (16). Every rank builds the
// GPT with the same seed, keeps a copy as the single-device reference on the whole batch,
// and runs 3 AdamW steps on both: the loss (on every rank), every gradient of the first
// step (each rank's shard against the matching slice of the reference's gradient; the
// head's copy against wte's) and the parameters after the last step must agree.
//
// Float64 (all runs but one): the tp group carries float64 as int64 bits and sums in rank
// order (tensor_parallel/group.cpp), the cp, dp and embedding groups likewise
// (context_parallel/wire.h), the pipeline's messages travel as int64 bits
// (pipeline_stage.h), and AdamW steps float64. Only the order of sums differs, so the
// bounds are test_gpt_mesh.cpp's: loss and gradients to 1e-10 relative, parameters to
// 1e-12 absolute (observed: ~3e-16 and ~2e-15). One float32 run (float32 messages and
// all-reduces) holds test_gpt_mesh.cpp's float32 bounds (1e-5 gradients, 2e-5
// parameters), without biases for the reason test_gpt_context_parallel.cpp gives. The
// tied shard's gradient left unsummed between the first and the last stage
// (Fault::PipelineTiedGradNotSummed) moves things by 1e-3 or more and must fail. Splits
// that cannot be made are refused with an mg::Error on every rank, before any collective.
#ifdef MINIGRAD_WITH_GLOO

#include <algorithm>
#include <cmath>

#include "catch_compat.h"
#include "gpt_split_check.h"
#include "multiprocess.h"

#include <minigrad/autograd/grad_mode.h>
#include <minigrad/core/fault_injection.h>
#include <minigrad/core/ops.h>
#include <minigrad/models/gpt.h>
#include <minigrad/models/gpt_plan.h>
#include <minigrad/nn/optim/adam.h>
#include <minigrad/parallel/c10d/device_mesh.h>
#include <minigrad/parallel/loss_parallel.h>
#include <minigrad/parallel/pipeline/mesh_pipeline.h>
#include <minigrad/parallel/placement.h>
#include <minigrad/parallel/tensor_parallel/group.h>

using namespace mg;
using namespace mg::test;
using models::GPT;
using models::GPTConfig;

namespace {

GPTConfig tiny(int64_t n_layer = 3, bool bias = true) {
  GPTConfig c;
  c.bias = bias;
  c.block_size = 16;
  c.vocab_size = 18;
  c.n_layer = n_layer;
  c.n_head = 2;
  c.n_embd = 10;  // heads of 5
  c.dropout = 0.0;
  return c;
}


struct Run {
  int64_t B = 5, T = 8;
  bool sp = false;
  int64_t micro_batches = 2;
  parallel::Schedule schedule = parallel::Schedule::OneFOneB;
  int model_chunks = 1;
  int64_t n_layer = 3;
  parallel::Checkpoint checkpoint = parallel::Checkpoint::Never;
  DType dtype = DType::Float64;  // float32: without biases (see the header)
};

// This rank's part of `gpt` on the mesh: the plans over cp and tp, then the cut over pp.
std::unique_ptr<parallel::MeshPipeline> split_4d(GPT& gpt, const parallel::DeviceMesh& mesh, const Run& run) {
  models::parallelize_gpt(gpt, mesh, run.sp);
  parallel::MeshPipelineOptions options;
  options.micro_batches = run.micro_batches;
  options.schedule = run.schedule;
  options.checkpoint = run.checkpoint;
  return std::make_unique<parallel::MeshPipeline>(
      gpt, mesh, models::gpt_pipeline_cut(gpt.config(), mesh.size("pp"), run.model_chunks), options);
}

// A micro-batch's share of the whole batch's loss: its targets' summed losses over the
// batch's count of targets (vocabulary- and context-parallel under LossParallel).
parallel::PipeLoss share_of(const parallel::DeviceMesh& mesh, double targets) {
  return [&mesh, targets](const Tensor& out, const Tensor& y) {
    parallel::LossParallel loss_parallel(mesh);
    return mul(GPT::loss(out, y, Reduction::Sum), 1.0 / targets);
  };
}

// The part of the single-device tensor `full` that this rank's parameter `p` holds.
Tensor part_of(const Tensor& p, const Tensor& full) {
  const parallel::ParameterSpec* spec = parallel::spec_of(p);
  return spec ? parallel::local_part(spec->pieces[0], full) : full;
}

// One rank's check: its part of the 4-D model against the single-device GPT on the whole
// batch [B, T]; some targets are -1 (ignored), unevenly over the ranks.
SplitErrors against_single_device(const parallel::DeviceMesh& mesh, const Run& run) {
  const GPTConfig config = tiny(run.n_layer, run.dtype == DType::Float64);
  manual_seed(1234);
  GPT gpt(config);
  gpt.to(run.dtype);
  const Tensor x = randint(0, config.vocab_size, {run.B, run.T});
  std::vector<int64_t> yv = randint(0, config.vocab_size, {run.B, run.T}).to_vector<int64_t>();
  int64_t targets = 0;
  for (size_t i = 2; i < yv.size(); i += 5) yv[i] = -1;
  for (int64_t t : yv) targets += t != -1;
  const Tensor y = from_vector(yv, Shape{run.B, run.T});

  auto ref = std::static_pointer_cast<GPT>(gpt.clone());
  auto model = split_4d(gpt, mesh, run);
  const Tensor x_local = model->local_batch(x), y_local = model->local_batch(y);

  optim::AdamW ref_opt(ref->parameters(), optim::AdamWOptions(1e-3));
  optim::AdamW opt(model->parameters(), optim::AdamWOptions(1e-3));
  // The reference's tensor under a name of the 4-D model (the head's copy is wte).
  const auto reference = [&](const std::string& name) -> const Tensor& {
    return ref->parameter(name == "lm_head.weight" ? "transformer.wte.weight" : name);
  };
  const std::vector<nn::NamedTensor> named = model->named_parameters();
  SplitErrors out;
  for (int step = 0; step < 3; ++step) {
    ref_opt.zero_grad();
    const Tensor ref_loss = GPT::loss(ref->forward(x), y);
    ref_loss.backward();
    model->zero_grad();
    const Tensor loss = model->train_step(x_local, y_local, share_of(mesh, static_cast<double>(targets)));
    out.loss_error = std::max(out.loss_error,
                              std::abs(as_double(loss) - as_double(ref_loss)) / std::abs(as_double(ref_loss)));
    if (step == 0) {
      out.compare_grads(named, [&](const std::string& name) {
        for (const auto& [n, p] : named)
          if (n == name) return part_of(p, reference(name).grad());
        return Tensor();
      });
    }
    ref_opt.step();
    opt.step();
  }
  NoGradGuard no_grad;
  out.compare_params(named, [&](const std::string& name) {
    for (const auto& [n, p] : named)
      if (n == name) return part_of(p, reference(name));
    return Tensor();
  });
  return out;
}

void require_equal(const RankResult& r, const std::string& prefix, float grads = 1e-10f,
                   float params = 1e-12f) {
  INFO("rank " << r.rank << ", " << prefix << ": " << r.text(prefix + " where"));
  const std::vector<float> e = r.floats(prefix + " errors");
  REQUIRE(e[0] <= grads);
  REQUIRE(e[1] <= grads);
  REQUIRE(e[2] <= params);
}

// The fault shows on the first and the last stage (the copies of the tied shard); a
// middle stage's parameters are untouched by it.
void require_caught_somewhere(const std::vector<RankResult>& results, const std::string& prefix) {
  bool caught = false;
  for (const RankResult& r : results) {
    const std::vector<float> e = r.floats(prefix + " errors");
    caught = caught || e[0] >= 1e-3f || e[1] >= 1e-3f || e[2] >= 1e-3f;
  }
  INFO(prefix << ": " << results.front().text(prefix + " where"));
  REQUIRE(caught);
}

// The tp group's collectives in one float32 step of this rank's stage on 5 rows of T = 8
// in 2 micro-batches (3 + 2): all-reduces, all-gathers, reduce-scatters.
std::vector<float> tp_collectives(const parallel::DeviceMesh& mesh, bool sp) {
  manual_seed(7);
  GPT gpt(tiny(3));
  const Tensor x = randint(0, 18, {5, 8}), y = randint(0, 18, {5, 8});
  Run run;
  run.sp = sp;
  auto model = split_4d(gpt, mesh, run);
  const parallel::TensorParallelGroupPtr tp = parallel::tensor_parallel_group(mesh.group("tp"));
  tp->reset_stats();
  model->train_step(model->local_batch(x), model->local_batch(y), share_of(mesh, 40.0));
  const parallel::TensorParallelStats s = tp->stats();
  return {static_cast<float>(s.all_reduces), static_cast<float>(s.all_gathers),
          static_cast<float>(s.reduce_scatters)};
}

template <typename F>
std::string error_of(F&& f) {
  try {
    f();
  } catch (const std::exception& e) {
    return e.what();
  }
  return "";
}

}  // namespace

// No ';' in the test cases' names: CTest's test lists would cut a name there, and the
// pieces would run no test.
TEST_CASE("GPT tp2 x pp2 on 4 Gloo ranks equals the single-device GPT (1F1B, SP, interleaved), "
          "the tied shard's gradient unsummed is caught, each stage's tp collectives counted, "
          "impossible splits refused", "[gpt_4d]") {
  auto results = run_ranks(4, [](RankContext& ctx) {
    parallel::DeviceMesh mesh(ctx.gloo(), {{"pp", 2}, {"tp", 2}});
    // n_layer 3: blocks 2 and 1; 5 rows in 2 micro-batches (3 + 2).
    report_errors(ctx, "tp2pp2", against_single_device(mesh, {}));
    Run sp;
    sp.sp = true;
    sp.micro_batches = 3;
    report_errors(ctx, "tp2pp2 sp", against_single_device(mesh, sp));
    Run interleaved;
    interleaved.schedule = parallel::Schedule::Interleaved1F1B;
    interleaved.model_chunks = 2;
    interleaved.n_layer = 4;
    interleaved.micro_batches = 3;
    report_errors(ctx, "tp2pp2 interleaved", against_single_device(mesh, interleaved));
    {
      testing::FaultGuard fault(testing::Fault::PipelineTiedGradNotSummed);
      report_errors(ctx, "tied fault", against_single_device(mesh, {}));
    }
    ctx.report("collectives", tp_collectives(mesh, false));
    ctx.report("collectives sp", tp_collectives(mesh, true));
    // Refused on every rank alike, before any collective.
    manual_seed(5);
    GPT three(tiny(3));
    Run chunks;
    chunks.schedule = parallel::Schedule::Interleaved1F1B;
    chunks.model_chunks = 2;
    ctx.report("too few blocks", error_of([&] { split_4d(three, mesh, chunks); }));
    GPTConfig odd = tiny(2);
    odd.n_head = 1;
    odd.n_embd = 6;
    GPT one_head(odd);
    ctx.report("heads", error_of([&] { split_4d(one_head, mesh, {}); }));
    ctx.report("world", error_of([&] {
                 parallel::DeviceMesh wrong(ctx.gloo(), {{"dp", 1}, {"pp", 3}, {"tp", 2}});
               }));
  });
  INFO(describe(results));
  for (const RankResult& r : results) {
    REQUIRE(r.ok());
    require_equal(r, "tp2pp2");
    require_equal(r, "tp2pp2 sp");
    require_equal(r, "tp2pp2 interleaved");
    // docs/gpt-tensor-parallel.md's table, cut between the stages, per micro-batch (m = 2):
    // stage 0 (2 blocks) the embedding's all-reduce and 4 per block; stage 1 (1 block) 4
    // per block, the head's in backward and the loss's all-reduce and all-gather. With SP
    // each block's 4 all-gathers and 4 reduce-scatters, the embedding's reduce-scatter
    // (all-gather in backward), the head's all-gather (reduce-scatter in backward), and
    // once per step the replicated parameters' gradient sum.
    const bool first = r.rank / 2 == 0;
    REQUIRE(r.floats("collectives") ==
            (first ? std::vector<float>{2 * 9, 0, 0} : std::vector<float>{2 * 6, 2 * 1, 0}));
    REQUIRE(r.floats("collectives sp") == (first ? std::vector<float>{1, 2 * 9, 2 * 9}
                                                 : std::vector<float>{2 * 1 + 1, 2 * 6, 2 * 5}));
    REQUIRE_THAT(r.text("too few blocks"),
                 MG_CONTAINS("GPT pipeline: 3 blocks (n_layer) cannot fill 2 stages x 2 model "
                             "chunks = 4 virtual stages"));
    REQUIRE_THAT(r.text("heads"),
                 MG_CONTAINS("n_head (attention is split by heads) = 1 is not divisible by the "
                             "tensor-parallel size 2"));
    REQUIRE_THAT(r.text("world"),
                 MG_CONTAINS("DeviceMesh: dp=1 x pp=3 x tp=2 = 6 ranks, but the job has 4"));
  }
  require_caught_somewhere(results, "tied fault");
}

TEST_CASE("GPT dp2 x pp2 on 4 Gloo ranks (uneven batch rows) equals the single-device GPT, "
          "and so does dp2 x pp1 x tp2 (one stage: the head reads wte itself)", "[gpt_4d]") {
  auto results = run_ranks(4, [](RankContext& ctx) {
    parallel::DeviceMesh mesh(ctx.gloo(), {{"dp", 2}, {"pp", 2}, {"tp", 1}});
    report_errors(ctx, "dp2pp2", against_single_device(mesh, {}));  // rows 3 and 2
    parallel::DeviceMesh one_stage(ctx.gloo(), {{"dp", 2}, {"pp", 1}, {"tp", 2}});
    report_errors(ctx, "dp2tp2", against_single_device(one_stage, {}));
    GPT whole(tiny());
    const auto named = split_4d(whole, one_stage, {})->named_parameters();
    ctx.report("head copies",
               std::vector<float>{static_cast<float>(std::count_if(
                   named.begin(), named.end(),
                   [](const nn::NamedTensor& p) { return p.first == "lm_head.weight"; }))});
  });
  INFO(describe(results));
  for (const RankResult& r : results) {
    REQUIRE(r.ok());
    require_equal(r, "dp2pp2");
    require_equal(r, "dp2tp2");
    REQUIRE(r.floats("head copies") == std::vector<float>{0});
  }
}

TEST_CASE("GPT dp2 x tp2 x pp2 on 8 Gloo ranks equals the single-device GPT (with and without "
          "SP), the tied shard's gradient unsummed is caught", "[gpt_4d]") {
  auto results = run_ranks(8, [](RankContext& ctx) {
    parallel::DeviceMesh mesh(ctx.gloo(), {{"dp", 2}, {"pp", 2}, {"tp", 2}});
    report_errors(ctx, "3d", against_single_device(mesh, {}));
    Run sp;
    sp.sp = true;
    sp.micro_batches = 3;  // dp rank 0: 3 rows in 3, dp rank 1: 2 rows in 2
    sp.checkpoint = parallel::Checkpoint::Always;  // the tp collectives run again in backward
    report_errors(ctx, "3d sp", against_single_device(mesh, sp));
    Run f32;
    f32.dtype = DType::Float32;
    report_errors(ctx, "3d f32", against_single_device(mesh, f32));
    testing::FaultGuard fault(testing::Fault::PipelineTiedGradNotSummed);
    report_errors(ctx, "3d fault", against_single_device(mesh, {}));
  });
  INFO(describe(results));
  for (const RankResult& r : results) {
    REQUIRE(r.ok());
    require_equal(r, "3d");
    require_equal(r, "3d sp");
    require_equal(r, "3d f32", 1e-5f, 2e-5f);
  }
  require_caught_somewhere(results, "3d fault");
}

TEST_CASE("GPT dp2 x pp2 x cp2 x tp2 on 16 Gloo ranks equals the single-device GPT (with and "
          "without SP), dropout under cp refused",
          "[gpt_4d]") {
  auto results = run_ranks(16, [](RankContext& ctx) {
    parallel::DeviceMesh mesh(ctx.gloo(), {{"dp", 2}, {"pp", 2}, {"cp", 2}, {"tp", 2}});
    // T = 8: cp chunks of 2; SP cuts the cp-local 4 positions into 2 per tp rank.
    Run run;
    run.n_layer = 2;
    report_errors(ctx, "4d", against_single_device(mesh, run));
    run.sp = true;
    run.micro_batches = 3;
    report_errors(ctx, "4d sp", against_single_device(mesh, run));
    GPTConfig dropping = tiny(2);
    dropping.dropout = 0.1;
    GPT gpt(dropping);
    ctx.report("dropout", error_of([&] { split_4d(gpt, mesh, {}); }));
  });
  INFO(describe(results));
  for (const RankResult& r : results) {
    REQUIRE(r.ok());
    require_equal(r, "4d");
    require_equal(r, "4d sp");
    REQUIRE_THAT(r.text("dropout"),
                 MG_CONTAINS("parallelize_gpt: no dropout under context parallelism (cp = 2)"));
  }
}

#endif  // MINIGRAD_WITH_GLOO
