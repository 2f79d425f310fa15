// Mixed precision across Gloo ranks: DDP reduces float32 gradients under autocast by
// default and, with torch's bf16_compress_hook, bfloat16 ones rounded where the hook
// rounds them; FSDP's MixedPrecisionPolicy (bfloat16 compute, float32 reduction and
// shards) and ZeRO-2 over bfloat16 parameters with float32 master shards, each bit for bit
// the arithmetic it promises; amp::GradScaler's found-inf decided over the ranks, so that
// one rank's inf skips the step on every rank under DDP, ZeRO-1, ZeRO-2 and FSDP.
#ifdef MINIGRAD_WITH_GLOO

#include <cmath>
#include <limits>
#include <optional>

#include "catch_compat.h"
#include "multiprocess.h"

#include <minigrad/autograd/autocast.h>
#include <minigrad/autograd/functions.h>
#include <minigrad/core/generator.h>
#include <minigrad/core/ops.h>
#include <minigrad/nn/amp/grad_scaler.h>
#include <minigrad/nn/layers.h>
#include <minigrad/nn/optim/adam.h>
#include <minigrad/nn/optim/master_weights.h>
#include <minigrad/nn/optim/sgd.h>
#include <minigrad/parallel/c10d/gloo/process_group_gloo.h>
#include <minigrad/parallel/ddp/distributed_data_parallel.h>
#include <minigrad/parallel/sharded/fully_shard.h>
#include <minigrad/parallel/sharded/zero_redundancy_optimizer.h>

using namespace mg;
using namespace mg::parallel;
using namespace mg::test;

namespace {

constexpr int64_t kIn = 6, kClasses = 3, kRows = 4;

std::shared_ptr<nn::Sequential> make_net() {
  manual_seed(2024);
  return std::make_shared<nn::Sequential>(std::initializer_list<nn::ModulePtr>{
      std::make_shared<nn::Linear>(kIn, 16), std::make_shared<nn::ReLU>(), std::make_shared<nn::Linear>(16, kClasses)});
}

// Rank r's rows.
std::pair<Tensor, Tensor> batch_of(int rank) {
  manual_seed(100 + static_cast<uint64_t>(rank));
  return {randn(Shape{kRows, kIn}), randint(0, kClasses, Shape{kRows})};
}

std::vector<float> flat(const std::vector<Tensor>& tensors, bool grads) {
  std::vector<float> out;
  for (const Tensor& t : tensors) {
    const Tensor v = ops::to_dtype(ops::contiguous(grads ? t.grad() : t), DType::Float32);
    const auto x = v.to_vector<float>();
    out.insert(out.end(), x.begin(), x.end());
  }
  return out;
}

float round_to(float x, DType dtype) {
  return ops::to_dtype(ops::to_dtype(from_vector(std::vector<float>{x}, Shape{1}), dtype), DType::Float32)
      .to_vector<float>()[0];
}

}  // namespace

TEST_CASE("DDP under autocast reduces float32 gradients and bf16_compress_hook rounds them as torch's hook") {
  for (CommHook hook : {CommHook::AllReduce, CommHook::BF16Compress, CommHook::FP16Compress}) {
    DYNAMIC_SECTION("hook " << static_cast<int>(hook)) {
      auto results = run_ranks(2, [hook](RankContext& ctx) {
        auto net = make_net();
        DDPOptions options;
        options.comm_hook = hook;
        auto ddp = std::make_shared<DistributedDataParallel>(net, ctx.gloo(), options);
        const auto [x, y] = batch_of(ctx.rank);
        // This rank's own gradient first (no_sync: not reduced), then the reduced one.
        for (bool reduce : {false, true}) {
          net->zero_grad();
          Tensor loss;
          {
            std::optional<DistributedDataParallel::NoSyncGuard> local;
            if (!reduce) local.emplace(*ddp);
            AutocastGuard autocast(DeviceType::CPU, DType::BFloat16);
            loss = cross_entropy(ddp->forward(x), y);
          }
          loss.backward();
          for (const Tensor& p : net->parameters())
            MG_CHECK(p.grad().dtype() == DType::Float32, "a gradient is {}", p.grad().dtype());
          ctx.report(reduce ? "reduced" : "local", flat(net->parameters(), true));
        }
        ctx.report("bytes", std::vector<float>{static_cast<float>(ddp->reducer().last_stats().bytes)});
      });
      INFO(describe(results));
      for (const RankResult& r : results) REQUIRE(r.ok());
      const auto g0 = results[0].floats("local"), g1 = results[1].floats("local");
      const DType wire = hook == CommHook::BF16Compress ? DType::BFloat16 : DType::Float16;
      for (const RankResult& r : results) {
        const auto got = r.floats("reduced");
        REQUIRE(got.size() == g0.size());
        CHECK(r.floats("bytes")[0] == static_cast<float>(got.size() * (hook == CommHook::AllReduce ? 4 : 2)));
        for (size_t i = 0; i < got.size(); ++i) {
          INFO("element " << i);
          if (hook == CommHook::AllReduce) {  // float32: (g0 + g1) * 1/2, as Gloo averages
            CHECK(got[i] == (g0[i] + g1[i]) * 0.5f);
          } else {  // each rank's gradient rounded, summed in float32, the mean rounded once
            CHECK(got[i] == round_to((round_to(g0[i], wire) + round_to(g1[i], wire)) * 0.5f, wire));
          }
        }
      }
    }
  }
}

// Rank r's gradients of a bfloat16 copy of the model on its rows, as float32: what each
// rank computes under the mixed-precision forms below (the input cast to bfloat16, the
// logits to float32 when `float_logits`).
std::vector<Tensor> bf16_gradients(int rank, bool float_logits) {
  auto net = make_net();
  net->to(DType::BFloat16);
  const auto [x, y] = batch_of(rank);
  const Tensor logits = net->forward(to(x, DType::BFloat16));
  cross_entropy(float_logits ? to(logits, DType::Float32) : logits, y).backward();
  std::vector<Tensor> out;
  for (const Tensor& p : net->parameters()) out.push_back(ops::to_dtype(p.grad(), DType::Float32));
  return out;
}

TEST_CASE("fully_shard with MixedPrecisionPolicy bfloat16 compute and float32 reduction is that arithmetic bit for bit") {
  // torchtitan's policy: each rank computes in bfloat16 (its unit gathered from the float32
  // shards rounded), its gradients are reduce-scattered in float32 into the float32 shard's
  // gradient, and SGD steps the float32 shard: the shard's gradient is exactly
  // (g0 + g1) / 2 of the two ranks' bfloat16 gradients widened, Gloo's float32 average.
  auto results = run_ranks(2, [](RankContext& ctx) {
    auto net = make_net();
    FSDPOptions options;
    options.mp_policy.param_dtype = DType::BFloat16;
    options.mp_policy.reduce_dtype = DType::Float32;
    options.mp_policy.output_dtype = DType::Float32;
    auto fsdp = fully_shard(net, ctx.gloo(), options);
    MG_CHECK(fsdp->parameters()[0].dtype() == DType::Float32, "the shard is {}", fsdp->parameters()[0].dtype());
    const auto [x, y] = batch_of(ctx.rank);
    const Tensor logits = (*net)(x);  // a float32 batch, cast to bfloat16 by the policy
    MG_CHECK(logits.dtype() == DType::Float32, "the logits are {}", logits.dtype());
    for (const Tensor& p : net->parameters())
      MG_CHECK(p.dtype() == DType::BFloat16, "a gathered parameter is {}", p.dtype());
    cross_entropy(logits, y).backward();
    const Tensor grad = fsdp->parameters()[0].grad();
    MG_CHECK(grad.dtype() == DType::Float32, "the shard's gradient is {}", grad.dtype());
    // What it should be: both ranks' bfloat16 gradients, averaged in float32, laid out flat.
    const FlatParameter& flat = fsdp->unit(0);
    Tensor want = zeros(Shape{flat.layout().padded_numel()});
    const std::vector<Tensor> g0 = bf16_gradients(0, true), g1 = bf16_gradients(1, true);
    for (size_t k = 0; k < g0.size(); ++k)
      ops::copy_(flat.slot(want, k), ops::binary_scalar(BinaryOp::Mul, ops::binary(BinaryOp::Add, g0[k], g1[k]), 0.5));
    ctx.report("got", grad);
    ctx.report("want", ops::narrow(want, 0, flat.layout().shard_begin(ctx.rank), flat.layout().shard_numel));
    ctx.report("all-gather bytes", std::vector<float>{static_cast<float>(fsdp->stats().all_gather_bytes)});
    ctx.report("elements", std::vector<float>{static_cast<float>(flat.layout().padded_numel())});
  });
  INFO(describe(results));
  for (const RankResult& r : results) {
    REQUIRE(r.ok());
    CHECK(r.floats("got") == r.floats("want"));
    // Gathered in bfloat16: 2 bytes an element, once (the root's unit stays gathered from
    // its forward to its backward).
    CHECK(r.floats("all-gather bytes")[0] == 2 * r.floats("elements")[0]);
  }
}

TEST_CASE("ZeRO-2 over bfloat16 parameters with float32 master shards steps as MasterWeights on the averaged gradient") {
  // llm.c's way sharded: bfloat16 parameters and gradients, the gradients reduce-scattered
  // (over Gloo summed in float32 and rounded once to bfloat16), and each rank's
  // MasterWeights(SGD) stepping float32 masters of its shard only. The result: a single
  // MasterWeights(SGD) given that rounded average, bit for bit.
  auto results = run_ranks(2, [](RankContext& ctx) {
    auto net = make_net();
    net->to(DType::BFloat16);
    ZeroOptions z;
    z.stage = 2;
    const auto sgd_masters = [](std::vector<Tensor> shards) -> std::unique_ptr<optim::Optimizer> {
      return std::make_unique<optim::MasterWeights>(std::move(shards), [](std::vector<Tensor> masters) {
        return std::make_unique<optim::SGD>(std::move(masters), 0.5);
      });
    };
    ZeroRedundancyOptimizer zero(net->parameters(), ctx.gloo(), sgd_masters, z);
    MG_CHECK(zero.parameters()[0].dtype() == DType::BFloat16, "the shard is {}", zero.parameters()[0].dtype());
    const auto [x, y] = batch_of(ctx.rank);
    zero.zero_grad();
    cross_entropy(net->forward(to(x, DType::BFloat16)), y).backward();
    zero.step();
    // The reference: one MasterWeights(SGD) over a bfloat16 model, given the average.
    auto ref = make_net();
    ref->to(DType::BFloat16);
    optim::MasterWeights ref_opt(ref->parameters(), [](std::vector<Tensor> masters) {
      return std::make_unique<optim::SGD>(std::move(masters), 0.5);
    });
    const std::vector<Tensor> g0 = bf16_gradients(0, false), g1 = bf16_gradients(1, false);
    for (size_t k = 0; k < g0.size(); ++k) {
      const Tensor mean = ops::binary_scalar(BinaryOp::Mul, ops::binary(BinaryOp::Add, g0[k], g1[k]), 0.5);
      ref->parameters()[k].set_grad(ops::to_dtype(mean, DType::BFloat16));
    }
    ref_opt.step();
    ctx.report("got", flat(net->parameters(), false));
    ctx.report("want", flat(ref->parameters(), false));
    ctx.report("before", flat(make_net()->parameters(), false));
  });
  INFO(describe(results));
  for (const RankResult& r : results) {
    REQUIRE(r.ok());
    CHECK(r.floats("got") == r.floats("want"));
    CHECK(r.floats("got") != r.floats("before"));
  }
}

TEST_CASE("GradScaler across ranks: one rank's inf skips the step on every rank under DDP and ZeRO and FSDP") {
  // Rank 1 finds an inf in its gradients (written there after backward, as an overflow in
  // its part of the model would leave it). With reduce_found_inf summing the flag over the
  // group every rank skips: parameters and AdamW state untouched, the scale halved
  // everywhere. Without it rank 0 steps alone and the replicas part -- the fault the
  // agreement exists for.
  // (Alone is shown under DDP and FSDP only: under ZeRO rank 0's step would wait in its
  // all-gather for a rank that skipped.)
  enum class Form { DDP, Zero1, Zero2, FSDP };
  for (Form form : {Form::DDP, Form::Zero1, Form::Zero2, Form::FSDP}) {
    for (bool agree : {true, false}) {
      if (!agree && (form == Form::Zero1 || form == Form::Zero2)) continue;
      DYNAMIC_SECTION("form " << static_cast<int>(form) << (agree ? " agreeing" : " alone")) {
        auto results = run_ranks(2, [form, agree](RankContext& ctx) {
          auto pg = ctx.gloo();
          auto net = make_net();
          nn::ModulePtr forward = net;
          std::unique_ptr<optim::Optimizer> opt;
          std::shared_ptr<FSDPModule> fsdp;
          const auto adamw = [](std::vector<Tensor> params) {
            return std::make_unique<optim::AdamW>(std::move(params), optim::AdamWOptions(1e-2));
          };
          if (form == Form::DDP || form == Form::Zero1) forward = std::make_shared<DistributedDataParallel>(net, pg);
          if (form == Form::DDP) opt = adamw(net->parameters());
          if (form == Form::Zero1 || form == Form::Zero2) {
            ZeroOptions z;
            z.stage = form == Form::Zero1 ? 1 : 2;
            opt = std::make_unique<ZeroRedundancyOptimizer>(net->parameters(), pg, adamw, z);
          }
          if (form == Form::FSDP) {
            fsdp = fully_shard(net, pg);
            opt = adamw(fsdp->parameters());
          }
          amp::GradScalerOptions options;
          if (agree) options.reduce_found_inf = [pg](Tensor& found_inf) { pg->allreduce({found_inf})->wait(); };
          amp::GradScaler scaler(options);
          // What the step writes: the parameters (DDP; ZeRO all-gathers into them) or the shards.
          const std::vector<Tensor> watched = fsdp ? opt->parameters() : net->parameters();
          const std::vector<float> before = flat(watched, false);
          const auto [x, y] = batch_of(ctx.rank);
          opt->zero_grad();
          Tensor loss;
          {
            AutocastGuard autocast(DeviceType::CPU, DType::Float16);
            loss = cross_entropy(form == Form::FSDP ? (*net)(x) : forward->forward(x), y);
          }
          scaler.scale(loss).backward();
          if (ctx.rank == 1) {  // the gradients the optimizer reads: ZeRO-1's full ones before its shards
            const std::vector<Tensor> holders = form == Form::DDP || form == Form::Zero1 ? net->parameters() : opt->parameters();
            for (const Tensor& p : holders) p.grad().fill_(std::numeric_limits<double>::infinity());
          }
          const bool stepped = scaler.step(*opt);
          scaler.update();
          ctx.report("stepped", std::vector<float>{stepped ? 1.0f : 0.0f});
          ctx.report("scale", std::vector<float>{static_cast<float>(scaler.get_scale())});
          ctx.report("changed", std::vector<float>{flat(watched, false) != before ? 1.0f : 0.0f});
          bool state = false;
          for (size_t i = 0; i < opt->parameters().size(); ++i) state = state || !opt->state(i).empty();
          ctx.report("state", std::vector<float>{state ? 1.0f : 0.0f});
        });
        INFO(describe(results));
        for (const RankResult& r : results) REQUIRE(r.ok());
        if (agree) {
          for (const RankResult& r : results) {
            INFO("rank " << r.rank);
            CHECK(r.floats("stepped")[0] == 0.0f);
            CHECK(r.floats("scale")[0] == 32768.0f);
            CHECK(r.floats("state")[0] == 0.0f);
            CHECK(r.floats("changed")[0] == 0.0f);
          }
        } else {  // rank 0 steps on its own, rank 1 skips: the scales and the states part
          CHECK(results[0].floats("stepped")[0] == 1.0f);
          CHECK(results[1].floats("stepped")[0] == 0.0f);
          CHECK(results[0].floats("scale")[0] == 65536.0f);
          CHECK(results[1].floats("scale")[0] == 32768.0f);
          CHECK(results[0].floats("changed")[0] == 1.0f);
          CHECK(results[1].floats("changed")[0] == 0.0f);
        }
      }
    }
  }
}

#endif  // MINIGRAD_WITH_GLOO
