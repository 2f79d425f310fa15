// The Llama's spec (models/llama_plan.h) refuses what does not divide, naming it; its
// pipeline cut; its tp + SP plan on a Llama called with two inputs (position_ids): the hooks
// see the first, the positions ride through. Its splits against the single-device Llama are
// the parity table's Llama rows (tests/parity).
#ifdef MINIGRAD_WITH_GLOO

#include "catch_compat.h"
#include "multiprocess.h"

#include <fmt/format.h>

#include <cmath>

#include <minigrad/core/ops.h>
#include <minigrad/models/llama_plan.h>
#include <minigrad/parallel/clip_grad.h>
#include <minigrad/parallel/loss_parallel.h>
#include <minigrad/parallel/partial_gradients.h>

using namespace mg;
using namespace mg::test;

namespace {

models::LlamaConfig tiny(int64_t heads, int64_t kv_heads, int64_t vocab) {
  models::LlamaConfig c;
  c.vocab_size = vocab;
  c.hidden_size = 4 * heads;
  c.intermediate_size = 8;
  c.num_hidden_layers = 2;
  c.num_attention_heads = heads;
  c.num_key_value_heads = kv_heads;
  c.max_position_embeddings = 8;
  return c;
}

}  // namespace

TEST_CASE("parallelize_llama refuses a tp that does not divide the query heads the kv heads or the vocabulary",
          "[llama][plan]") {
  auto results = run_ranks(2, [](RankContext& ctx) {
    parallel::DeviceMesh mesh(ctx.gloo(), {{"tp", 2}});
    for (const auto& c : {tiny(4, 1, 8), tiny(3, 3, 8), tiny(4, 2, 7)}) {
      models::Llama llama(c);
      try {
        models::parallelize_llama(llama, mesh, false);
        ctx.report("refused", std::string("no"));
      } catch (const Error& e) {
        ctx.report("refused", std::string(e.what()));
      }
    }
    models::Llama fits(tiny(4, 2, 8));
    models::parallelize_llama(fits, mesh, true);
    // Each rank: 2 of the 4 query heads of 4 (8 of q_proj's 16 rows) and 1 of the 2 kv heads.
    ctx.report("q_proj", fmt::format("{}", fits.parameter("model.layers.0.self_attn.q_proj.weight").shape()));
    ctx.report("k_proj", fmt::format("{}", fits.parameter("model.layers.1.self_attn.k_proj.weight").shape()));
  });
  INFO(describe(results));
  for (const RankResult& r : results) {
    REQUIRE(r.ok());
    std::vector<std::string> refusals;
    for (const auto& [name, value] : r.reports)
      if (name == "refused") refusals.push_back(value);
    REQUIRE(refusals.size() == 3);
    for (const auto& [name, value] : r.reports) {
      if (name == "q_proj") CHECK(value == "[8, 16]");
      if (name == "k_proj") CHECK(value == "[4, 16]");
    }
    CHECK_THAT(refusals[0], MG_CONTAINS("parallelize_llama: num_key_value_heads = 1 is not divisible by the "
                                        "tensor-parallel size 2"));
    CHECK_THAT(refusals[1], MG_CONTAINS("parallelize_llama: num_attention_heads = 3 is not divisible by the "
                                        "tensor-parallel size 2"));
    CHECK_THAT(refusals[2], MG_CONTAINS("parallelize_llama: vocab_size = 7 is not divisible"));
  }
}

TEST_CASE("llama_pipeline_cut: layers dealt over virtual stages and none left empty", "[llama][plan]") {
  const models::LlamaConfig c = tiny(4, 2, 8);
  CHECK(models::llama_pipeline_cut(c, 2).split_points == std::vector<std::string>{"model.layers.1"});
  CHECK(models::llama_pipeline_cut(c, 1).split_points.empty());
  CHECK(models::llama_pipeline_cut(c, 2).ties.empty());  // the head is its own weight
  REQUIRE_THROWS_WITH(models::llama_pipeline_cut(c, 2, 2),
                      MG_CONTAINS("2 layers (num_hidden_layers) cannot fill 2 stages x 2 model chunks"));
  models::Llama llama(c);
  const parallel::PipelineCut cut = models::llama_pipeline_cut(c, 2);
  CHECK(parallel::stage_of(llama, cut, "model.embed_tokens.weight") == 0);
  CHECK(parallel::stage_of(llama, cut, "model.layers.1.mlp.up_proj.weight") == 1);
  CHECK(parallel::stage_of(llama, cut, "model.norm.weight") == 1);
  CHECK(parallel::stage_of(llama, cut, "lm_head.weight") == 1);
}

TEST_CASE("a Llama given position_ids, split by its tp + SP plan on 2 ranks, equals the single-device Llama's "
          "loss and gradient norm (float64)", "[llama][plan][positions]") {
  auto results = run_ranks(2, [](RankContext& ctx) {
    const models::LlamaConfig c = tiny(4, 2, 8);
    manual_seed(9);
    const Tensor idx = randint(0, 8, Shape{3, 6}), y = randint(0, 8, Shape{3, 6});
    // A gap before the last two tokens: the positions change the loss (RoPE's differences).
    const Tensor positions = from_vector(std::vector<int64_t>{0, 1, 2, 3, 6, 7}, Shape{6});
    const auto norm_of = [](const std::vector<Tensor>& params) {
      double sum = 0;
      for (const Tensor& p : params)
        for (double g : p.grad().to_vector<double>()) sum += g * g;
      return std::sqrt(sum);
    };
    manual_seed(1);
    models::Llama whole(c);
    whole.to(DType::Float64);
    const Tensor loss = models::Llama::loss(whole({idx, positions}), y);
    loss.backward();
    ctx.report("whole loss", fmt::format("{:.17g}", loss.item<double>()));
    ctx.report("whole norm", fmt::format("{:.17g}", norm_of(whole.parameters())));
    ctx.report("plain loss", fmt::format("{:.17g}", models::Llama::loss(whole(idx), y).item<double>()));
    manual_seed(1);
    models::Llama split(c);
    split.to(DType::Float64);
    parallel::DeviceMesh mesh(ctx.gloo(), {{"tp", 2}});
    models::parallelize_llama(split, mesh, /*sequence_parallel=*/true);
    Tensor split_loss;
    {
      parallel::LossParallel loss_parallel(mesh);
      split_loss = models::Llama::loss(split({idx, positions}), y);
    }
    split_loss.backward();
    parallel::reduce_partial_gradients(split.parameters());
    ctx.report("split loss", fmt::format("{:.17g}", split_loss.item<double>()));
    const Tensor norm = parallel::clip_grad_norm_(split.parameters(), mesh, 1e300);
    ctx.report("split norm", fmt::format("{:.17g}", norm.item<double>()));
  });
  INFO(describe(results));
  for (const RankResult& r : results) {
    REQUIRE(r.ok());
    std::map<std::string, double> v;
    for (const auto& [name, value] : r.reports) v[name] = std::stod(value);
    // float64 sums in another order: a few ulps of values of order 1 (1e-12 is 4000 of them).
    CHECK(std::fabs(v["split loss"] - v["whole loss"]) <= 1e-12 * std::fabs(v["whole loss"]));
    CHECK(std::fabs(v["split norm"] - v["whole norm"]) <= 1e-12 * v["whole norm"]);
    CHECK(std::fabs(v["plain loss"] - v["whole loss"]) > 1e-6);  // the positions were used
  }
}

#endif  // MINIGRAD_WITH_GLOO
