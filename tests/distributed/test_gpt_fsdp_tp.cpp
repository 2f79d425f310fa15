// FSDP x TP: the GPT on a dp 2 x tp 2 mesh of 4 Gloo ranks (torchtitan's default layout):
// its tp plan (models::parallelize_gpt, with and without sequence parallelism), then
// fully_shard on each block and on the GPT over dp (models::fully_shard_gpt). Against the
// single-device GPT on the whole batch: the loss, every gradient of the first step and the
// parameters after 3 AdamW steps, each piece of each flat shard against the part of the
// reference tensor its placements name (parallel::local_part: tp's Shard, then the flat
// range over dp). The reduce-scatter is over dp alone; sequence parallelism's Partial
// gradients are summed over tp after backward, on the shards (reduce_partial_gradients):
// leaving that sum out (a fault) is caught, and handing it the model's parameters, whose
// gradients FSDP has moved into the shards, is refused.
//
// Float32 (FSDP's flat shards and Gloo's reduce-scatter are float32), tolerances as the
// GPT's tensor-parallel tests: the loss and the gradients to 1e-5 relative, the parameters to
// 2e-5 absolute; a fault moves something by a whole step (1e-3) or more.
#ifdef MINIGRAD_WITH_GLOO

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
#include <minigrad/parallel/partial_gradients.h>
#include <minigrad/parallel/placement.h>
#include <minigrad/parallel/sharded/fully_shard.h>

using namespace mg;
using namespace mg::test;
using models::GPT;
using models::GPTConfig;

namespace {

GPTConfig tiny() {
  GPTConfig c;
  c.block_size = 8;
  c.vocab_size = 24;
  c.n_layer = 2;
  c.n_head = 4;
  c.n_embd = 16;
  return c;
}

// Each piece of each shard (its values, or its gradient) against the part of the reference
// tensor it holds; the worst error and where.
void compare_pieces(const parallel::FSDPModule& fsdp, const GPT& ref, bool grads, double& worst, std::string& where) {
  for (const Tensor& shard : fsdp.parameters()) {
    const Tensor values = grads ? shard.grad() : shard;
    for (const parallel::ParameterPiece& piece : parallel::spec_of(shard)->pieces) {
      const Tensor full = grads ? ref.parameter(piece.name).grad() : ref.parameter(piece.name);
      const Tensor got = values.narrow(0, piece.flat->local_offset, piece.flat->numel);
      const double err = max_abs(got - parallel::local_part(piece, full)) / (grads ? std::max(max_abs(full), 1e-6) : 1.0);
      if (err >= worst) {
        worst = err;
        where = piece.str();
      }
    }
  }
}

// One rank's check: the GPT's tp plan over the mesh's tp, FSDP over its dp, this dp rank's
// rows (3 + 2 of 5), against the single-device GPT on the whole batch.
SplitErrors against_single_device(const parallel::DeviceMesh& mesh, bool sp, int64_t B, int64_t T) {
  const GPTConfig config = tiny();
  manual_seed(1234);
  auto model = std::make_shared<GPT>(config);
  const Tensor x = randint(0, config.vocab_size, {B, T}), y = randint(0, config.vocab_size, {B, T});
  auto ref = std::static_pointer_cast<GPT>(model->clone());
  models::parallelize_gpt(*model, mesh, sp);
  const std::shared_ptr<parallel::FSDPModule> fsdp = models::fully_shard_gpt(model, mesh.group("dp"));
  const auto& dp = mesh.group("dp");
  const auto [start, rows] = rows_of(B, dp->size(), dp->rank());
  const Tensor x_mine = ops::contiguous(x.narrow(0, start, rows)), y_mine = ops::contiguous(y.narrow(0, start, rows));
  // The mean over this rank's rows, weighted so that FSDP's average over dp is the batch's mean.
  const double weight = static_cast<double>(rows * dp->size()) / static_cast<double>(B);

  optim::AdamW ref_opt(ref->parameters(), optim::AdamWOptions(1e-3));
  optim::AdamW opt(fsdp->parameters(), optim::AdamWOptions(1e-3));
  SplitErrors out;
  for (int step = 0; step < 3; ++step) {
    ref_opt.zero_grad();
    const Tensor ref_loss = GPT::loss(ref->forward(x), y);
    ref_loss.backward();
    opt.zero_grad();
    Tensor loss;
    {
      parallel::LossParallel loss_parallel(mesh);  // the logits are this rank's vocabulary
      loss = mul(GPT::loss((*model)(x_mine), y_mine), weight);
    }
    loss.backward();  // each unit reduce-scattered over dp as its gradients complete
    parallel::reduce_partial_gradients(fsdp->parameters());  // SP's Partial pieces summed over tp
    if (step == 0) {
      Tensor whole = ops::clone(loss.detach());
      dp->allreduce(whole, parallel::ReduceOp::Average)->wait();
      out.loss_error = std::abs(as_double(whole) - as_double(ref_loss)) / std::abs(as_double(ref_loss));
      compare_pieces(*fsdp, *ref, true, out.grad_error, out.worst_grad);
    }
    ref_opt.step();
    opt.step();
  }
  NoGradGuard no_grad;
  compare_pieces(*fsdp, *ref, false, out.param_error, out.worst_param);
  return out;
}

void require_equal(const RankResult& r, const std::string& prefix) {
  INFO("rank " << r.rank << ", " << prefix << ": " << r.text(prefix + " where"));
  const std::vector<float> e = r.floats(prefix + " errors");
  REQUIRE(e[0] <= 1e-5f);
  REQUIRE(e[1] <= 1e-5f);
  REQUIRE(e[2] <= 2e-5f);
}

void require_caught(const RankResult& r, const std::string& prefix) {
  INFO("rank " << r.rank << ", " << prefix << ": " << r.text(prefix + " where"));
  const std::vector<float> e = r.floats(prefix + " errors");
  REQUIRE((e[0] >= 1e-3f || e[1] >= 1e-3f || e[2] >= 1e-3f));
}

}  // namespace

TEST_CASE("FSDP x TP: the GPT on dp 2 x tp 2, with and without sequence parallelism, equals the single-device "
          "GPT", "[gpt_fsdp_tp]") {
  auto results = run_ranks(4, [](RankContext& ctx) {
    const parallel::DeviceMesh mesh(ctx.gloo(), 2, 2);
    report_errors(ctx, "fsdp tp", against_single_device(mesh, false, 5, 8));
    report_errors(ctx, "fsdp tp sp", against_single_device(mesh, true, 5, 8));
    {
      mg::testing::FaultGuard fault(mg::testing::Fault::SequenceParallelGradsNotReduced);
      report_errors(ctx, "sp fault", against_single_device(mesh, true, 5, 8));
    }
    // The model's parameters hold no gradient under FSDP: summing them is refused.
    auto gpt = std::make_shared<GPT>(tiny());
    models::parallelize_gpt(*gpt, mesh, true);
    models::fully_shard_gpt(gpt, mesh.group("dp"));
    try {
      parallel::reduce_partial_gradients(gpt->parameters());
      ctx.report("misuse", std::string("accepted"));
    } catch (const Error& e) {
      ctx.report("misuse", std::string(e.what()));
    }
  });
  INFO(describe(results));
  for (const RankResult& r : results) {
    REQUIRE(r.ok());
    require_equal(r, "fsdp tp");
    require_equal(r, "fsdp tp sp");
    require_caught(r, "sp fault");
    REQUIRE_THAT(r.text("misuse"), MG_CONTAINS("has no gradient and its memory is freed: FSDP manages it"));
  }
}

#endif  // MINIGRAD_WITH_GLOO
