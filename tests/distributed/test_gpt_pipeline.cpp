// The GPT's pipeline (models/gpt_pipeline.h) over 2 and 3 Gloo ranks, with 1F1B and with
// interleaved 1F1B (2 model chunks per rank): the loss (on every rank), every parameter's
// gradient and the parameters after 3 AdamW steps equal the single-device GPT's on the
// whole batch, for fewer, as many and more micro-batches than stages, rows not divisible
// by the micro-batches. The tied gradient left unsummed and a micro-batch's loss counted
// twice (test-only faults, core/fault_injection.h) fail the comparison; a split with
// fewer blocks than virtual stages is refused. In float64 (Gloo carries it) the pipeline
// equals the float64 single-device GPT to ~1e-12.
//
// Each rank runs the single-device GPT itself (the same seed, the whole batch) beside its
// stage and compares what it holds, so nothing is lost to the float reports.
#ifdef MINIGRAD_WITH_GLOO

#include <algorithm>
#include <cmath>
#include <map>

#include <fmt/format.h>

#include "catch_compat.h"
#include "gpt_split_check.h"  // as_double, max_abs
#include "multiprocess.h"

#include <minigrad/autograd/functions.h>
#include <minigrad/core/fault_injection.h>
#include <minigrad/core/generator.h>
#include <minigrad/models/gpt_pipeline.h>
#include <minigrad/nn/optim/adam.h>

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
// difference over the tensor's largest magnitude, below kTolerance (observed: up to 1.2e-6).
constexpr double kTolerance = 1e-4;
// The parameters after AdamW steps: differences in units of one step (lr), below
// kStepTolerance, a hundredth of a step. AdamW divides each gradient by its own running
// size (g / (|g| + eps) in the first step), which magnifies the rounding of a gradient
// element near eps by up to lr / (4 eps) times its error; observed: up to 1.4e-3 of a
// step (lr 1e-3, nanoGPT's eps 1e-8). A missing sum or a doubled micro-batch moves
// parameters by a good part of one. Except the key's bias,
// c_attn.bias[C, 2C): the softmax cancels q . b_k, so its gradient is exactly zero and
// both sides hold rounding noise, which AdamW turns into steps of any size up to lr; those
// elements are only checked to be within the steps taken (their gradients are checked).
constexpr double kLr = 1e-3;
constexpr double kStepTolerance = 1e-2;

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
  std::string str() const {
    return fmt::format("pp={} v={} chunks={} rows={} {} n_layer={} checkpoint {}", world,
                       model_chunks, micro_batches, rows, schedule_name(schedule), n_layer,
                       checkpoint_name(checkpoint));
  }
};

optim::AdamWOptions adamw() {
  return optim::AdamWOptions(kLr).betas({0.9, 0.95}).eps(1e-8).weight_decay(0.1);
}

// Every rank: its stage beside the whole GPT, kSteps steps; reports the largest error,
// where it was, its losses and the names of its parameters.
std::vector<RankResult> run_case(const Case& c) {
  return run_ranks(c.world, [&](RankContext& ctx) {
    const GPTConfig config = config_of(c.n_layer);
    manual_seed(11);
    GPT model(config);
    GPTPipelineOptions options;
    options.micro_batches = c.micro_batches;
    options.schedule = c.schedule;
    options.model_chunks = c.model_chunks;
    options.checkpoint = c.checkpoint;
    GPTPipeline pipe(model, ctx.gloo(), options);
    manual_seed(11);
    GPT plain(config);
    std::map<std::string, Tensor> reference;
    for (auto& [name, p] : plain.named_parameters()) reference[name] = p;
    reference["lm_head.weight"] = plain.wte_weight();  // the copy is the tied weight

    optim::AdamW opt(optim::weight_decay_groups(pipe.parameters(), adamw()));
    optim::AdamW plain_opt(optim::weight_decay_groups(plain.parameters(), adamw()));
    double worst = 0.0;
    std::string where = "nowhere";
    auto note = [&](double e, const std::string& what, size_t i, float got, float want) {
      if (!(e <= worst)) {  // NaN lands here too
        worst = std::isnan(e) ? 1e30 : e;
        where = fmt::format("{} [{}]: {} here, {} on one device", what, i, got, want);
      }
    };
    auto values = [](const Tensor& t, const std::string& what) {
      MG_CHECK(t.defined(), "{}: undefined", what);
      return t.contiguous().to_vector<float>();
    };
    // The loss and gradients: normwise (see kTolerance).
    auto compare = [&](const Tensor& got, const Tensor& want, const std::string& what) {
      MG_CHECK(got.defined() && want.defined() && got.numel() == want.numel(),
               "{}: {} against {}", what, got.defined() ? got.shape().str() : "undefined",
               want.defined() ? want.shape().str() : "undefined");
      const std::vector<float> a = values(got, what), b = values(want, what);
      double scale = 1e-30;
      for (float x : b) scale = std::max(scale, static_cast<double>(std::fabs(x)));
      for (size_t i = 0; i < a.size(); ++i) note(std::fabs(a[i] - b[i]) / scale, what, i, a[i], b[i]);
    };
    // Parameters: in steps, scaled to kTolerance to share the one bound (see kStepTolerance).
    auto compare_parameter = [&](const std::string& name, const Tensor& got, const Tensor& want,
                                 int steps, const std::string& what) {
      const std::vector<float> a = values(got, what), b = values(want, what);
      MG_CHECK(a.size() == b.size(), "{}: {} values against {}", what, a.size(), b.size());
      const bool c_attn_bias = name.find("attn.c_attn.bias") != std::string::npos;
      for (size_t i = 0; i < a.size(); ++i) {
        const double in_steps = std::fabs(a[i] - b[i]) / kLr;
        const bool key_bias = c_attn_bias && static_cast<int64_t>(i) >= config.n_embd &&
                              static_cast<int64_t>(i) < 2 * config.n_embd;
        note(key_bias ? (in_steps <= 1.1 * steps ? 0.0 : 1.0) : in_steps / kStepTolerance * kTolerance,
             what, i, a[i], b[i]);
      }
    };
    std::vector<float> losses;
    for (int step = 0; step < kSteps; ++step) {
      manual_seed(300 + static_cast<uint64_t>(step));
      const Tensor idx = randint(0, config.vocab_size, {c.rows, kT});
      const Tensor targets = randint(0, config.vocab_size, {c.rows, kT});
      pipe.zero_grad();
      const Tensor loss = pipe.train_step(idx, targets);
      plain.zero_grad();
      const Tensor plain_loss = GPT::loss(plain.forward(idx), targets);
      plain_loss.backward();
      compare(loss, plain_loss, fmt::format("loss at step {}", step));
      losses.push_back(loss.item<float>());
      for (auto& [name, p] : pipe.named_parameters())
        compare(p.grad(), reference.at(name).grad(), fmt::format("grad of {} at step {}", name, step));
      opt.step();
      plain_opt.step();
      for (auto& [name, p] : pipe.named_parameters())
        compare_parameter(name, p, reference.at(name), step + 1,
                          fmt::format("{} after step {}", name, step));
    }
    std::string names;
    for (auto& [name, p] : pipe.named_parameters()) names += name + " ";
    // The rank ran its schedule's list, in order, and held what the schedule says.
    const int64_t m = MicroBatches(c.rows, c.micro_batches, "test").count();
    std::vector<Action> ran;
    for (const PipeSpan& span : pipe.stage().last_timeline().spans)
      ran.push_back({span.pass, span.micro_batch, span.chunk});
    MG_CHECK(ran == rank_actions(c.schedule, ctx.rank, c.world, c.model_chunks, m),
             "rank {} ran {}, not its list {}", ctx.rank, actions_str(ran),
             actions_str(rank_actions(c.schedule, ctx.rank, c.world, c.model_chunks, m)));
    MG_CHECK(pipe.stage().last_max_stashed() ==
                 max_in_flight(c.schedule, ctx.rank, c.world, m, c.model_chunks),
             "rank {} held {} micro-batch-chunks at once, its schedule says {}", ctx.rank,
             pipe.stage().last_max_stashed(),
             max_in_flight(c.schedule, ctx.rank, c.world, m, c.model_chunks));
    ctx.report("worst", std::vector<float>{static_cast<float>(worst)});
    ctx.report("where", where);
    ctx.report("losses", losses);
    ctx.report("names", names);
  });
}

// Runs a case; returns the largest error over the ranks (and checks what holds whatever
// the error: every rank ran, the loss is the same on every rank, every parameter of the
// GPT is on exactly one rank, the head's copy on the last).
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
  if (c.world > 1) {
    REQUIRE(results.back().text("names").find("lm_head.weight ") != std::string::npos);
    expected += "lm_head.weight ";
  }
  REQUIRE(all_names.size() == expected.size());
  return worst;
}

void require_equal_to_one_device(const Case& c) {
  std::string where;
  const double worst = largest_error(c, where);
  INFO(c.str() << ": largest error " << worst << " at " << where);
  REQUIRE(worst < kTolerance);
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

TEST_CASE("GPT pipeline: one rank holds the whole GPT, its head the embedding itself", "[gpt_pp]") {
  require_equal_to_one_device({1, 2, 5});
}

TEST_CASE("GPT pipeline: the tied gradient unsummed, or a micro-batch's loss counted twice, fails", "[gpt_pp]") {
  std::string where;
  {
    mg::testing::FaultGuard fault(mg::testing::Fault::PipelineTiedGradNotSummed);
    const double worst = largest_error({2, 2, 5}, where);
    INFO("tied gradient unsummed: largest error " << worst << " at " << where);
    CHECK(worst > 100 * kTolerance);
  }
  {
    mg::testing::FaultGuard fault(mg::testing::Fault::PipelineMicroBatchCountedTwice);
    const double worst = largest_error({2, 3, 5, Schedule::Interleaved1F1B, 2, 4}, where);
    INFO("a micro-batch counted twice: largest error " << worst << " at " << where);
    CHECK(worst > 100 * kTolerance);
  }
}

// float64: the pipeline (its activations, the tied gradient's all-reduce, the loss's
// broadcast) against the single-device GPT, both converted with Module::to. The only
// differences are summation orders, ~1e-16 relative per sum; AdamW's division by a
// gradient's own size magnifies an element's absolute error by up to lr / (4 eps) = 2.5e4
// (see kStepTolerance), so the parameters are held to 1e-11 absolute, the loss and
// gradients to 1e-12 normwise (observed: loss 2.8e-16, gradients 1.4e-15, parameters
// 6.0e-16 after 3 steps).
TEST_CASE("GPT pipeline in float64 over 2 Gloo ranks equals the float64 single-device GPT", "[gpt_pp]") {
  for (const int chunks : {1, 2}) {
    DYNAMIC_SECTION((chunks == 1 ? "1F1B" : "interleaved 1F1B, 2 chunks per rank")) {
      const auto results = run_ranks(2, [&](RankContext& ctx) {
        const GPTConfig config = config_of(4);
        manual_seed(11);
        GPT model(config);
        model.to(DType::Float64);
        GPTPipelineOptions options;
        options.micro_batches = 2;
        options.model_chunks = chunks;
        options.schedule = chunks == 1 ? Schedule::OneFOneB : Schedule::Interleaved1F1B;
        GPTPipeline pipe(model, ctx.gloo(), options);
        manual_seed(11);
        GPT plain(config);
        plain.to(DType::Float64);
        std::map<std::string, Tensor> reference;
        for (auto& [name, p] : plain.named_parameters()) reference[name] = p;
        reference["lm_head.weight"] = plain.wte_weight();
        optim::AdamW opt(optim::weight_decay_groups(pipe.parameters(), adamw()));
        optim::AdamW plain_opt(optim::weight_decay_groups(plain.parameters(), adamw()));
        double loss_error = 0, grad_error = 0, param_error = 0;
        std::string worst_grad, worst_param;
        for (int step = 0; step < kSteps; ++step) {
          manual_seed(300 + static_cast<uint64_t>(step));
          const Tensor idx = randint(0, config.vocab_size, {5, kT});
          const Tensor targets = randint(0, config.vocab_size, {5, kT});
          pipe.zero_grad();
          const Tensor loss = pipe.train_step(idx, targets);
          MG_CHECK(loss.dtype() == DType::Float64, "the pipeline's loss is {}", loss.dtype());
          plain.zero_grad();
          const Tensor plain_loss = GPT::loss(plain.forward(idx), targets);
          plain_loss.backward();
          loss_error = std::max(loss_error, std::fabs(as_double(loss) - as_double(plain_loss)) /
                                                std::fabs(as_double(plain_loss)));
          for (auto& [name, p] : pipe.named_parameters()) {
            MG_CHECK(p.dtype() == DType::Float64 && p.grad().dtype() == DType::Float64, "{} is {}", name, p.dtype());
            const Tensor& want = reference.at(name).grad();
            const double e = max_abs(p.grad() - want) / std::max(max_abs(want), 1e-30);
            if (e >= grad_error) {
              grad_error = e;
              worst_grad = fmt::format("{} at step {}", name, step);
            }
          }
          opt.step();
          plain_opt.step();
          for (auto& [name, p] : pipe.named_parameters()) {
            const double e = max_abs(p - reference.at(name));
            if (e >= param_error) {
              param_error = e;
              worst_param = fmt::format("{} after step {}", name, step);
            }
          }
        }
        ctx.report("errors", fmt::format("loss {:.3e}, gradient {:.3e} ({}), parameter {:.3e} ({})",
                                         loss_error, grad_error, worst_grad, param_error, worst_param));
        ctx.report("within", std::vector<float>{loss_error < 1e-12 && grad_error < 1e-12 && param_error < 1e-11
                                                    ? 1.0f : 0.0f});
      });
      INFO(describe(results));
      for (const RankResult& r : results) {
        REQUIRE(r.ok());
        INFO("rank " << r.rank << ": " << r.text("errors"));
        CHECK(r.floats("within") == std::vector<float>{1.0f});
      }
    }
  }
}

TEST_CASE("GPT pipeline: fewer blocks than stages x model chunks is refused", "[gpt_pp]") {
  REQUIRE_THROWS_WITH(gpt_pipeline_balance(config_of(4), 3, 2),
                      MG_CONTAINS("GPT pipeline: 4 blocks (n_layer) cannot fill 3 stages x 2 "
                                  "model chunks = 6 virtual stages; every virtual stage needs at "
                                  "least one block"));
  REQUIRE(gpt_pipeline_balance(config_of(5), 2, 2) == std::vector<int64_t>{2, 1, 1, 1});
  GPT model(config_of(3));
  REQUIRE_THROWS_WITH(split_gpt(model, 0, 4), MG_CONTAINS("3 blocks (n_layer) cannot fill 4 stages"));
  REQUIRE_THROWS_WITH(split_gpt(model, 0, 1, 2),
                      MG_CONTAINS("GPT pipeline: 2 model chunks on one rank; interleaving needs "
                                  "at least two ranks"));
  // Two chunks per rank need the interleaved schedule.
  const auto results = run_ranks(2, [](RankContext& ctx) {
    manual_seed(1);
    GPT gpt(config_of(4));
    GPTPipelineOptions options;
    options.model_chunks = 2;  // schedule stays 1f1b
    GPTPipeline pipe(gpt, ctx.gloo(std::chrono::seconds(5)), options);
  });
  for (const RankResult& r : results)
    REQUIRE_THAT(r.error, MG_CONTAINS("PipelineStage: 2 model chunks on a rank need the "
                                      "interleaved schedule, not 1f1b"));
}

#endif  // MINIGRAD_WITH_GLOO
