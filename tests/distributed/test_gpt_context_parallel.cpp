// The GPT under context parallelism on 2 and 3 Gloo ranks, split by its cp plan
// (models/gpt_plan.h): each rank holds two chunks of every sequence (tokens and targets),
// takes the position embedding at their global positions, attends through ring attention,
// takes the loss over the whole sequences (LossParallel) and sums its gradients over the
// group (reduce_partial_gradients: every parameter's placement says Partial over cp). Its
// loss, every parameter's gradient, and the parameters after 3 AdamW steps equal the
// plain GPT's on the whole batch; in float64 (loss and gradients)
// to the last few bits, in float32 (with the steps) within the tolerance of sums taken in
// another order. The wrong variant, gradients not summed over the group, must fail.
#ifdef MINIGRAD_WITH_GLOO

#include <algorithm>
#include <cmath>

#include "catch_compat.h"
#include "multiprocess.h"

#include <minigrad/autograd/functions.h>
#include <minigrad/core/fault_injection.h>
#include <minigrad/core/generator.h>
#include <minigrad/models/gpt.h>
#include <minigrad/models/gpt_plan.h>
#include <minigrad/nn/optim/adam.h>
#include <minigrad/parallel/context_parallel/sequence_layout.h>
#include <minigrad/parallel/loss_parallel.h>
#include <minigrad/parallel/parallelize.h>
#include <minigrad/parallel/partial_gradients.h>

using namespace mg;
using namespace mg::parallel;
using namespace mg::parallel::context_parallel;
using namespace mg::test;

namespace {

constexpr int kSteps = 3;

// |got - want| / (atol + rtol * max(|got|, |want|)), worst over the elements: <= 1 passes.
struct Worst {
  double rtol, atol;
  double worst = 0.0;
  std::string where = "nothing compared";

  void compare(const std::string& what, const Tensor& got, const Tensor& want) {
    MG_CHECK(got.shape() == want.shape(), "{}: shapes {} and {}", what, got.shape(), want.shape());
    const std::vector<double> g = to(contiguous(got), DType::Float64).to_vector<double>();
    const std::vector<double> w = to(contiguous(want), DType::Float64).to_vector<double>();
    for (size_t i = 0; i < g.size(); ++i) {
      const double ratio =
          std::abs(g[i] - w[i]) / (atol + rtol * std::max(std::abs(g[i]), std::abs(w[i])));
      if (!(ratio <= worst)) {
        worst = std::isnan(ratio) ? INFINITY : ratio;
        where = fmt::format("{}[{}]: {} vs {}", what, i, g[i], w[i]);
      }
    }
  }
};

models::GPTConfig config(bool bias = true) {
  models::GPTConfig c;
  c.bias = bias;
  c.block_size = 16;
  c.vocab_size = 19;
  c.n_layer = 2;
  c.n_head = 2;
  c.n_embd = 10;  // heads of 5
  c.dropout = 0.0;
  return c;
}

std::shared_ptr<models::GPT> make_gpt(DType dtype, bool bias) {
  manual_seed(7);  // the same weights for both models, on every rank
  auto gpt = std::make_shared<models::GPT>(config(bias));
  gpt->to(dtype);  // its initialisation draws float32
  return gpt;
}

// The plain GPT and the cp GPT side by side on this rank; `steps` AdamW steps (0: just
// the loss and gradients). Returns the worst disagreement.
Worst compare_gpt(RankContext& ctx, const std::shared_ptr<ProcessGroup>& group, DType dtype,
                  int steps, double rtol, double atol, bool bias = true) {
  const int cp = group->size();
  const int64_t B = 3, T = 12;
  manual_seed(11);
  const Tensor idx = randint(0, config().vocab_size, {B, T});
  std::vector<int64_t> t = randint(0, config().vocab_size, {B, T}).to_vector<int64_t>();
  t[1] = t[7] = t[20] = -1;  // ignored targets, unevenly over the ranks
  const Tensor targets = from_vector(t, Shape{B, T});

  auto plain = make_gpt(dtype, bias);
  auto sharded = make_gpt(dtype, bias);
  parallelize_module(*sharded, group, models::gpt_context_parallel_plan());
  const Tensor idx_local = shard_sequence(idx, group->rank(), cp);
  const Tensor targets_local = shard_sequence(targets, group->rank(), cp);

  Worst w{rtol, atol};
  std::unique_ptr<optim::AdamW> plain_opt, sharded_opt;
  if (steps > 0) {
    plain_opt = std::make_unique<optim::AdamW>(plain->parameters(), optim::AdamWOptions(1e-3));
    sharded_opt = std::make_unique<optim::AdamW>(sharded->parameters(), optim::AdamWOptions(1e-3));
  }
  for (int step = 0; step < std::max(steps, 1); ++step) {
    const Tensor want = models::GPT::loss(plain->forward(idx), targets);
    want.backward();
    Tensor got;
    {
      LossParallel loss_parallel(nullptr, group);
      got = models::GPT::loss(sharded->forward(idx_local), targets_local);
    }
    got.backward();
    reduce_partial_gradients(sharded->parameters());
    w.compare(fmt::format("step {} loss", step), got, want);
    for (const auto& [name, p] : plain->named_parameters())
      w.compare(fmt::format("step {} grad {}", step, name), sharded->parameter(name).grad(),
                p.grad());
    if (steps == 0) break;
    plain_opt->step();
    sharded_opt->step();
    plain_opt->zero_grad();
    sharded_opt->zero_grad();
  }
  for (const auto& [name, p] : plain->named_parameters())
    w.compare(fmt::format("after {} steps: {}", steps, name), sharded->parameter(name), p);
  (void)ctx;
  return w;
}

void report(RankContext& ctx, const std::string& name, const Worst& w) {
  ctx.report(name, std::vector<float>{static_cast<float>(std::min(w.worst, 1e30))});
  ctx.report(name + " where", w.where);
}

void run_for(int cp) {
  auto results = run_ranks(cp, [](RankContext& ctx) {
    auto group = ctx.gloo();
    // float64: only the order of the sums differs, so a few units in the last place.
    report(ctx, "float64", compare_gpt(ctx, group, DType::Float64, 0, 1e-12, 1e-14));
    // float32 with 3 AdamW steps (lr 1e-3): the sums' order moves the gradients by ~1e-7
    // relative, which the steps carry into the parameters at about lr times that. Without
    // biases: the key bias's exact gradient is zero (softmax ignores a constant added to a
    // row of scores), so in float32 it is rounding noise, which Adam divides by its own
    // size into a full +-lr step in either model, a different one in each.
    report(ctx, "float32", compare_gpt(ctx, group, DType::Float32, kSteps, 1e-5, 1e-6, false));
    testing::FaultGuard fault(testing::Fault::ContextParallelGradsNotReduced);
    report(ctx, "not reduced", compare_gpt(ctx, group, DType::Float64, 0, 1e-12, 1e-14));
  });
  INFO(describe(results));
  for (const RankResult& r : results) {
    REQUIRE(r.ok());
    for (const char* what : {"float64", "float32"}) {
      INFO("cp " << cp << ", rank " << r.rank << ", " << what << ": worst at "
                 << r.text(std::string(what) + " where"));
      REQUIRE(r.floats(what)[0] <= 1.0f);
    }
    INFO(r.text("not reduced where"));
    REQUIRE(r.floats("not reduced")[0] > 1e6f);
  }
}

}  // namespace

TEST_CASE("GPT under context parallelism on 2 Gloo ranks equals the plain GPT", "[gpt_cp]") {
  run_for(2);
}

TEST_CASE("GPT under context parallelism on 3 Gloo ranks equals the plain GPT", "[gpt_cp]") {
  run_for(3);
}

#endif  // MINIGRAD_WITH_GLOO
