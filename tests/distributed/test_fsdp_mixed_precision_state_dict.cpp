// A full state dict into FSDP under torchtitan's MixedPrecisionPolicy (param_dtype
// bfloat16, reduce_dtype float32) across Gloo ranks: the shards are float32 (the masters),
// so the float32 single-device dict loads into them -- through parallel::load_full_state_dict
// over the shards' placements and through the module's own FSDPModule::load_full_state_dict
// -- and comes back bit for bit (full_state_dict of either kind); the next forward gathers
// the loaded values rounded to bfloat16, so its output is a bfloat16 copy of the plain model
// with the dict's weights, bit for bit; loading after a trained step replaces what the
// step left; and a bfloat16 dict (not the shards' dtype) is refused, naming the tensors. 2 ranks (even shards) and 3 (a padded last shard).
#ifdef MINIGRAD_WITH_GLOO

#include "catch_compat.h"
#include "multiprocess.h"

#include <minigrad/core/ops.h>
#include <minigrad/minigrad.h>

using namespace mg;
using namespace mg::parallel;
using namespace mg::test;

namespace {

constexpr int64_t kIn = 6, kHidden = 13, kClasses = 3, kRows = 4;  // 13: shards uneven over 2 and 3

std::shared_ptr<nn::Sequential> make_net(uint64_t seed) {
  manual_seed(seed);
  return std::make_shared<nn::Sequential>(std::initializer_list<nn::ModulePtr>{
      std::make_shared<nn::Linear>(kIn, kHidden), std::make_shared<nn::ReLU>(),
      std::make_shared<nn::Linear>(kHidden, kClasses)});
}

std::pair<Tensor, Tensor> batch() {
  manual_seed(77);
  return {randn(Shape{kRows, kIn}), randint(0, kClasses, Shape{kRows})};
}

// Each Linear a unit, then the root (FSDP2's order), under torchtitan's policy.
std::shared_ptr<FSDPModule> shard(const std::shared_ptr<nn::Sequential>& net, const std::shared_ptr<ProcessGroup>& pg) {
  FSDPOptions options;
  options.mp_policy.param_dtype = DType::BFloat16;
  options.mp_policy.reduce_dtype = DType::Float32;
  options.mp_policy.output_dtype = DType::Float32;
  for (const nn::ModulePtr& child : net->children())
    if (!child->parameters().empty()) fully_shard(child, pg, options);
  return fully_shard(net, pg, options);
}

// The shards under names of their own: their placements name the single-device pieces.
std::vector<nn::NamedTensor> named_shards(const FSDPModule& fsdp) {
  std::vector<nn::NamedTensor> out;
  for (const Tensor& p : fsdp.parameters()) out.emplace_back("flat_shard_" + std::to_string(out.size()), p);
  return out;
}

void report_dict(RankContext& ctx, const std::string& prefix, const nn::TensorDict& dict) {
  for (const auto& [name, t] : dict) {
    ctx.report(prefix + name, ops::to_dtype(ops::contiguous(t), DType::Float32));
    ctx.report(prefix + name + " dtype", std::string(dtype_name(t.dtype())));
  }
}

}  // namespace

TEST_CASE("a full float32 state dict loads into FSDP under a bfloat16 MixedPrecisionPolicy and round-trips bit for bit") {
  // The dict: another model's values (seed 9), so that a load that wrote nothing shows.
  const nn::TensorDict want = nn::state_dict(*make_net(9));
  // The plain model with the dict's weights, rounded to bfloat16, on the batch: what the
  // policy's forward computes (each rank the same rows), with the logits widened.
  auto plain = make_net(9);
  plain->to(DType::BFloat16);
  const Tensor want_logits = ops::to_dtype(plain->forward(to(batch().first, DType::BFloat16)), DType::Float32);

  for (int ranks : {2, 3}) {
    INFO(ranks << " ranks");
    const auto results = run_ranks(ranks, [&](RankContext& ctx) {
      const auto pg = ctx.gloo();
      auto net = make_net(5);
      auto fsdp = shard(net, pg);
      for (const Tensor& p : fsdp->parameters())
        MG_CHECK(p.dtype() == DType::Float32, "a shard is {}, not float32", p.dtype());
      const std::vector<nn::NamedTensor> named = named_shards(*fsdp);

      // Through the shards' placements (any split's loader).
      parallel::load_full_state_dict(named, want, "want");
      report_dict(ctx, "placements: ", parallel::full_state_dict(named, pg));
      const auto [x, y] = batch();
      {
        NoGradGuard eval;  // a forward alone: no backward will follow
        ctx.report("logits", (*net)(x));
      }

      // A bfloat16 dict is not the shards' dtype: refused, naming each tensor, nothing written.
      nn::TensorDict half;
      for (const auto& [name, t] : want) half.emplace(name, ops::to_dtype(t, DType::BFloat16));
      try {
        fsdp->load_full_state_dict(half, "half");
        ctx.report("refused", std::string("no error"));
      } catch (const Error& e) {
        ctx.report("refused", std::string(e.what()));
      }
      // A trained step moves the shards; the module's own loader puts the dict back.
      optim::AdamW opt(fsdp->parameters(), optim::AdamWOptions(1e-2));
      opt.zero_grad();
      cross_entropy((*net)(x), y).backward();
      opt.step();
      fsdp->load_full_state_dict(want, "want");
      report_dict(ctx, "module: ", fsdp->full_state_dict());  // rank 0's; the others' empty
      NoGradGuard eval;
      ctx.report("logits after reload", (*net)(x));
    });
    INFO(describe(results));
    for (const RankResult& r : results) {
      REQUIRE(r.ok());
      for (const auto& [name, t] : want) {
        INFO("rank " << r.rank << ": " << name);
        const std::vector<float> w = t.to_vector<float>();
        CHECK(r.floats("placements: " + name) == w);
        CHECK(r.text("placements: " + name + " dtype") == "float32");
        if (r.rank == 0) {
          CHECK(r.floats("module: " + name) == w);
          CHECK(r.text("module: " + name + " dtype") == "float32");
        }
      }
      CHECK_THAT(r.text("refused"), MG_CONTAINS("FSDPModule::load_full_state_dict: half does not match Sequential (4 "
                                                "problems; nothing was loaded):\n  dtype mismatch for '0.bias': shape "
                                                "[13] (bfloat16) in half, shape [13] (float32) in the module"));
      CHECK(r.floats("logits") == want_logits.to_vector<float>());
      CHECK(r.floats("logits after reload") == want_logits.to_vector<float>());
    }
  }
}

#endif  // MINIGRAD_WITH_GLOO
