// split_module (parallel/pipeline/split_module.h) on a model of the test's own: a small
// language model -- an embedding, a Sequential of residual blocks, a LayerNorm and a head
// tied to the embedding -- whose forward passes absent children through, as a user would
// write it. In one process: each stage keeps its modules under the single-device names, the
// stages run one after another give the model's output, and every cut that cannot be made
// is refused with its message. Over 2 and 3 Gloo ranks (1F1B, and interleaved with 2 chunks
// per rank): the tied copies carry their placement on a tie group, reduce_partial_gradients adds
// their shares, a weight tied between two chunks of one rank stays one tensor, and the
// loss, every gradient and the parameters after 3 AdamW steps equal the single-device
// model's in float64; the tied sum left out (the parity fault) fails the comparison.
#include <algorithm>
#include <cmath>
#include <functional>

#include <fmt/format.h>

#include "catch_compat.h"
#include "multiprocess.h"

#include <minigrad/autograd/functions.h>
#include <minigrad/core/fault_injection.h>
#include <minigrad/core/generator.h>
#include <minigrad/core/ops.h>
#include <minigrad/nn/layers.h>
#include <minigrad/nn/optim/adam.h>
#include <minigrad/nn/transformer_layers.h>
#include <minigrad/parallel/partial_gradients.h>
#include <minigrad/parallel/pipeline/pipeline_stage.h>
#include <minigrad/parallel/pipeline/split_module.h>
#include <minigrad/parallel/placement.h>

using namespace mg;
using namespace mg::parallel;
using namespace mg::test;

namespace {

constexpr int64_t kVocab = 11, kDim = 6, kT = 5;

// x + relu(fc(x)): [B, T, D] -> [B, T, D].
class Block : public nn::Cloneable<Block> {
 public:
  Block() : nn::Cloneable<Block>("Block") { register_module("fc", std::make_shared<nn::Linear>(kDim, kDim)); }
  Tensor forward(const Tensor& x) override { return x + relu((*child("fc"))(x)); }
};

// tokens [B, T] -> embed -> blocks -> norm -> head (embed's weight) -> logits [B, T, V]. A
// child that is absent is passed through, so a pipeline stage is this model with the others'
// parts removed. `shared_block`: blocks.0 and blocks.2 share their fc weight (ALBERT's
// cross-layer sharing), a second tie; `shared_bias`: blocks.0 and the last block share their
// fc bias, a tie between the same stages as the embedding's.
class TinyLM : public nn::Cloneable<TinyLM> {
 public:
  explicit TinyLM(int64_t blocks, bool shared_block = false, bool shared_bias = false)
      : nn::Cloneable<TinyLM>("TinyLM") {
    register_module("embed", std::make_shared<nn::Embedding>(kVocab, kDim));
    auto stack = std::make_shared<nn::Sequential>();
    for (int64_t i = 0; i < blocks; ++i) stack->push_back(std::make_shared<Block>());
    register_module("blocks", stack);
    register_module("norm", std::make_shared<nn::LayerNorm>(kDim));
    auto head = std::make_shared<nn::Linear>(kDim, kVocab, /*bias=*/false);
    head->set_parameter("weight", parameter("embed.weight"));
    register_module("head", head);
    if (shared_block) set_parameter("blocks.2.fc.weight", parameter("blocks.0.fc.weight"));
    if (shared_bias) set_parameter(fmt::format("blocks.{}.fc.bias", blocks - 1), parameter("blocks.0.fc.bias"));
  }
  Tensor forward(const Tensor& input) override {
    Tensor x = has_child("embed") ? (*child("embed"))(input) : input;
    x = (*child("blocks"))(x);
    if (has_child("norm")) x = (*child("norm"))(x);
    return has_child("head") ? (*child("head"))(x) : x;
  }
};

std::shared_ptr<TinyLM> make_model(int64_t blocks, bool shared_block = false, bool shared_bias = false,
                                   DType dtype = DType::Float32) {
  manual_seed(21);
  auto model = std::make_shared<TinyLM>(blocks, shared_block, shared_bias);
  model->to(dtype);  // the ties kept
  return model;
}

Tensor lm_loss(const Tensor& logits, const Tensor& targets) {
  return cross_entropy(reshape(logits, {logits.size(0) * logits.size(1), kVocab}),
                       reshape(targets, {targets.size(0) * targets.size(1)}));
}

std::string names_of(const nn::Module& m) {
  std::string out;
  for (const auto& [name, p] : m.named_parameters()) out += (out.empty() ? "" : " ") + name;
  return out;
}

PipelineCut lm_cut(std::vector<std::string> points) {
  PipelineCut cut;
  cut.split_points = std::move(points);
  cut.ties = {{"embed.weight", "head.weight"}};
  return cut;
}

double max_abs(const Tensor& t) { return ops::to_dtype(ops::abs_max(t), DType::Float64).item<double>(); }

std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const std::exception& e) {
    return e.what();
  }
  return "no error";
}

}  // namespace

TEST_CASE("split_module: each stage of a user's model keeps its modules under the single-device names") {
  const auto model = make_model(5);
  const PipelineCut cut = lm_cut(even_split_points("blocks", 5, 3));
  REQUIRE(cut.split_points == std::vector<std::string>{"blocks.2", "blocks.4"});
  // The embedding before the blocks goes first; the norm and the head after them go last.
  const nn::ModulePtr s0 = cut_stage(*model, cut, 0, Device::cpu());
  const nn::ModulePtr s1 = cut_stage(*model, cut, 1, Device::cpu());
  const nn::ModulePtr s2 = cut_stage(*model, cut, 2, Device::cpu());
  CHECK(names_of(*s0) == "embed.weight blocks.0.fc.weight blocks.0.fc.bias blocks.1.fc.weight blocks.1.fc.bias");
  CHECK(names_of(*s1) == "blocks.2.fc.weight blocks.2.fc.bias blocks.3.fc.weight blocks.3.fc.bias");
  CHECK(names_of(*s2) == "blocks.4.fc.weight blocks.4.fc.bias norm.weight norm.bias head.weight");
  CHECK(stage_of(*model, cut, "embed.weight") == 0);
  CHECK(stage_of(*model, cut, "blocks.3") == 1);
  CHECK(stage_of(*model, cut, "blocks.4.fc.bias") == 2);
  CHECK(stage_of(*model, cut, "head.weight") == 2);
  // Copies: the model is whole and its own; a stage's tensors are new, equal ones.
  CHECK(model->named_parameters().size() == 1 + 5 * 2 + 2);
  CHECK_FALSE(s2->parameter("head.weight").is_same(model->parameter("embed.weight")));
  CHECK(s2->parameter("head.weight").to_vector<float>() == model->parameter("embed.weight").to_vector<float>());
  // The stages one after another are the model.
  manual_seed(3);
  const Tensor tokens = randint(0, kVocab, {2, kT});
  const Tensor whole = model->forward(tokens);
  CHECK((*s2)((*s1)((*s0)(tokens))).to_vector<float>() == whole.to_vector<float>());
  // One stage: a copy of the whole, the tie still one tensor.
  const nn::ModulePtr all = cut_stage(*model, lm_cut({}), 0, Device::cpu());
  CHECK(all->parameter("head.weight").is_same(all->parameter("embed.weight")));
  CHECK((*all)(tokens).to_vector<float>() == whole.to_vector<float>());
}

TEST_CASE("split_module: cuts that cannot be made are refused, naming the module") {
  const auto model = make_model(4);
  const auto stage0 = [&](std::vector<std::string> points) {
    return error_of([&] { cut_stage(*model, lm_cut(std::move(points)), 0, Device::cpu()); });
  };
  CHECK_THAT(stage0({"blocks.9"}), MG_CONTAINS("split_module: the split point 'blocks.9' names no module of TinyLM"));
  CHECK_THAT(stage0({"blocks.3", "blocks.1"}),
             MG_CONTAINS("split_module: the split points are out of order: 'blocks.1' comes before 'blocks.3' in "
                         "blocks; give the first module of each stage in the model's order"));
  CHECK_THAT(stage0({"blocks.1", "blocks.2", "blocks.3", "blocks.3", "blocks.3"}),
             MG_CONTAINS("split_module: 5 split points make 6 stages, but blocks has 4 modules; every stage holds at "
                         "least one"));
  CHECK_THAT(error_of([] { even_split_points("blocks", 4, 5); }),
             MG_CONTAINS("even_split_points: blocks has 4 modules, too few for 5 stages; every stage holds at "
                         "least one"));
  CHECK_THAT(stage0({"blocks.0"}),
             MG_CONTAINS("split_module: the split point 'blocks.0' is the first of blocks's modules: stage 0 would "
                         "hold none of them"));
  CHECK_THAT(stage0({"blocks.2", "norm"}),
             MG_CONTAINS("split_module: the split points 'blocks.2' and 'norm' are not children of one module"));
  CHECK_THAT(error_of([&] { cut_stage(*model, lm_cut({"blocks.2"}), 2, Device::cpu()); }),
             MG_CONTAINS("cut_stage: stage 2 of a cut into 2 stages"));
  // A parameter of its own above the split points would be on every stage.
  auto holder = std::make_shared<nn::Sequential>();
  holder->push_back(std::make_shared<Block>());
  holder->push_back(std::make_shared<Block>());
  holder->register_parameter("scale", ones({1}));
  CHECK_THAT(error_of([&] { cut_stage(*holder, lm_cut({"1"}), 0, Device::cpu()); }),
             MG_CONTAINS("split_module: Sequential holds a parameter of its own ('scale'), above the split points"));
}

#ifdef MINIGRAD_WITH_GLOO

TEST_CASE("split_module: ties must name one tensor, and a tensor shared across stages must be a tie") {
  const auto model = make_model(4);
  const auto refused = [&](PipelineCut cut) {
    return run_ranks(1, [cut, &model](RankContext& ctx) { split_module(*model, cut, ctx.gloo()); }).front().error;
  };
  PipelineCut cut = lm_cut({});
  cut.ties = {{"embed.weight", "head.bias"}};
  CHECK_THAT(refused(cut), MG_CONTAINS("split_module: the tie {embed.weight, head.bias} names 'head.bias', which is "
                                       "no parameter of TinyLM"));
  cut.ties = {{"embed.weight", "blocks.0.fc.weight"}};
  CHECK_THAT(refused(cut), MG_CONTAINS("split_module: the tie {embed.weight, blocks.0.fc.weight}: 'embed.weight' and "
                                       "'blocks.0.fc.weight' are two tensors of TinyLM, not one"));
  cut.split_points = {"blocks.2"};
  cut.ties.clear();
  const auto two = run_ranks(2, [cut, &model](RankContext& ctx) { split_module(*model, cut, ctx.gloo()); });
  for (const RankResult& r : two)
    CHECK_THAT(r.error, MG_CONTAINS("split_module: 'embed.weight' and 'head.weight' are one tensor of TinyLM, used "
                                    "by stages 0 and 1; name them as a tie (PipelineCut::ties), or each stage would "
                                    "train a copy of its own"));
  const auto three = run_ranks(2, [&model](RankContext& ctx) {
    split_module(*model, lm_cut({"blocks.1", "blocks.2"}), ctx.gloo());
  });
  for (const RankResult& r : three)
    CHECK_THAT(r.error, MG_CONTAINS("split_module: 2 split points make 3 stages, which 2 ranks cannot share evenly"));
}

namespace {

struct Run {
  int world;
  int model_chunks = 1;
  int64_t blocks = 4;
  bool shared_block = false;  // a second tie, between blocks.0 and blocks.2
  bool shared_bias = false;   // a third, between blocks.0 and the last block
  int64_t micro_batches = 3;
  std::string str() const {
    return fmt::format("{} ranks x {} chunks, {} blocks{}{}", world, model_chunks, blocks,
                       shared_block ? ", blocks.0 and blocks.2 sharing fc.weight" : "",
                       shared_bias ? ", blocks.0 and the last block sharing fc.bias" : "");
  }
};

// Every rank: its stages beside the whole model on the whole batch, 3 AdamW steps, float64.
// Reports the largest relative error of the loss and gradients and the largest absolute
// error of the parameters, and what its tied tensors say of themselves.
std::vector<RankResult> train_beside_one_device(const Run& run) {
  return run_ranks(run.world, [run](RankContext& ctx) {
    const auto pp = ctx.gloo();
    PipelineCut cut = lm_cut(even_split_points("blocks", run.blocks, run.world * run.model_chunks));
    if (run.shared_block) cut.ties.push_back({"blocks.0.fc.weight", "blocks.2.fc.weight"});
    if (run.shared_bias) cut.ties.push_back({"blocks.0.fc.bias", fmt::format("blocks.{}.fc.bias", run.blocks - 1)});
    const std::vector<nn::ModulePtr> chunks =
        split_module(*make_model(run.blocks, run.shared_block, run.shared_bias, DType::Float64), cut, pp);
    PipelineStageOptions options;
    options.chunks = run.micro_batches;
    options.schedule = run.model_chunks > 1 ? Schedule::Interleaved1F1B : Schedule::OneFOneB;
    PipelineStage stage(chunks, pp, options);
    const std::vector<nn::NamedTensor> named = chunk_parameters(chunks);
    const std::vector<Tensor> params = chunk_parameter_tensors(chunks);
    const auto reference = make_model(run.blocks, run.shared_block, run.shared_bias, DType::Float64);
    optim::AdamW opt(params, optim::AdamWOptions(1e-2));
    optim::AdamW ref_opt(reference->parameters(), optim::AdamWOptions(1e-2));
    const auto relative = [](const Tensor& got, const Tensor& want) {
      return max_abs(got - want) / std::max(max_abs(want), 1e-30);
    };
    double loss_error = 0, grad_error = 0, param_error = 0;
    std::string worst = "nothing";
    const bool first = ctx.rank == 0, last = ctx.rank + 1 == run.world;
    for (int step = 0; step < 3; ++step) {
      manual_seed(50 + static_cast<uint64_t>(step));
      const Tensor x = randint(0, kVocab, {7, kT}), y = randint(0, kVocab, {7, kT});
      for (const nn::ModulePtr& c : chunks) c->zero_grad();
      const Tensor loss =
          stage.loss_on_every_rank(stage.train_step(first ? x : Tensor(), last ? y : Tensor(), lm_loss));
      reduce_partial_gradients(params);
      reference->zero_grad();
      const Tensor ref_loss = lm_loss(reference->forward(x), y);
      ref_loss.backward();
      loss_error = std::max(loss_error, relative(loss, ref_loss));
      for (const auto& [name, p] : named) {
        const double e = relative(p.grad(), reference->parameter(name).grad());
        if (e >= grad_error) {
          grad_error = e;
          worst = fmt::format("grad of {} at step {}", name, step);
        }
      }
      opt.step();
      ref_opt.step();
    }
    for (const auto& [name, p] : named)
      param_error = std::max(param_error, max_abs(p - reference->parameter(name)));
    std::string placements;
    for (const auto& [name, p] : named)
      if (const ParameterSpec* spec = spec_of(p)) placements += name + ": " + spec->pieces[0].str() + "; ";
    // A tie whose uses are chunks of this rank: one tensor in both.
    const bool shared_here =
        chunks.size() == 2 && chunks[0]->child("blocks")->has_child("0") &&
        chunks[1]->child("blocks")->has_child("2") &&
        chunks[1]->parameter("blocks.2.fc.weight").is_same(chunks[0]->parameter("blocks.0.fc.weight"));
    ctx.report("errors", std::vector<float>{static_cast<float>(loss_error), static_cast<float>(grad_error),
                                            static_cast<float>(param_error)});
    ctx.report("worst", fmt::format("loss {:.1e}, gradients {:.1e} (worst: {}), parameters {:.1e}", loss_error,
                                    grad_error, worst, param_error));
    ctx.report("placements", placements);
    ctx.report("shared here", std::vector<float>{shared_here ? 1.0f : 0.0f});
  });
}

}  // namespace

TEST_CASE("split_module over Gloo ranks: the tied copies placed and summed, the same step as one device in float64") {
  for (const Run& run : {Run{2}, Run{3, 1, 5}, Run{2, 2, 4, true}, Run{3, 2, 6}, Run{2, 1, 4, false, true}}) {
    const std::vector<RankResult> results = train_beside_one_device(run);
    INFO(run.str());
    INFO(describe(results));
    for (const RankResult& r : results) {
      REQUIRE(r.ok());
      INFO("rank " << r.rank << ": " << r.text("worst"));
      const std::vector<float> e = r.floats("errors");
      CHECK(e[0] < 1e-13);
      CHECK(e[1] < 1e-12);
      CHECK(e[2] < 1e-12);
    }
    // The embedding on rank 0, the head's copy on the last rank: a tie group of the two (and
    // the shared bias's copies on the same group).
    const auto placed = [](const std::string& name, const std::string& of, const std::string& shape, int rank) {
      return fmt::format("{}: {} {}, tied: Replicate(), gradient Partial (rank {} of 2); ", name, of, shape, rank);
    };
    const std::string table = fmt::format("[{}, {}]", kVocab, kDim), bias = fmt::format("[{}]", kDim);
    const std::string last_bias = fmt::format("blocks.{}.fc.bias", run.blocks - 1);
    CHECK(results.front().text("placements") ==
          placed("embed.weight", "embed.weight", table, 0) +
              (run.shared_bias ? placed("blocks.0.fc.bias", "blocks.0.fc.bias", bias, 0) : ""));
    CHECK(results.back().text("placements") ==
          (run.shared_bias ? placed(last_bias, "blocks.0.fc.bias", bias, 1) : "") +
              placed("head.weight", "embed.weight", table, 1));
    // blocks.0 and blocks.2 are virtual stages 0 and 2, both rank 0's: one tensor, no group.
    CHECK(results.front().floats("shared here")[0] == (run.shared_block ? 1.0f : 0.0f));
  }
}

TEST_CASE("split_module over Gloo ranks: the tied gradient left unsummed fails") {
  mg::testing::FaultGuard fault(mg::testing::Fault::PipelineTiedGradNotSummed);
  const std::vector<RankResult> results = train_beside_one_device(Run{2});
  INFO(describe(results));
  for (const RankResult& r : results) {
    REQUIRE(r.ok());
    INFO("rank " << r.rank << ": " << r.text("worst"));
    CHECK(r.floats("errors")[1] > 1e-2);  // each copy's gradient is its own share
  }
}

#endif  // MINIGRAD_WITH_GLOO
