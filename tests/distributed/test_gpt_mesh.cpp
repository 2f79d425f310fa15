// The GPT on a composed mesh (issue 22): tensor parallelism x context parallelism on 4 Gloo
// ranks (cp2 x tp2) and data x context x tensor parallelism on 8 (dp2 x cp2 x tp2): the
// GPT's cp and tp plans (models::parallelize_gpt over the DeviceMesh), with and without
// sequence parallelism. Every rank builds the GPT with the same seed, keeps a copy as the
// single-device reference on the whole batch, and runs 3 AdamW steps on both: the loss,
// every gradient of the first step (each rank's shard against the matching part of the
// reference's gradient, as its placement cuts it) and the parameters after the last step
// must agree. The dp split of the batch rows is uneven (5 rows: 3 and 2).
//
// Float64: the tensor-parallel Gloo group carries float64 as int64 bits and sums in rank
// order (tensor_parallel/group.cpp), the cp group likewise (context_parallel/wire.h), and
// AdamW steps float64; so only the order of sums differs: gradients agree to ~1e-15
// relative (held to 1e-10), parameters after 3 steps to ~1e-16 absolute (held to 1e-12;
// the key bias's exact gradient is 0, its float64 noise of ~1e-18 moves Adam by
// lr * 1e-18 / eps = 1e-13 at most). One float32 run (the coalesced float32 all-reduces)
// holds the existing tensor-parallel tolerances (1e-5 gradients, 2e-5 parameters),
// without biases for the reason test_gpt_context_parallel.cpp gives. The wrong variants
// (gradients not summed over cp; with SP, LayerNorm gradients not summed over tp) move
// things by 1e-3 or more and must fail.
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
#include <minigrad/parallel/context_parallel/sequence_layout.h>
#include <minigrad/parallel/context_parallel/wire.h>
#include <minigrad/parallel/ddp/distributed_data_parallel.h>
#include <minigrad/parallel/loss_parallel.h>
#include <minigrad/parallel/partial_gradients.h>
#include <minigrad/parallel/placement.h>
#include <minigrad/parallel/tensor_parallel/layers.h>

using namespace mg;
using namespace mg::test;
using models::GPT;
using models::GPTConfig;

namespace {

GPTConfig tiny(bool bias = true, double dropout = 0.0) {
  GPTConfig c;
  c.block_size = 16;
  c.vocab_size = 18;
  c.n_layer = 2;
  c.n_head = 2;
  c.n_embd = 10;  // heads of 5
  c.bias = bias;
  c.dropout = dropout;
  return c;
}


// Sums every gradient over the dp group in place (float64 through the wire's bits).
void sum_over_dp(const std::vector<Tensor>& parameters, parallel::ProcessGroup& dp) {
  NoGradGuard no_grad;
  for (const Tensor& p : parameters)
    ops::copy_(p.grad(), parallel::context_parallel::sum_over_group(p.grad(), dp));
}

// One rank's check: the composed model on its rows and its cp chunks against the single-
// device GPT on the whole batch [B, T]. With `ddp` the dp sum is DistributedDataParallel's
// average during backward (float32: the buckets' all-reduce), each rank dividing by the
// count of targets / dp.
SplitErrors against_single_device(const parallel::DeviceMesh& mesh, const GPTConfig& config,
                              int64_t B, int64_t T, bool sp, DType dtype, bool ddp = false) {
  manual_seed(1234);
  GPT gpt(config);
  if (dtype != DType::Float32)
    for (const auto& [name, p] : gpt.named_parameters()) {
      Tensor wide = ops::to_dtype(p, dtype);
      wide.set_requires_grad(true);
      gpt.set_parameter(name, wide);
    }
  const Tensor x = randint(0, config.vocab_size, {B, T});
  std::vector<int64_t> yv = randint(0, config.vocab_size, {B, T}).to_vector<int64_t>();
  int64_t targets = 0;
  for (size_t i = 2; i < yv.size(); i += 5) yv[i] = -1;  // ignored, unevenly over the ranks
  for (int64_t t : yv) targets += t != -1 ? 1 : 0;
  const Tensor y = from_vector(yv, Shape{B, T});

  auto ref = std::static_pointer_cast<GPT>(gpt.clone());
  models::parallelize_gpt(gpt, mesh, sp);
  const int dp = mesh.size("dp"), cp = mesh.size("cp");
  const auto local = [&](const Tensor& t) {  // this cp rank's two chunks of each sequence
    return cp > 1 ? parallel::context_parallel::shard_sequence(t, mesh.rank("cp"), cp) : t;
  };
  const auto [start, rows] = rows_of(B, dp, mesh.rank("dp"));
  const Tensor y_rows = ops::contiguous(y.narrow(0, start, rows));
  const Tensor x_local = local(ops::contiguous(x.narrow(0, start, rows)));
  const Tensor y_local = local(y_rows);
  // GPT::loss under LossParallel is the mean over this dp rank's targets (all its cp
  // chunks); weighted by their share of the batch's it is the dp rank's part of the mean
  // (times dp under DDP, which averages).
  int64_t mine = 0;
  for (int64_t t : y_rows.to_vector<int64_t>()) mine += t != -1;
  const double weight = static_cast<double>(mine) / static_cast<double>(targets) * (ddp ? dp : 1);
  std::shared_ptr<parallel::DistributedDataParallel> wrapped;
  auto model = std::shared_ptr<GPT>(&gpt, [](GPT*) {});
  if (ddp) wrapped = std::make_shared<parallel::DistributedDataParallel>(model, mesh.group("dp"));
  const auto part_of = [&](const std::string& name, const Tensor& full) {
    const parallel::ParameterSpec* spec = parallel::spec_of(gpt.parameter(name));
    return spec ? parallel::local_part(spec->pieces[0], full) : full;
  };

  optim::AdamW ref_opt(ref->parameters(), optim::AdamWOptions(1e-3));
  optim::AdamW opt(gpt.parameters(), optim::AdamWOptions(1e-3));
  SplitErrors out;
  for (int step = 0; step < 3; ++step) {
    ref_opt.zero_grad();
    const Tensor ref_loss = GPT::loss(ref->forward(x), y);
    ref_loss.backward();
    opt.zero_grad();
    Tensor loss;
    {
      parallel::LossParallel loss_parallel(mesh);
      loss = mul(GPT::loss(wrapped ? wrapped->forward(x_local) : gpt.forward(x_local), y_local), weight);
    }
    loss.backward();
    parallel::reduce_partial_gradients(gpt.parameters());  // tp (with SP) and cp sums (after DDP's: they commute)
    if (dp > 1) {
      if (!ddp) sum_over_dp(gpt.parameters(), *mesh.group("dp"));
      loss = parallel::context_parallel::sum_over_group(loss.detach(), *mesh.group("dp"));
      if (ddp) loss = loss / static_cast<double>(dp);
    }
    if (step == 0) {
      out.loss_error = std::abs(as_double(loss) - as_double(ref_loss)) / std::abs(as_double(ref_loss));
      out.compare_grads(gpt.named_parameters(), [&](const std::string& name) {
        return part_of(name, ref->parameter(name).grad());
      });
    }
    ref_opt.step();
    opt.step();
  }
  NoGradGuard no_grad;
  out.compare_params(gpt.named_parameters(), [&](const std::string& name) {
    return part_of(name, ref->parameter(name));
  });
  return out;
}

void require_equal(const RankResult& r, const std::string& prefix, float grads, float params) {
  INFO("rank " << r.rank << ", " << prefix << ": " << r.text(prefix + " where"));
  const std::vector<float> e = r.floats(prefix + " errors");
  REQUIRE(e[0] <= grads);
  REQUIRE(e[1] <= grads);
  REQUIRE(e[2] <= params);
}

void require_caught(const RankResult& r, const std::string& prefix) {
  INFO("rank " << r.rank << ", " << prefix << ": " << r.text(prefix + " where"));
  const std::vector<float> e = r.floats(prefix + " errors");
  REQUIRE((e[0] >= 1e-3f || e[1] >= 1e-3f || e[2] >= 1e-3f));
}

// The tensor-parallel collectives of one float32 step (forward, loss, backward, the
// partial sums) of the composed model on [B, T].
std::vector<float> tp_collectives(const parallel::DeviceMesh& mesh, int64_t B, int64_t T, bool sp) {
  manual_seed(7);
  GPT gpt(tiny());
  const Tensor x = randint(0, 18, {B, T}), y = randint(0, 18, {B, T});
  models::parallelize_gpt(gpt, mesh, sp);
  const auto local = [&](const Tensor& t) {
    return parallel::context_parallel::shard_sequence(t, mesh.rank("cp"), mesh.size("cp"));
  };
  const parallel::TensorParallelGroupPtr tp = parallel::tensor_parallel_group(mesh.group("tp"));
  tp->reset_stats();
  {
    parallel::LossParallel loss_parallel(mesh);
    GPT::loss(gpt.forward(local(x)), local(y)).backward();
  }
  // The sums over tp (with SP) alone: the cp group's are another group's traffic.
  std::vector<Tensor> tp_partial;
  for (const Tensor& p : gpt.parameters())
    for (const parallel::DimPlacement& d : parallel::spec_of(p)->pieces[0].placements)
      if (d.dim == "tp" && d.partial_gradient) tp_partial.push_back(p);
  parallel::reduce_partial_gradients(tp_partial);
  const parallel::TensorParallelStats s = tp->stats();
  return {static_cast<float>(s.all_reduces),     static_cast<float>(s.all_reduce_bytes),
          static_cast<float>(s.all_gathers),     static_cast<float>(s.all_gather_bytes),
          static_cast<float>(s.reduce_scatters), static_cast<float>(s.reduce_scatter_bytes)};
}

// The message of what `f` throws, or "" when it does not.
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

TEST_CASE("GPT cp2 x tp2 on 4 Gloo ranks equals the single-device GPT, unsummed gradients "
          "are caught, impossible splits refused", "[gpt_mesh]") {
  auto results = run_ranks(4, [](RankContext& ctx) {
    parallel::DeviceMesh mesh(ctx.gloo(), {{"cp", 2}, {"tp", 2}});
    report_errors(ctx, "cp2tp2", against_single_device(mesh, tiny(), 3, 8, false, DType::Float64));
    report_errors(ctx, "cp2tp2 sp", against_single_device(mesh, tiny(), 3, 12, true, DType::Float64));
    report_errors(ctx, "cp2tp2 f32",
           against_single_device(mesh, tiny(false), 3, 8, true, DType::Float32));
    {
      testing::FaultGuard fault(testing::Fault::ContextParallelGradsNotReduced);
      report_errors(ctx, "cp fault", against_single_device(mesh, tiny(), 3, 8, false, DType::Float64));
    }
    {
      testing::FaultGuard fault(testing::Fault::SequenceParallelGradsNotReduced);
      report_errors(ctx, "sp fault", against_single_device(mesh, tiny(), 3, 8, true, DType::Float64));
    }
    ctx.report("collectives", tp_collectives(mesh, 3, 8, false));
    ctx.report("collectives sp", tp_collectives(mesh, 3, 8, true));
    // Errors are raised before any collective, on every rank alike.
    manual_seed(5);
    GPT gpt(tiny(true));
    models::parallelize_gpt(gpt, mesh, false);
    ctx.report("odd chunks", error_of([&] { gpt.forward(randint(0, 18, {2, 3})); }));
    GPT dropping(tiny(true, 0.1));
    ctx.report("dropout", error_of([&] { models::parallelize_gpt(dropping, mesh, false); }));
    ctx.report("shard", error_of([&] {
      parallel::context_parallel::shard_sequence(randint(0, 18, {2, 6}), mesh.rank("cp"), 2);
    }));
  });
  INFO(describe(results));
  for (const RankResult& r : results) {
    REQUIRE(r.ok());
    require_equal(r, "cp2tp2", 1e-10f, 1e-12f);
    require_equal(r, "cp2tp2 sp", 1e-10f, 1e-12f);
    require_equal(r, "cp2tp2 f32", 1e-5f, 2e-5f);
    require_caught(r, "cp fault");
    require_caught(r, "sp fault");
    // The tp group's traffic is tensor parallelism's alone (test_gpt_tensor_parallel.cpp
    // derives the counts) on this rank's rows B x T/cp = 3 x 4: cp adds nothing to it.
    // L = 2 blocks, C = 10, float32; with SP the replicated parameters: wpe 16 x 10, per
    // block 2 LayerNorms (2 x 20) and 2 row biases (2 x 10), ln_f 20.
    const float L = 2, rows = 3 * 4, C = 10, replicated = 16 * 10 + L * (40 + 20) + 20;
    REQUIRE(r.floats("collectives") ==
            std::vector<float>{4 * L + 3, 4 * ((2 * L + 1) * rows * C * 2 + 2 * rows), 1,
                               4 * rows, 0, 0});
    REQUIRE(r.floats("collectives sp") ==
            std::vector<float>{2, 4 * (2 * rows + replicated), 4 * L + 3,
                               4 * ((4 * L + 2) * rows / 2 * C + rows), 4 * L + 2,
                               4 * ((4 * L + 2) * rows * C)});
    REQUIRE_THAT(r.text("odd chunks"),
                 MG_CONTAINS("ContextParallelPositions: a sequence of length 6 does not cut into 2 * cp = 4 "
                             "equal chunks"));
    REQUIRE_THAT(r.text("dropout"), MG_CONTAINS("parallelize_gpt: no dropout under context parallelism (cp = 2), got dropout 0.1"));
    REQUIRE_THAT(r.text("shard"), MG_CONTAINS("shard_sequence: a sequence of length 6"));
  }
}

TEST_CASE("GPT dp2 x cp2 x tp2 on 8 Gloo ranks (uneven batch rows) equals the single-device "
          "GPT, unsummed cp gradients are caught", "[gpt_mesh]") {
  auto results = run_ranks(8, [](RankContext& ctx) {
    parallel::DeviceMesh mesh(ctx.gloo(), {{"dp", 2}, {"cp", 2}, {"tp", 2}});
    // B = 5: dp rank 0 takes 3 rows, dp rank 1 takes 2; T = 12: cp chunks of 3, SP 3 each.
    report_errors(ctx, "3d", against_single_device(mesh, tiny(), 5, 12, false, DType::Float64));
    report_errors(ctx, "3d sp", against_single_device(mesh, tiny(), 5, 12, true, DType::Float64));
    report_errors(ctx, "3d ddp f32",
           against_single_device(mesh, tiny(false), 5, 12, true, DType::Float32, true));
    testing::FaultGuard fault(testing::Fault::ContextParallelGradsNotReduced);
    report_errors(ctx, "3d fault", against_single_device(mesh, tiny(), 5, 12, true, DType::Float64));
  });
  INFO(describe(results));
  for (const RankResult& r : results) {
    REQUIRE(r.ok());
    require_equal(r, "3d", 1e-10f, 1e-12f);
    require_equal(r, "3d sp", 1e-10f, 1e-12f);
    require_equal(r, "3d ddp f32", 1e-5f, 2e-5f);
    require_caught(r, "3d fault");
  }
}

#endif  // MINIGRAD_WITH_GLOO
