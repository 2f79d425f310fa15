// The GPT's pipeline, cut by module name (parallel/pipeline/split_module.h with the cut of
// models/gpt_plan.h) and run by PipelineStage, over 1, 2 and 3 Gloo ranks, with 1F1B and
// with interleaved 1F1B (2 model chunks per rank): the loss (on every rank), every
// parameter's gradient and the parameters after 3 AdamW steps equal the single-device GPT's
// on the whole batch, for fewer, as many and more micro-batches than stages, rows not
// divisible by the micro-batches, in float32 and in float64 (the pipeline carries float64
// activations as int64 bits; the tied sum adds float64 in rank order). The tied copies carry
// their placement (the last stage's lm_head.weight is wte's copy), their gradient is summed
// by reduce_partial_gradients; the tied gradient left unsummed and a micro-batch's loss counted
// twice (test-only faults, core/fault_injection.h) fail the comparison; a cut with fewer
// blocks than virtual stages, and interleaving on one rank, are refused.
//
// Each rank runs the single-device GPT itself (the same seed, the whole batch) beside its
// stage and compares what it holds, so nothing is lost to the float reports.
#ifdef MINIGRAD_WITH_GLOO

#include <algorithm>
#include <cmath>
#include <map>

#include <fmt/format.h>

#include "catch_compat.h"
#include "multiprocess.h"

#include <minigrad/autograd/functions.h>
#include <minigrad/autograd/grad_mode.h>
#include <minigrad/core/fault_injection.h>
#include <minigrad/core/generator.h>
#include <minigrad/core/ops.h>
#include <minigrad/models/gpt_plan.h>
#include <minigrad/nn/optim/adam.h>
#include <minigrad/parallel/c10d/device_mesh.h>
#include <minigrad/parallel/loss_parallel.h>
#include <minigrad/parallel/partial_gradients.h>
#include <minigrad/parallel/pipeline/pipeline_stage.h>
#include <minigrad/parallel/pipeline/split_module.h>
#include <minigrad/parallel/placement.h>

using namespace mg;
using namespace mg::models;
using namespace mg::parallel;
using namespace mg::test;

namespace {

constexpr int64_t kT = 7;  // tokens per row (block_size 8)
constexpr int kSteps = 3;
// float32, different summation orders: micro-batches' gradients added one after another
// instead of in one matmul, the tied gradient as two partial sums, and from step 1 on
// parameters that differ by that rounding. Rounding scales with a tensor's terms, not with
// its smallest elements, so the loss and each gradient are compared normwise: the largest
// difference over the tensor's largest magnitude, below kTolerance (observed: up to 1.3e-6).
// float64: the same comparisons below kTolerance64 (observed: up to 1.8e-15).
constexpr double kTolerance = 1e-4;
constexpr double kTolerance64 = 1e-12;
// The parameters after AdamW steps: differences in units of one step (lr), below
// kStepTolerance, a hundredth of a step, scaled to the loss's bound. AdamW divides each
// gradient by its own running size (g / (|g| + eps) in the first step), which magnifies
// the rounding of a gradient element near eps by up to lr / (4 eps) times its error;
// observed in float32: up to 1.4e-3 of a step (lr 1e-3, nanoGPT's eps 1e-8). A missing sum
// or a doubled micro-batch moves parameters by a good part of one. Except the key's bias,
// c_attn.bias[C, 2C): the softmax cancels q . b_k, so its gradient is exactly zero and
// both sides hold rounding noise, which AdamW turns into steps of any size up to lr; those
// elements are only checked to be within the steps taken (their gradients are checked).
constexpr double kLr = 1e-3;
constexpr double kStepTolerance = 1e-2;
// float64: the same magnification of a rounding 1e9 times smaller.
constexpr double kStepTolerance64 = 1e-9;

GPTConfig config_of(int64_t n_layer) {
  GPTConfig c;
  c.block_size = 8;
  c.vocab_size = 24;
  c.n_layer = n_layer;
  c.n_head = 2;
  c.n_embd = 16;
  c.dropout = 0.0;
  return c;
}

struct Case {
  int world;
  int64_t micro_batches;  // asked for; rows 5 or 7 cut with chunk's rule
  int64_t rows;
  Schedule schedule = Schedule::OneFOneB;
  int model_chunks = 1;
  int64_t n_layer = 4;
  Checkpoint checkpoint = Checkpoint::Never;
  DType dtype = DType::Float32;
  std::string str() const {
    return fmt::format("pp={} v={} chunks={} rows={} {} n_layer={} checkpoint {} {}", world, model_chunks,
                       micro_batches, rows, schedule_name(schedule), n_layer, checkpoint_name(checkpoint),
                       dtype_name(dtype));
  }
  double tolerance() const { return dtype == DType::Float64 ? kTolerance64 : kTolerance; }
  double step_tolerance() const { return dtype == DType::Float64 ? kStepTolerance64 : kStepTolerance; }
};

optim::AdamWOptions adamw() {
  return optim::AdamWOptions(kLr).betas({0.9, 0.95}).eps(1e-8).weight_decay(0.1);
}

// The GPT of the test's seed, in the case's dtype (Module::to keeps the tie).
std::shared_ptr<GPT> make_gpt(const Case& c) {
  manual_seed(11);
  auto model = std::make_shared<GPT>(config_of(c.n_layer));
  model->to(c.dtype);  // the tie kept
  return model;
}

// Every rank: its stages beside the whole GPT, kSteps steps; reports the largest error
// (in units of the case's tolerance), where it was, its losses, the names of its
// parameters and the placements its parameters carry.
std::vector<RankResult> run_case(const Case& c) {
  return run_ranks(c.world, [&](RankContext& ctx) {
    const GPTConfig config = config_of(c.n_layer);
    const auto pp = ctx.gloo();
    const std::vector<nn::ModulePtr> chunks =
        split_module(*make_gpt(c), models::gpt_pipeline_cut(config, c.world, c.model_chunks), pp);
    PipelineStageOptions options;
    options.chunks = c.micro_batches;
    options.schedule = c.schedule;
    options.checkpoint = c.checkpoint;
    PipelineStage stage(chunks, pp, options);
    const std::vector<nn::NamedTensor> named = chunk_parameters(chunks);
    const std::vector<Tensor> params = chunk_parameter_tensors(chunks);
    const std::shared_ptr<GPT> plain_model = make_gpt(c);
    GPT& plain = *plain_model;
    std::map<std::string, Tensor> reference;
    for (auto& [name, p] : plain.named_parameters()) reference[name] = p;
    reference["lm_head.weight"] = plain.wte_weight();  // the copy is the tied weight

    optim::AdamW opt(optim::weight_decay_groups(params, adamw()));
    optim::AdamW plain_opt(optim::weight_decay_groups(plain.parameters(), adamw()));
    const double tolerance = c.tolerance();
    double worst = 0.0;
    std::string where = "nowhere";
    auto note = [&](double e, const std::string& what, size_t i, double got, double want) {
      if (!(e <= worst)) {  // NaN lands here too
        worst = std::isnan(e) ? 1e30 : e;
        where = fmt::format("{} [{}]: {} here, {} on one device", what, i, got, want);
      }
    };
    auto values = [](const Tensor& t, const std::string& what) {
      MG_CHECK(t.defined(), "{}: undefined", what);
      return ops::to_dtype(t.contiguous(), DType::Float64).to_vector<double>();
    };
    // The loss and gradients: normwise (see kTolerance), in units of the tolerance.
    auto compare = [&](const Tensor& got, const Tensor& want, const std::string& what) {
      MG_CHECK(got.defined() && want.defined() && got.numel() == want.numel() && got.dtype() == want.dtype(),
               "{}: {} against {}", what, got.defined() ? got.shape().str() : "undefined",
               want.defined() ? want.shape().str() : "undefined");
      const std::vector<double> a = values(got, what), b = values(want, what);
      double scale = 1e-30;
      for (double x : b) scale = std::max(scale, std::fabs(x));
      for (size_t i = 0; i < a.size(); ++i) note(std::fabs(a[i] - b[i]) / scale / tolerance, what, i, a[i], b[i]);
    };
    // Parameters: in steps, scaled to share the one bound (see kStepTolerance).
    auto compare_parameter = [&](const std::string& name, const Tensor& got, const Tensor& want,
                                 int steps, const std::string& what) {
      const std::vector<double> a = values(got, what), b = values(want, what);
      MG_CHECK(a.size() == b.size(), "{}: {} values against {}", what, a.size(), b.size());
      const bool c_attn_bias = name.find("attn.c_attn.bias") != std::string::npos;
      for (size_t i = 0; i < a.size(); ++i) {
        const double in_steps = std::fabs(a[i] - b[i]) / kLr;
        const bool key_bias = c_attn_bias && static_cast<int64_t>(i) >= config.n_embd &&
                              static_cast<int64_t>(i) < 2 * config.n_embd;
        note(key_bias ? (in_steps <= 1.1 * steps ? 0.0 : 1e30) : in_steps / c.step_tolerance(),
             what, i, a[i], b[i]);
      }
    };
    std::vector<float> losses;
    const bool first = ctx.rank == 0, last = ctx.rank + 1 == c.world;
    for (int step = 0; step < kSteps; ++step) {
      manual_seed(300 + static_cast<uint64_t>(step));
      const Tensor idx = randint(0, config.vocab_size, {c.rows, kT});
      const Tensor targets = randint(0, config.vocab_size, {c.rows, kT});
      for (const nn::ModulePtr& chunk : chunks) chunk->zero_grad();
      Tensor loss = stage.train_step(first ? idx : Tensor(), last ? targets : Tensor(),
                                     [](const Tensor& logits, const Tensor& y) { return GPT::loss(logits, y); });
      reduce_partial_gradients(params);
      loss = stage.loss_on_every_rank(loss);
      plain.zero_grad();
      const Tensor plain_loss = GPT::loss(plain.forward(idx), targets);
      plain_loss.backward();
      compare(loss, plain_loss, fmt::format("loss at step {}", step));
      losses.push_back(static_cast<float>(values(loss, "loss")[0]));
      for (auto& [name, p] : named)
        compare(p.grad(), reference.at(name).grad(), fmt::format("grad of {} at step {}", name, step));
      opt.step();
      plain_opt.step();
      for (auto& [name, p] : named)
        compare_parameter(name, p, reference.at(name), step + 1, fmt::format("{} after step {}", name, step));
    }
    std::string names, placements;
    for (auto& [name, p] : named) {
      names += name + " ";
      if (const ParameterSpec* spec = spec_of(p)) placements += name + ": " + spec->pieces[0].str() + "; ";
    }
    // The rank ran its schedule's list, in order, and held what the schedule says.
    const int64_t m = MicroBatches(c.rows, c.micro_batches, "test").count();
    std::vector<Action> ran;
    for (const PipeSpan& span : stage.last_timeline().spans) ran.push_back({span.pass, span.micro_batch, span.chunk});
    MG_CHECK(ran == rank_actions(c.schedule, ctx.rank, c.world, c.model_chunks, m), "rank {} ran {}, not its list {}",
             ctx.rank, actions_str(ran), actions_str(rank_actions(c.schedule, ctx.rank, c.world, c.model_chunks, m)));
    MG_CHECK(stage.last_max_stashed() == max_in_flight(c.schedule, ctx.rank, c.world, m, c.model_chunks),
             "rank {} held {} micro-batch-chunks at once, its schedule says {}", ctx.rank, stage.last_max_stashed(),
             max_in_flight(c.schedule, ctx.rank, c.world, m, c.model_chunks));
    ctx.report("worst", std::vector<float>{static_cast<float>(worst)});
    ctx.report("where", where);
    ctx.report("losses", losses);
    ctx.report("names", names);
    ctx.report("placements", placements);
  });
}

// Runs a case; returns the largest error over the ranks in units of the case's tolerance
// (and checks what holds whatever the error: every rank ran, the loss is the same on every
// rank, every parameter of the GPT is on exactly one rank, the head's copy on the last, the
// two copies placed on a tie group of the first and the last rank).
double largest_error(const Case& c, std::string& where) {
  const auto results = run_case(c);
  INFO(c.str());
  INFO(describe(results));
  for (const RankResult& r : results) REQUIRE(r.ok());
  double worst = 0.0;
  std::string all_names;
  for (const RankResult& r : results) {
    REQUIRE(r.floats("losses") == results.back().floats("losses"));
    all_names += r.text("names");
    if (r.floats("worst")[0] >= worst) {
      worst = r.floats("worst")[0];
      where = fmt::format("rank {}: {}", r.rank, r.text("where"));
    }
  }
  GPT plain(config_of(c.n_layer));
  std::string expected;
  for (auto& [name, p] : plain.named_parameters()) {
    REQUIRE(all_names.find(name + " ") != std::string::npos);
    expected += name + " ";
  }
  const std::string shape = fmt::format("[{}, {}]", config_of(c.n_layer).vocab_size, config_of(c.n_layer).n_embd);
  if (c.world > 1) {
    REQUIRE(results.back().text("names").find("lm_head.weight ") != std::string::npos);
    expected += "lm_head.weight ";
    // Both copies name the single-device parameter; the clip counts rank 0's.
    const std::string placed = "transformer.wte.weight " + shape + ", tied: Replicate(), gradient Partial";
    CHECK(results.front().text("placements") == "transformer.wte.weight: " + placed + " (rank 0 of 2); ");
    CHECK(results.back().text("placements") == "lm_head.weight: " + placed + " (rank 1 of 2); ");
    for (size_t r = 1; r + 1 < results.size(); ++r) CHECK(results[r].text("placements").empty());
  } else {
    CHECK(results.front().text("placements").empty());  // one stage: the tie is the one tensor
  }
  REQUIRE(all_names.size() == expected.size());
  return worst;
}

void require_equal_to_one_device(const Case& c) {
  std::string where;
  const double worst = largest_error(c, where);
  INFO(c.str() << ": largest error " << worst << " x " << c.tolerance() << " at " << where);
  REQUIRE(worst < 1.0);
}

}  // namespace

TEST_CASE("GPT pipeline, 1F1B over 2 ranks: fewer, as many and more micro-batches than stages", "[gpt_pp]") {
  require_equal_to_one_device({2, 1, 5});  // one micro-batch of 5 rows
  require_equal_to_one_device({2, 2, 5});  // 3 + 2 rows
  require_equal_to_one_device({2, 3, 5});  // 2 + 2 + 1 rows
}

TEST_CASE("GPT pipeline, 1F1B over 3 ranks (blocks 2, 1, 1): fewer, as many and more micro-batches", "[gpt_pp]") {
  require_equal_to_one_device({3, 2, 5});  // 3 + 2
  require_equal_to_one_device({3, 3, 7});  // 3 + 3 + 1
  require_equal_to_one_device({3, 4, 7});  // 2 + 2 + 2 + 1
}

TEST_CASE("GPT pipeline, interleaved 1F1B, 2 model chunks per rank", "[gpt_pp]") {
  const Schedule interleaved = Schedule::Interleaved1F1B;
  require_equal_to_one_device({2, 1, 5, interleaved, 2, 4});
  require_equal_to_one_device({2, 2, 5, interleaved, 2, 4});
  require_equal_to_one_device({2, 3, 5, interleaved, 2, 5});  // blocks 2, 1, 1, 1
  require_equal_to_one_device({3, 4, 7, interleaved, 2, 6});
  // Checkpointed micro-batches run their forward again in backward: the same numbers.
  require_equal_to_one_device({2, 3, 5, interleaved, 2, 4, Checkpoint::Always});
}

TEST_CASE("GPT pipeline in float64: 1F1B over 2 and 3 ranks, interleaved over 2 and 3", "[gpt_pp]") {
  const Schedule interleaved = Schedule::Interleaved1F1B;
  require_equal_to_one_device({2, 3, 5, Schedule::OneFOneB, 1, 4, Checkpoint::Never, DType::Float64});
  require_equal_to_one_device({3, 4, 7, Schedule::OneFOneB, 1, 4, Checkpoint::Never, DType::Float64});
  require_equal_to_one_device({2, 3, 5, interleaved, 2, 5, Checkpoint::Never, DType::Float64});
  require_equal_to_one_device({3, 4, 7, interleaved, 2, 6, Checkpoint::Never, DType::Float64});
}

TEST_CASE("GPT pipeline: one rank holds the whole GPT, its head the embedding itself", "[gpt_pp]") {
  require_equal_to_one_device({1, 2, 5});
}

TEST_CASE("GPT pipeline: the tied gradient unsummed, or a micro-batch's loss counted twice, fails", "[gpt_pp]") {
  std::string where;
  {
    mg::testing::FaultGuard fault(mg::testing::Fault::PipelineTiedGradNotSummed);
    const double worst = largest_error({2, 2, 5}, where);
    INFO("tied gradient unsummed: largest error " << worst << " x " << kTolerance << " at " << where);
    CHECK(worst > 100);
    const double worst64 =
        largest_error({3, 4, 7, Schedule::Interleaved1F1B, 2, 6, Checkpoint::Never, DType::Float64}, where);
    INFO("tied gradient unsummed, float64: largest error " << worst64 << " x " << kTolerance64 << " at " << where);
    CHECK(worst64 > 1e6);
  }
  {
    mg::testing::FaultGuard fault(mg::testing::Fault::PipelineMicroBatchCountedTwice);
    const double worst = largest_error({2, 3, 5, Schedule::Interleaved1F1B, 2, 4}, where);
    INFO("a micro-batch counted twice: largest error " << worst << " x " << kTolerance << " at " << where);
    CHECK(worst > 100);
  }
}

TEST_CASE("GPT pipeline: fewer blocks than stages x model chunks, or interleaving on one rank, is refused",
          "[gpt_pp]") {
  REQUIRE_THROWS_WITH(models::gpt_pipeline_cut(config_of(4), 3, 2),
                      MG_CONTAINS("GPT pipeline: 4 blocks (n_layer) cannot fill 3 stages x 2 "
                                  "model chunks = 6 virtual stages; every virtual stage needs at "
                                  "least one block"));
  REQUIRE(models::gpt_pipeline_cut(config_of(5), 2, 2).split_points ==
          std::vector<std::string>{"transformer.h.2", "transformer.h.3", "transformer.h.4"});
  // Two chunks per rank need the interleaved schedule, and a second rank.
  for (int world : {1, 2}) {
    const auto results = run_ranks(world, [](RankContext& ctx) {
      manual_seed(1);
      GPT gpt(config_of(4));
      const auto pp = ctx.gloo(std::chrono::seconds(5));
      PipelineStageOptions options;  // GPipe
      if (pp->size() == 1) options.schedule = Schedule::Interleaved1F1B;
      PipelineStage stage(split_module(gpt, models::gpt_pipeline_cut(gpt.config(), pp->size(), 2), pp), pp, options);
    });
    for (const RankResult& r : results)
      REQUIRE_THAT(r.error, MG_CONTAINS(world == 1 ? "PipelineStage: 2 model chunks on one rank; interleaving needs "
                                                     "at least two ranks"
                                                   : "PipelineStage: 2 model chunks on a rank need the "
                                                     "interleaved schedule, not gpipe"));
  }
}

// A model a plan has split first is cut the same way: the GPT split by its tensor-parallel
// plan over tp (with and without sequence parallelism), then cut over pp, on a pp2 x tp2
// mesh. Each stage keeps the plan's swapped layers, hooks and placements; the tied head's
// copy adds its tie to its tp placement; the loss is vocabulary-parallel (LossParallel on
// the last stage); reduce_partial_gradients sums the tied copies and, with SP, the
// replicated parameters over tp. float64: the loss, every gradient (each rank's part of
// the single-device one, as its placements say) and the parameters after 3 AdamW steps.
TEST_CASE("GPT pipeline of the GPT its tensor-parallel plan split first (pp2 x tp2, with and without SP) "
          "equals the single device in float64", "[gpt_pp]") {
  const auto results = run_ranks(4, [](RankContext& ctx) {
    const parallel::DeviceMesh mesh(ctx.gloo(), {{"pp", 2}, {"tp", 2}});
    const auto pp = mesh.group("pp");
    const bool first = mesh.rank("pp") == 0, last = mesh.rank("pp") == 1;
    for (bool sp : {false, true}) {
      Case c{2, 3, 5, Schedule::OneFOneB, 1, 4, Checkpoint::Never, DType::Float64};
      const std::shared_ptr<GPT> gpt = make_gpt(c), reference = make_gpt(c);
      models::parallelize_gpt(*gpt, mesh, sp);
      const std::vector<nn::ModulePtr> chunks = split_module(*gpt, models::gpt_pipeline_cut(gpt->config(), 2), pp);
      PipelineStageOptions options;
      options.chunks = c.micro_batches;
      PipelineStage stage(chunks, pp, options);
      const std::vector<Tensor> params = chunk_parameter_tensors(chunks);
      optim::AdamW opt(params, optim::AdamWOptions(1e-3));
      optim::AdamW ref_opt(reference->parameters(), optim::AdamWOptions(1e-3));
      const auto part_of = [](const Tensor& p, const Tensor& full) {
        const ParameterSpec* spec = spec_of(p);
        return spec ? local_part(spec->pieces[0], full) : full;
      };
      const auto relative = [](const Tensor& got, const Tensor& want) {
        const double scale = std::max(ops::to_dtype(ops::abs_max(want), DType::Float64).item<double>(), 1e-30);
        return ops::to_dtype(ops::abs_max(got - want), DType::Float64).item<double>() / scale;
      };
      double loss_error = 0, grad_error = 0, param_error = 0;
      std::string worst = "nothing";
      for (int step = 0; step < kSteps; ++step) {
        manual_seed(300 + static_cast<uint64_t>(step));
        // T = 8: sequence parallelism cuts the positions over tp.
        const Tensor idx = randint(0, gpt->config().vocab_size, {c.rows, 8});
        const Tensor targets = randint(0, gpt->config().vocab_size, {c.rows, 8});
        for (const nn::ModulePtr& chunk : chunks) chunk->zero_grad();
        const Tensor loss = stage.train_step(first ? idx : Tensor(), last ? targets : Tensor(),
                                             [&mesh](const Tensor& logits, const Tensor& y) {
                                               parallel::LossParallel loss_parallel(mesh);  // logits [.., V/tp]
                                               return GPT::loss(logits, y);
                                             });
        reduce_partial_gradients(params);
        const Tensor every = stage.loss_on_every_rank(loss);
        reference->zero_grad();
        const Tensor ref_loss = GPT::loss(reference->forward(idx), targets);
        ref_loss.backward();
        loss_error = std::max(loss_error, relative(every, ref_loss));
        for (const auto& [name, p] : chunk_parameters(chunks)) {
          const double e = relative(p.grad(), part_of(p, reference->parameter(name).grad()));
          if (e >= grad_error) {
            grad_error = e;
            worst = fmt::format("grad of {} at step {}", name, step);
          }
        }
        opt.step();
        ref_opt.step();
      }
      NoGradGuard no_grad;
      for (const auto& [name, p] : chunk_parameters(chunks))
        param_error = std::max(
            param_error, ops::to_dtype(ops::abs_max(p - part_of(p, reference->parameter(name))), DType::Float64)
                             .item<double>());
      std::string placements;
      for (const auto& [name, p] : chunk_parameters(chunks))
        if (name == "transformer.wte.weight" || name == "lm_head.weight")
          placements += name + ": " + spec_of(p)->pieces[0].str();
      const std::string prefix = sp ? "sp " : "";
      ctx.report(prefix + "errors", std::vector<float>{static_cast<float>(loss_error), static_cast<float>(grad_error),
                                                       static_cast<float>(param_error)});
      ctx.report(prefix + "worst", fmt::format("loss {:.1e}, gradients {:.1e} (worst: {}), parameters {:.1e}",
                                               loss_error, grad_error, worst, param_error));
      ctx.report(prefix + "tie", placements);
    }
  });
  INFO(describe(results));
  for (const RankResult& r : results) {
    REQUIRE(r.ok());
    for (const std::string prefix : {"", "sp "}) {
      INFO("rank " << r.rank << ", " << prefix << r.text(prefix + "worst"));
      const std::vector<float> e = r.floats(prefix + "errors");
      CHECK(e[0] < 1e-10);
      CHECK(e[1] < 1e-10);
      CHECK(e[2] < 1e-12);
      // rank = pp_rank 2 + tp_rank: the tied copies on pp rank 0 (wte) and 1 (the head's),
      // each tp rank's vocabulary rows, then the tie over the two stages.
      const int tp_rank = r.rank % 2, pp_rank = r.rank / 2;
      CHECK(r.text(prefix + "tie") ==
            fmt::format("{}: transformer.wte.weight [24, 16], tp: Shard(0) (rank {} of 2), tied: Replicate(), "
                        "gradient Partial (rank {} of 2)",
                        pp_rank == 0 ? "transformer.wte.weight" : "lm_head.weight", tp_rank, pp_rank));
    }
  }
}

#endif  // MINIGRAD_WITH_GLOO
