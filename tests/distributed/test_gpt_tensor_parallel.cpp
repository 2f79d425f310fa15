// The GPT split by tensor parallelism -- its plan (models/gpt_plan.h) applied by
// parallelize_module -- on Gloo ranks, proven against the single-device GPT on the whole
// batch: every rank builds the GPT with the same seed, keeps a copy as the reference, runs 3
// AdamW steps on both, and compares the loss, every gradient of the first step (each shard
// against the matching part of the reference's gradient, as its placement cuts it:
// parallel::local_part) and the parameters after the last step. dp x tp adds a data-parallel split of the batch rows (uneven) with the gradients
// summed over the mesh's dp group. Faults (core/fault_injection.h) must break the match.
// Also: the collectives of a step against the arithmetic, dropout's masks by region, and
// the errors for impossible splits.
//
// Float32: Gloo reduces float32 only (AdamW takes float64, the process groups do not).
// Tolerances: the sums over C, 4C and the vocabulary run in another order on the shards:
// gradients agree to ~6e-7 relative (held to 1e-5). After 3 AdamW steps of lr 1e-3 the
// parameters agree to ~2e-6 absolute (held to 2e-5, a fiftieth of one step): the worst is
// c_attn's key bias, whose exact gradient is 0 (softmax ignores a constant per query), so
// Adam scales rounding noise up to a step. A fault moves something by a whole step (1e-3)
// or more.
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

GPTConfig tiny(int64_t n_head, int64_t n_embd, double dropout = 0.0) {
  GPTConfig c;
  c.block_size = 8;
  c.vocab_size = 24;
  c.n_layer = 2;
  c.n_head = n_head;
  c.n_embd = n_embd;
  c.dropout = dropout;
  return c;
}

struct Batch {
  Tensor x, y;
  int64_t targets = 0;  // not ignored (-1)
};

Batch make_batch(const GPTConfig& c, int64_t B, int64_t T) {
  Batch b;
  b.x = randint(0, c.vocab_size, {B, T});
  std::vector<int64_t> y = randint(0, c.vocab_size, {B, T}).to_vector<int64_t>();
  for (size_t i = 3; i < y.size(); i += 7) y[i] = -1;  // some ignored targets, as nanoGPT's -1
  for (int64_t t : y) b.targets += t != -1 ? 1 : 0;
  b.y = from_vector(y, Shape{B, T});
  return b;
}


// The part of the single-device tensor `full` that this rank's parameter `p` holds.
Tensor part_of(const Tensor& p, const Tensor& full) {
  const parallel::ParameterSpec* spec = parallel::spec_of(p);
  return spec ? parallel::local_part(spec->pieces[0], full) : full;
}

// The check one rank runs: the GPT split by its plan over `mesh` (tp, and dp when the mesh
// has it) on its rows (all of them without dp) against the single-device GPT on the whole
// batch.
SplitErrors against_single_device(const GPTConfig& config, int64_t B, int64_t T, const parallel::DeviceMesh& mesh,
                                  bool sp, bool ddp = false) {
  manual_seed(1234);
  auto model = std::make_shared<GPT>(config);
  const Batch batch = make_batch(config, B, T);
  auto ref = std::static_pointer_cast<GPT>(model->clone());
  models::parallelize_gpt(*model, mesh, sp);
  const std::shared_ptr<parallel::ProcessGroup> dp = mesh.has_dim("dp") ? mesh.group("dp") : nullptr;
  const auto [start, rows] = rows_of(B, dp ? dp->size() : 1, dp ? dp->rank() : 0);
  const Tensor x = ops::contiguous(batch.x.narrow(0, start, rows));
  const Tensor y = ops::contiguous(batch.y.narrow(0, start, rows));
  int64_t mine = 0;  // this rank's targets that count
  for (int64_t t : y.to_vector<int64_t>()) mine += t != -1;
  // GPT::loss is the mean over this rank's targets; weighted by their share of the batch's
  // it is this rank's part of the whole batch's mean (times dp under DDP, which averages).
  std::shared_ptr<parallel::DistributedDataParallel> wrapped;
  if (ddp) wrapped = std::make_shared<parallel::DistributedDataParallel>(model, dp);
  const double weight = static_cast<double>(mine) / static_cast<double>(batch.targets) * (ddp ? dp->size() : 1);

  optim::AdamW ref_opt(ref->parameters(), optim::AdamWOptions(1e-3));
  optim::AdamW opt(model->parameters(), optim::AdamWOptions(1e-3));
  SplitErrors out;
  for (int step = 0; step < 3; ++step) {
    ref_opt.zero_grad();
    const Tensor ref_loss = GPT::loss(ref->forward(batch.x), batch.y);
    ref_loss.backward();
    opt.zero_grad();
    Tensor loss;
    {
      parallel::LossParallel loss_parallel(mesh);  // the logits are this rank's vocabulary
      loss = mul(GPT::loss(wrapped ? wrapped->forward(x) : model->forward(x), y), weight);
    }
    loss.backward();  // DDP: the dp average of the gradients, in buckets during backward
    // The partial gradients (sequence parallelism's) summed over tp: it commutes with DDP's average.
    parallel::reduce_partial_gradients(model->parameters());
    if (dp) {  // the data-parallel ranks' losses are parts of a sum (DDP: of a mean)
      loss = ops::clone(loss.detach());
      dp->allreduce(loss, ddp ? parallel::ReduceOp::Average : parallel::ReduceOp::Sum)->wait();
    }
    if (dp && !ddp) {  // plain data parallelism: the gradients summed
      std::vector<Tensor> grads;
      for (const Tensor& p : model->parameters()) grads.push_back(p.grad());
      dp->allreduce(grads)->wait();
    }
    if (step == 0) {
      out.loss_error = std::abs(loss.item<float>() - ref_loss.item<float>()) /
                       std::abs(ref_loss.item<float>());
      out.compare_grads(model->named_parameters(), [&](const std::string& name) {
        return part_of(model->parameter(name), ref->parameter(name).grad());
      });
    }
    ref_opt.step();
    opt.step();
  }
  NoGradGuard no_grad;
  out.compare_params(model->named_parameters(), [&](const std::string& name) {
    return part_of(model->parameter(name), ref->parameter(name));
  });
  return out;
}

// A mesh of tp alone over `world`.
parallel::DeviceMesh tp_mesh(const std::shared_ptr<parallel::ProcessGroup>& world) {
  return parallel::DeviceMesh(world, {{"tp", world->size()}});
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

// The collectives of one training step (forward, loss, backward, the partial sums), as
// the tensor-parallel layers' group counts them (one group per plan: the head's).
std::vector<float> step_collectives(const GPTConfig& config, int64_t B, int64_t T, const parallel::DeviceMesh& mesh,
                                    bool sp) {
  manual_seed(7);
  GPT model(config);
  const Batch batch = make_batch(config, B, T);
  models::parallelize_gpt(model, mesh, sp);
  const parallel::TensorParallelGroupPtr tp =
      std::static_pointer_cast<nn::ColumnParallelLinear>(model.child("lm_head"))->group();
  tp->reset_stats();
  {
    parallel::LossParallel loss_parallel(mesh);
    GPT::loss(model.forward(batch.x), batch.y).backward();
  }
  parallel::reduce_partial_gradients(model.parameters());
  const parallel::TensorParallelStats s = tp->stats();
  return {static_cast<float>(s.all_reduces),     static_cast<float>(s.all_reduce_bytes),
          static_cast<float>(s.all_gathers),     static_cast<float>(s.all_gather_bytes),
          static_cast<float>(s.reduce_scatters), static_cast<float>(s.reduce_scatter_bytes)};
}

}  // namespace

TEST_CASE("GPT tensor parallel over 2 Gloo ranks equals the single-device GPT, faults are caught",
          "[gpt_tp]") {
  const GPTConfig config = tiny(4, 16);
  auto results = run_ranks(2, [&](RankContext& ctx) {
    const parallel::DeviceMesh tp = tp_mesh(ctx.gloo());
    report_errors(ctx, "tp2", against_single_device(config, 3, 7, tp, false));
    {
      mg::testing::FaultGuard fault(mg::testing::Fault::VocabParallelLossNotReduced);
      report_errors(ctx, "loss fault", against_single_device(config, 3, 7, tp, false));
    }
    {
      mg::testing::FaultGuard fault(mg::testing::Fault::RowParallelBiasPerRank);
      report_errors(ctx, "row fault", against_single_device(config, 3, 7, tp, false));
    }
    ctx.report("collectives", step_collectives(config, 3, 6, tp, false));
  });
  INFO(describe(results));
  for (const RankResult& r : results) {
    REQUIRE(r.ok());
    require_equal(r, "tp2");
    require_caught(r, "loss fault");
    require_caught(r, "row fault");
    // Without sequence parallelism, L = 2 blocks, B x T = 3 x 6 rows, C = 16, float32:
    // forward: the embedding's all-reduce, 2 per block (the row layers), 1 in the loss (the
    // sum of exponentials and the target logit, 2 numbers a row); backward: 2 per block
    // (the column layers' copy_to_parallel) and the head's. One all-gather: the row maxima.
    const float L = 2, rows = 3 * 6, C = 16;
    REQUIRE(r.floats("collectives") ==
            std::vector<float>{4 * L + 3, 4 * ((2 * L + 1) * rows * C * 2 + 2 * rows), 1,
                               4 * rows, 0, 0});
  }
}

TEST_CASE("GPT tensor + sequence parallel over 2 Gloo ranks equals the single-device GPT, "
          "unreduced LayerNorm gradients are caught", "[gpt_tp]") {
  const GPTConfig config = tiny(4, 16);
  auto results = run_ranks(2, [&](RankContext& ctx) {
    const parallel::DeviceMesh tp = tp_mesh(ctx.gloo());
    report_errors(ctx, "sp", against_single_device(config, 3, 8, tp, true));
    {
      mg::testing::FaultGuard fault(mg::testing::Fault::SequenceParallelGradsNotReduced);
      report_errors(ctx, "sp fault", against_single_device(config, 3, 8, tp, true));
    }
    {
      mg::testing::FaultGuard fault(mg::testing::Fault::VocabParallelLossNotReduced);
      report_errors(ctx, "sp loss fault", against_single_device(config, 3, 8, tp, true));
    }
    ctx.report("collectives", step_collectives(config, 3, 6, tp, true));
  });
  INFO(describe(results));
  for (const RankResult& r : results) {
    REQUIRE(r.ok());
    require_equal(r, "sp");
    require_caught(r, "sp fault");
    require_caught(r, "sp loss fault");
    // L = 2, B x T = 3 x 6, C = 16, n = 2. Forward: an all-gather along T into each of the
    // 2L column layers and the head, a reduce-scatter out of the embedding and each of the
    // 2L row layers; backward the same with the two swapped. All-gathers carry the local
    // positions [B, T/n, C], reduce-scatters the whole [B, T, C]. Plus the loss's all-gather
    // (row maxima) and all-reduce, and reduce_partial_gradients' one all-reduce of the replicated
    // parameters: wpe 8 x 16, per block 2 LayerNorms (2 x 32) and 2 row biases (2 x 16),
    // ln_f 32.
    const float L = 2, rows = 3 * 6, C = 16, replicated = 8 * 16 + L * (64 + 32) + 32;
    REQUIRE(r.floats("collectives") ==
            std::vector<float>{2, 4 * (2 * rows + replicated), 4 * L + 3,
                               4 * ((4 * L + 2) * rows / 2 * C + rows), 4 * L + 2,
                               4 * ((4 * L + 2) * rows * C)});
  }
}

TEST_CASE("GPT tensor parallel over 3 and 4 Gloo ranks equals the single-device GPT", "[gpt_tp]") {
  auto three = run_ranks(3, [](RankContext& ctx) {
    report_errors(ctx, "tp3", against_single_device(tiny(3, 12), 2, 5, tp_mesh(ctx.gloo()), false));
  });
  INFO(describe(three));
  for (const RankResult& r : three) {
    REQUIRE(r.ok());
    require_equal(r, "tp3");
  }
  auto four = run_ranks(4, [](RankContext& ctx) {
    report_errors(ctx, "tp4", against_single_device(tiny(4, 16), 2, 5, tp_mesh(ctx.gloo()), false));
  });
  INFO(describe(four));
  for (const RankResult& r : four) {
    REQUIRE(r.ok());
    require_equal(r, "tp4");
  }
}

TEST_CASE("GPT dp2 x tp2 (uneven batch rows, gradients summed over the dp group, and "
          "DistributedDataParallel) equals the single-device GPT", "[gpt_tp]") {
  auto results = run_ranks(4, [](RankContext& ctx) {
    auto world = ctx.gloo();
    parallel::DeviceMesh mesh(world, {{"dp", 2}, {"tp", 2}});
    // B = 5: dp rank 0 takes 3 rows, dp rank 1 takes 2.
    report_errors(ctx, "dp2tp2", against_single_device(tiny(4, 16), 5, 6, mesh, false));
    report_errors(ctx, "dp2tp2 sp", against_single_device(tiny(4, 16), 5, 6, mesh, true));
    // DistributedDataParallel over the dp group, with and without SP: its average is the
    // single-device mean for uneven rows too, with each rank dividing by targets / dp.
    report_errors(ctx, "dp2tp2 ddp", against_single_device(tiny(4, 16), 5, 6, mesh, false, true));
    report_errors(ctx, "dp2tp2 ddp sp", against_single_device(tiny(4, 16), 5, 6, mesh, true, true));
  });
  INFO(describe(results));
  for (const RankResult& r : results) {
    REQUIRE(r.ok());
    require_equal(r, "dp2tp2");
    require_equal(r, "dp2tp2 sp");
    require_equal(r, "dp2tp2 ddp");
    require_equal(r, "dp2tp2 ddp sp");
  }
}

TEST_CASE("GPT tensor parallel dropout: one mask where activations are replicated, a mask per "
          "rank where they are sharded", "[gpt_tp]") {
  // Megatron's rule, checked as Megatron's tests do (no single-device twin can draw the
  // same masks: its attention dropout is one draw over all heads): with dropout on, the
  // replicated activations (ln_f's output without sequence parallelism) stay identical on
  // every rank, and dropout actually acted; the sharded regions' generator draws a
  // different mask on each rank, the default generator the same one.
  auto results = run_ranks(2, [](RankContext& ctx) {
    const parallel::DeviceMesh mesh = tp_mesh(ctx.gloo());
    manual_seed(99);
    GPT model(tiny(4, 16, 0.3));
    const Tensor x = randint(0, 24, {2, 8});
    models::parallelize_gpt(model, mesh, false);
    auto tp = std::static_pointer_cast<nn::ColumnParallelLinear>(model.child("lm_head"))->group();
    NoGradGuard no_grad;
    const Tensor train = (*model.child("transformer"))(x);  // ln_f's output: replicated
    model.eval();
    const Tensor eval = (*model.child("transformer"))(x);
    const Tensor both = tp->all_gather(train);  // [2, B, T, C]
    const auto gap = [](const Tensor& a, const Tensor& b) { return max_abs(a - b); };
    const auto masks = [&](Generator* gen) {
      const Tensor m = tp->all_gather(dropout(ones({256}), 0.5, true, gen));
      return gap(ops::narrow(m, 0, 0, 1), ops::narrow(m, 0, 1, 1));
    };
    // The attention's dropout draws from the generator the plan gave it (ShardedDropout).
    Generator* sharded = static_cast<const nn::Dropout&>(
                             *model.child("transformer")->child("h")->child("0")->child("attn")->child("attn_dropout"))
                             .generator();
    ctx.report("dropout", std::vector<float>{
        static_cast<float>(gap(ops::narrow(both, 0, 0, 1), ops::narrow(both, 0, 1, 1))),
        static_cast<float>(gap(train, eval)),
        static_cast<float>(masks(sharded)),
        static_cast<float>(masks(nullptr))});
  });
  INFO(describe(results));
  for (const RankResult& r : results) {
    REQUIRE(r.ok());
    const std::vector<float> d = r.floats("dropout");
    REQUIRE(d[0] == 0.0f);  // replicated: bit-identical across the ranks
    REQUIRE(d[1] > 0.1f);   // and dropout did act
    REQUIRE(d[2] > 0.0f);   // sharded regions: the ranks' masks differ
    REQUIRE(d[3] == 0.0f);  // the default generator: one mask
  }
}

TEST_CASE("GPT tensor parallel refuses impossible splits", "[gpt_tp]") {
  auto results = run_ranks(3, [](RankContext& ctx) {
    const parallel::DeviceMesh mesh = tp_mesh(ctx.gloo());
    manual_seed(1);
    std::string heads, vocab, sequence;
    try {
      GPT gpt(tiny(4, 12));  // 4 heads over 3 ranks
      models::parallelize_gpt(gpt, mesh, false);
    } catch (const Error& e) {
      heads = e.what();
    }
    try {
      GPTConfig c = tiny(3, 12);
      c.vocab_size = 25;
      GPT gpt(c);
      models::parallelize_gpt(gpt, mesh, false);
    } catch (const Error& e) {
      vocab = e.what();
    }
    try {
      GPT gpt(tiny(3, 12));
      models::parallelize_gpt(gpt, mesh, true);
      gpt.forward(randint(0, 24, {2, 5}));
    } catch (const Error& e) {
      sequence = e.what();
    }
    ctx.report("heads", heads);
    ctx.report("vocab", vocab);
    ctx.report("sequence", sequence);
  });
  INFO(describe(results));
  for (const RankResult& r : results) {
    REQUIRE(r.ok());
    CHECK_THAT(r.text("heads"), MG_CONTAINS("parallelize_gpt: n_head (attention is split by heads) = 4 is not "
                                            "divisible by the tensor-parallel size 3"));
    CHECK_THAT(r.text("vocab"), MG_CONTAINS("vocab_size (the embedding and the logits are split by vocabulary; "
                                            "choose a multiple, as nanoGPT pads 50257 to 50304) = 25 is not "
                                            "divisible by the tensor-parallel size 3"));
    CHECK_THAT(r.text("vocab"), MG_CONTAINS("minigrad refuses uneven shards rather than padding them"));
    CHECK_THAT(r.text("sequence"), MG_CONTAINS("the sequence length T = 5"));
    CHECK_THAT(r.text("sequence"), MG_CONTAINS("sequence parallelism needs T to be a multiple of 3"));
  }
}

#endif  // MINIGRAD_WITH_GLOO
