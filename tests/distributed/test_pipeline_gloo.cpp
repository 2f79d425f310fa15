// The multi-process pipeline (PipelineStage) over 2 and 4 Gloo ranks: the loss, every
// parameter gradient and the parameters after SGD steps equal the plain module's on the
// whole batch, for both schedules, uneven micro-batches and checkpointing; a wrong
// micro-batch weighting is caught; and what a rank says when the ranks disagree.
#ifdef MINIGRAD_WITH_GLOO

#include <cmath>
#include <optional>

#include <fmt/format.h>

#include "catch_compat.h"
#include "multiprocess.h"
#include "shell_run.h"

#include <minigrad/autograd/functions.h>
#include <minigrad/autograd/grad_mode.h>
#include <minigrad/core/generator.h>
#include <minigrad/nn/layers.h>
#include <minigrad/parallel/pipeline/balance.h>
#include <minigrad/parallel/pipeline/pipeline_stage.h>

using namespace mg;
using namespace mg::parallel;
using namespace mg::test;

namespace {

// Seven layers: Linear ReLU Linear ReLU Linear ReLU Linear, the same on every rank.
const std::vector<int64_t> kWidths{6, 9, 7, 8, 3};
constexpr int64_t kRows = 19;  // chunks 3: 7 7 5; chunks 8: 3 3 3 3 3 3 1
constexpr int kSteps = 3;
constexpr double kLr = 0.1;

std::shared_ptr<nn::Sequential> make_model() {
  manual_seed(7);
  auto mlp = std::make_shared<nn::Sequential>();
  for (size_t i = 0; i + 1 < kWidths.size(); ++i) {
    if (i > 0) mlp->push_back(std::make_shared<nn::ReLU>());
    mlp->push_back(std::make_shared<nn::Linear>(kWidths[i], kWidths[i + 1]));
  }
  return mlp;
}

struct Batch {
  Tensor x, y;
};
Batch make_batch(int step) {
  manual_seed(100 + static_cast<uint64_t>(step));
  return {randn({kRows, kWidths.front()}), randint(0, kWidths.back(), {kRows})};
}

void sgd_step(const std::vector<nn::NamedTensor>& params) {
  NoGradGuard no_grad;
  for (const auto& [name, p] : params) {
    Tensor q = p;
    q.add_(q.grad(), -kLr);
  }
}

// Every rank: its stage of the model, kSteps steps; reports its parameters' gradients
// after each step, its parameters at the end and (the last rank) the losses.
std::vector<RankResult> run_pipeline(int world, PipelineStageOptions options,
                                     const PipeLoss& loss_fn = cross_entropy_loss) {
  return run_ranks(world, [&](RankContext& ctx) {
    auto model = make_model();
    const auto balance = even_balance(static_cast<int64_t>(model->size()), ctx.world_size);
    PipelineStage stage(split_stage(model, balance, ctx.rank), ctx.gloo(), options);
    const auto params = stage.module()->named_parameters();
    const bool first = ctx.rank == 0, last = ctx.rank + 1 == ctx.world_size;
    for (int step = 0; step < kSteps; ++step) {
      const Batch b = make_batch(step);
      stage.module()->zero_grad();
      const Tensor loss = stage.train_step(first ? b.x : Tensor(), last ? b.y : Tensor(), loss_fn);
      MG_CHECK(last == loss.defined(), "rank {}: a loss where there should be none", ctx.rank);
      if (last) ctx.report(fmt::format("loss {}", step), loss);
      for (const auto& [name, p] : params) ctx.report(fmt::format("grad {} {}", name, step), p.grad());
      sgd_step(params);
    }
    for (const auto& [name, p] : params) ctx.report("param " + name, p);
    ctx.report("max stashed", std::vector<float>{static_cast<float>(stage.last_max_stashed())});
  });
}

std::optional<std::string> differs(const std::vector<float>& a, const Tensor& b,
                                   const std::string& what) {
  const std::vector<float> v = b.contiguous().to_vector<float>();
  if (a.size() != v.size()) return fmt::format("{}: {} values vs {}", what, a.size(), v.size());
  for (size_t i = 0; i < v.size(); ++i)
    if (std::fabs(a[i] - v[i]) > 1e-5 * std::max(std::fabs(a[i]), std::fabs(v[i])) + 1e-6)
      return fmt::format("{}: element {} is {} in the pipeline, {} in the plain module", what,
                         i, a[i], v[i]);
  return std::nullopt;
}

// The first difference between the ranks' reports and the plain module's steps.
std::optional<std::string> compare_with_plain(const std::vector<RankResult>& results, int world) {
  auto plain = make_model();
  const auto balance = even_balance(static_cast<int64_t>(plain->size()), world);
  for (int step = 0; step < kSteps; ++step) {
    const Batch b = make_batch(step);
    plain->zero_grad();
    const Tensor loss = cross_entropy(plain->forward(b.x), b.y);
    loss.backward();
    if (auto d = differs(results.back().floats(fmt::format("loss {}", step)), loss,
                         fmt::format("loss at step {}", step)))
      return d;
    for (int r = 0; r < world; ++r)
      for (const auto& [name, p] : split_stage(plain, balance, r)->named_parameters())
        if (auto d = differs(results[static_cast<size_t>(r)].floats(fmt::format("grad {} {}", name, step)),
                             p.grad(), fmt::format("rank {}: grad of {} at step {}", r, name, step)))
          return d;
    sgd_step(plain->named_parameters());
  }
  for (int r = 0; r < world; ++r)
    for (const auto& [name, p] : split_stage(plain, balance, r)->named_parameters())
      if (auto d = differs(results[static_cast<size_t>(r)].floats("param " + name), p,
                           fmt::format("rank {}: {} after the steps", r, name)))
        return d;
  return std::nullopt;
}

}  // namespace

TEST_CASE("PipelineStage over 2 and 4 Gloo ranks matches the plain module, both schedules") {
  struct Case {
    int world;
    int64_t chunks;
    Schedule schedule;
    Checkpoint checkpoint;
  };
  for (const Case& c : {Case{2, 3, Schedule::GPipe, Checkpoint::Never},
                        Case{2, 8, Schedule::OneFOneB, Checkpoint::ExceptLast},
                        Case{4, 3, Schedule::OneFOneB, Checkpoint::Never},
                        Case{4, 8, Schedule::GPipe, Checkpoint::Always}}) {
    INFO(fmt::format("{} ranks, chunks {}, {}, checkpoint {}", c.world, c.chunks,
                     schedule_name(c.schedule), checkpoint_name(c.checkpoint)));
    PipelineStageOptions options;
    options.chunks = c.chunks;
    options.schedule = c.schedule;
    options.checkpoint = c.checkpoint;
    const auto results = run_pipeline(c.world, options);
    INFO(describe(results));
    for (const RankResult& r : results) REQUIRE(r.ok());
    const auto difference = compare_with_plain(results, c.world);
    INFO(difference.value_or("none"));
    REQUIRE_FALSE(difference.has_value());
    // 1F1B: rank r keeps at most world - r micro-batches; GPipe all of them.
    const int64_t m = c.chunks == 3 ? 3 : 7;
    for (int r = 0; r < c.world; ++r)
      REQUIRE(results[static_cast<size_t>(r)].floats("max stashed")[0] ==
              (c.schedule == Schedule::GPipe ? m : std::min<int64_t>(c.world - r, m)));
  }
}

TEST_CASE("PipelineStage: micro-batch losses weighted equally (not by rows) fail the comparison") {
  PipelineStageOptions options;
  options.chunks = 3;  // 7 7 5 rows
  const auto results = run_pipeline(2, options, [](const Tensor& out, const Tensor& y) {
    // The Pipe weights by rows / 19; this undoes it into 1/3 each.
    return cross_entropy(out, y) * (static_cast<double>(kRows) / static_cast<double>(out.size(0)) / 3.0);
  });
  INFO(describe(results));
  for (const RankResult& r : results) REQUIRE(r.ok());
  REQUIRE(compare_with_plain(results, 2).has_value());
}

TEST_CASE("PipelineStage: ranks that disagree, or miss their tensors, say so") {
  const auto results = run_ranks(2, [](RankContext& ctx) {
    auto model = make_model();
    PipelineStageOptions options;
    options.chunks = ctx.rank == 0 ? 3 : 4;  // rank 1 disagrees
    PipelineStage stage(split_stage(model, {4, 3}, ctx.rank), ctx.gloo(std::chrono::seconds(3)),
                        options);
    const Batch b = make_batch(0);
    stage.train_step(ctx.rank == 0 ? b.x : Tensor(), ctx.rank == 1 ? b.y : Tensor(), mg::parallel::cross_entropy_loss);
  });
  REQUIRE_FALSE(results[1].ok());
  REQUIRE_THAT(results[1].error,
               MG_CONTAINS("PipelineStage: stage 1 was made with chunks 4, which cuts 19 rows "
                           "into 4 micro-batches, but stage 0 cut them into 3"));
  REQUIRE_FALSE(results[0].ok());  // it waited for gradients that never came: a timeout

  const auto missing = run_ranks(1, [](RankContext& ctx) {
    PipelineStage stage(make_model(), ctx.gloo(), {});
    stage.train_step(make_batch(0).x, Tensor(), mg::parallel::cross_entropy_loss);
  });
  REQUIRE_THAT(missing[0].error,
               MG_CONTAINS("PipelineStage: the last stage (rank 0) needs the targets; got an "
                           "undefined tensor"));
}

// The sample, started by the launcher as a user starts it: two ranks give the losses of
// one process holding the whole model.
TEST_CASE("pipeline_parallel under minigrad-run: two ranks train to the one-process losses") {
  const std::string bin = std::string(MINIGRAD_BINARY_DIR) + "/bin/";
  mg::testing::require_program(bin + "minigrad-run");
  mg::testing::require_program(bin + "pipeline_parallel");
  const std::string flags = " --steps 3 --batch 64 --width 32 --layers 4 --chunks 4 --schedule 1f1b";
  const mg::testing::Run one = mg::testing::run_shell(bin + "pipeline_parallel" + flags);
  const mg::testing::Run two =
      mg::testing::run_shell(bin + "minigrad-run --nproc-per-node 2 " + bin + "pipeline_parallel" + flags);
  INFO(one.output);
  INFO(two.output);
  REQUIRE(one.exit_code == 0);
  REQUIRE(two.exit_code == 0);
  REQUIRE_THAT(two.output, MG_CONTAINS("[rank 0] rank 0 of 2 on cpu: stage 0, layers 0 to 3"));
  REQUIRE_THAT(two.output, MG_CONTAINS("[rank 1] rank 1 of 2 on cpu: stage 1, layers 4 to 6"));
  for (int step = 1; step <= 3; ++step) {
    const std::string prefix = fmt::format("step {}, loss ", step);
    const size_t a = one.output.find(prefix), b = two.output.find("[rank 1] " + prefix);
    REQUIRE(a != std::string::npos);
    REQUIRE(b != std::string::npos);
    const double alone = std::stod(one.output.substr(a + prefix.size()));
    const double piped = std::stod(two.output.substr(b + 9 + prefix.size()));
    REQUIRE(piped == Approx(alone).epsilon(1e-5));
  }
  REQUIRE_THAT(two.output, MG_CONTAINS("[rank 0] stage 0: busy "));
  REQUIRE_THAT(two.output, MG_CONTAINS("[rank 0] stage 0: busy "));
  REQUIRE_THAT(two.output, MG_CONTAINS("at most 2 of its 4 micro-batches alive at once (1f1b)"));
}

#endif  // MINIGRAD_WITH_GLOO
