// parallelize_module's own rules (parallel/parallelize.h), on 2 Gloo ranks: which modules a
// pattern names, what each style records on the parameters it splits (placement.h), ties
// kept tied, and every misuse an mg::Error naming the pattern, the module and the style.
#ifdef MINIGRAD_WITH_GLOO

#include "catch_compat.h"
#include "multiprocess.h"

#include <minigrad/nn/layers.h>
#include <minigrad/nn/transformer_layers.h>
#include <minigrad/parallel/parallelize.h>
#include <minigrad/parallel/tensor_parallel/styles.h>

using namespace mg;
using namespace mg::test;
using namespace mg::parallel;

namespace {

// emb -> [up, down] x 2 -> head, the head tied to emb (as the GPT's lm_head to wte).
std::shared_ptr<nn::Sequential> tied_model() {
  manual_seed(3);
  auto emb = std::make_shared<nn::Embedding>(8, 6);
  auto head = std::make_shared<nn::Linear>(6, 8, false);
  head->set_parameter("weight", emb->weight());
  auto model = std::make_shared<nn::Sequential>();
  model->register_module("emb", emb);
  for (const char* name : {"l0", "l1"}) {
    auto block = std::make_shared<nn::Sequential>();
    block->register_module("up", std::make_shared<nn::Linear>(6, 4));
    block->register_module("down", std::make_shared<nn::Linear>(4, 6));
    model->register_module(name, block);
  }
  model->register_module("head", head);
  return model;
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

std::string placements_of(const nn::Module& model) {
  std::string out;
  for (const auto& [name, p] : model.named_parameters()) out += spec_of(p)->pieces[0].str() + "\n";
  return out;
}

}  // namespace

TEST_CASE("parallelize_module: patterns, placements recorded, ties kept, misuse named", "[plan]") {
  auto results = run_ranks(2, [](RankContext& ctx) {
    const auto group = ctx.gloo();
    auto model = tied_model();
    const ParallelPlan plan{"tp",
                            {{"emb", std::make_shared<RowwiseParallel>()},
                             {"l*.up", std::make_shared<ColwiseParallel>()},
                             {"l*.down", std::make_shared<RowwiseParallel>()},
                             {"head", std::make_shared<ColwiseParallel>()}}};
    parallelize_module(*model, group, plan);
    ctx.report("placements", placements_of(*model));
    ctx.report("tied", std::vector<float>{model->parameter("head.weight").is_same(model->parameter("emb.weight"))
                                              ? 1.0f
                                              : 0.0f,
                                          static_cast<float>(model->parameters().size())});
    ctx.report("matches", std::vector<float>{module_name_matches("l*.up", "l0.up") ? 1.0f : 0.0f,
                                             module_name_matches("l*.up", "l0.x.up") ? 1.0f : 0.0f,
                                             module_name_matches("*", "") ? 1.0f : 0.0f});
    ctx.report("nothing", error_of([&] {
      parallelize_module(*tied_model(), group, {"tp", {{"l*.mlp", std::make_shared<ColwiseParallel>()}}});
    }));
    ctx.report("not a linear", error_of([&] {
      parallelize_module(*tied_model(), group, {"tp", {{"l0", std::make_shared<ColwiseParallel>()}}});
    }));
    ctx.report("half a tie", error_of([&] {
      parallelize_module(*tied_model(), group, {"tp", {{"emb", std::make_shared<RowwiseParallel>()}}});
    }));
    ctx.report("tie split two ways", error_of([&] {
      parallelize_module(*tied_model(), group,
                         {"tp", {{"emb", std::make_shared<RowwiseParallel>()},
                                 {"head", std::make_shared<RowwiseParallel>(Layout::replicate(), Layout::replicate())}}});
    }));
    ctx.report("odd width", error_of([&] {
      auto odd = std::make_shared<nn::Sequential>();
      odd->register_module("up", std::make_shared<nn::Linear>(6, 5));
      parallelize_module(*odd, group, {"tp", {{"up", std::make_shared<ColwiseParallel>()}}});
    }));
    ctx.report("dimension", error_of([&] { parallelize_module(*tied_model(), group, {"pp", {}}); }));
  });
  INFO(describe(results));
  for (const RankResult& r : results) {
    REQUIRE(r.ok());
    const std::string rank = fmt::format("(rank {} of 2)", r.rank);
    // Every parameter placed on tp: the split ones Shard, the rest Replicate; the tie once.
    CHECK(r.text("placements") ==
          fmt::format("emb.weight [8, 6], tp: Shard(0) {0}\n"
                      "l0.up.weight [4, 6], tp: Shard(0) {0}\nl0.up.bias [4], tp: Shard(0) {0}\n"
                      "l0.down.weight [6, 4], tp: Shard(1) {0}\nl0.down.bias [6], tp: Replicate() {0}\n"
                      "l1.up.weight [4, 6], tp: Shard(0) {0}\nl1.up.bias [4], tp: Shard(0) {0}\n"
                      "l1.down.weight [6, 4], tp: Shard(1) {0}\nl1.down.bias [6], tp: Replicate() {0}\n",
                      rank));
    CHECK(r.floats("tied") == std::vector<float>{1.0f, 9.0f});
    CHECK(r.floats("matches") == std::vector<float>{1.0f, 0.0f, 0.0f});
    CHECK_THAT(r.text("nothing"), MG_CONTAINS("parallelize_module: the pattern 'l*.mlp' (ColwiseParallel(input_layouts="
                                              "Replicate(), output_layouts=Shard(-1))) names no module of Sequential"));
    CHECK_THAT(r.text("not a linear"), MG_CONTAINS("ColwiseParallel splits a Linear, and 'l0' is a Sequential"));
    CHECK_THAT(r.text("half a tie"), MG_CONTAINS("parallelize_module: 'head.weight' still holds the whole of a tied "
                                                 "parameter the plan split elsewhere"));
    CHECK_THAT(r.text("tie split two ways"), MG_CONTAINS("'head.weight' is tied to a parameter"));
    CHECK_THAT(r.text("odd width"), MG_CONTAINS("ColumnParallelLinear: out_features = 5 is not divisible by the "
                                                "tensor-parallel size 2"));
    CHECK_THAT(r.text("dimension"), MG_CONTAINS("parallelize_module: a plan is for the mesh dimension tp or cp, got 'pp'"));
  }
}

#endif  // MINIGRAD_WITH_GLOO
