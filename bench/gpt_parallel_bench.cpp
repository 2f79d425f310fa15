// gpt-parallel-bench: the accounting of issues 22/23, and the planner's validation: every
// formula below is minigrad/plan/gpt_formulas.h's, the one minigrad-plan prices splits with.
// The GPT on a dp x pp x cp x tp mesh
// (its plans over cp and tp, models/gpt_plan.h, then cut over pp and replicated over dp by
// parallel::MeshPipeline: every combination, each dimension possibly 1),
// a few AdamW steps, and per rank the measured quantities beside their arithmetic from the
// same run:
//
//   params, grads, AdamW   bytes of the tensors this rank holds (parameters, their .grad,
//                          AdamW's exp_avg + exp_avg_sq) against the shard formula:
//                          a block holds 12C²/tp + 7C/tp (sharded weights and column
//                          biases) + 6C (two LayerNorms, two row biases), stage 0 adds
//                          wte V C/tp + wpe block_size C, the last stage ln_f 2C and, when
//                          pp > 1, the head's copy of wte V C/tp. Exact.
//   collectives            every byte this rank hands to a collective or a send, counted
//                          by a ProcessGroup wrapper (CountingGroup below) under the world
//                          the mesh is built from, by group: tp, cp, dp, pp, the embedding
//                          group. Against the formulas of docs/gpt-tensor-parallel.md,
//                          docs/context-parallel.md and docs/gpt-pipeline.md. Exact.
//   activations            the allocator's peak during one train_step (forward+backward of
//                          every micro-batch) minus the bytes held before it (parameters,
//                          gradients kept, AdamW), against the activation formula below.
//   step time              the median train_step + AdamW step, and the single-device GPT's
//                          step on the whole batch (rank 0, same run, before the others).
//
// --zero 1|2|3: ZeRO over dp as train_gpt applies it on a mesh, through its own split
// (samples/support/split_model.h: ZeroRedundancyOptimizer over the mesh's dp group, two of
// them as nanoGPT's groups, or fully_shard per block for 3; the pipeline for pp > 1, ZeRO-1
// only), a step as train_gpt's loop runs it (loss_share and backward, or pipeline_step;
// reduce_gradients; the optimizers' step). The collectives alone are compared
// then (the bytes held under ZeRO are gpt-fsdp-bench's); every group's count against the
// planner's (plan::plan_gpt's stage_comm with the same split and workload, float32). The
// other runs compare with the same planner figures, which are the formulas' under DDP.
// --model-chunks v (v > 1, with --pp): the interleaved schedule, v chunks a rank, stepped
// through train_gpt's split as --zero runs are: its pp messages against the planner's.
// --precision bf16-mixed, 16-mixed or bf16-true: the step as train_gpt runs it (through its
// split): under autocast, 16-mixed with its loss scale and GradScaler (whose inf check is an
// all-reduce over every rank), bf16-true with bfloat16 weights and float32 master weights
// (optim::MasterWeights, ZeRO's shards); every group's bytes against the planner's for it.
// --grad-clip X: the gradient norm clipped each step as train_gpt clips it
// (parallel::clip_grad_norm_ over the mesh's world, after the gradients' reduction), and the
// world group counted beside the others against the planner's clip term.
//
// --model llama: the Llama (models/llama.h) of the same flags (--n-kv-head and
// --intermediate-size as train_gpt's), split by models::llama_split_spec and stepped through
// train_gpt's split as --zero runs are (DDP when --zero is 0): every group's collectives
// against the planner's for plan::LlamaArithmetic, exact (llama_formulas.h). The bytes held
// and the activation peak are not compared here: train_gpt's peak is, against the same
// terms at its moments (the ctest `train_gpt --model llama: each rank's peak within 5 %`).
//
// The activation formula, derived for this model (not Megatron's 34sbh + 5as²b, which
// counts 16-bit activations and dropout masks): float32 (4 bytes), dropout 0 (no masks),
// nanoGPT's pre-LN block with exact GELU, the fused attention keeping its output and one
// log-sum-exp per head and row (never the T x T probabilities). Floats per token, t = tp,
// a = n_head, C = n_embd, V = vocab:
//   a block   4C + 4 + 13C/t + a/t      (LN inputs and outputs, 2 x mean/rstd: replicated;
//                                        q k v, attention out, its contiguous copy, c_fc
//                                        out, GELU out: sharded; lse per local head)
//             with SP: 2C/t + 2C + 4/t + 13C/t + a/t  (the LN inputs are sharded, but the
//                                        column layers keep their all-gathered inputs whole;
//                                        Megatron re-gathers them in backward, minigrad
//                                        does not, so its SP saves (2 - 2/t)C less, not 4C(1 - 1/t))
//   the head  2C + 3V/t (ln_f in/out, logits, log-softmax, the logits' gradient);
//             with SP 2C/t + C + 3V/t
//   a stage without the head, at the first backward after the last forward: every
//             micro-batch's output handed on with its header and the input gradients sent
//             back before (held by their sends until the step's end), the received
//             gradient and the next one's (posted ahead), c_proj's backward (4C/t a token
//             and its weight and bias gradients, 4C²/t + C); the last stage: the gradients
//             sent back and the larger of the loss's moment and the last block's c_proj
//             backward (plan/gpt_formulas.h has each term)
//   dp or cp: the peak may be the gradients' sum after backward instead, a flat copy of the
//             stage's gradients and the all-reduce's (2 x 4 bytes an element)
// times the tokens: blocks x micro-batches in flight (1F1B: min(pp - stage, m)) x b T/cp / m.
//   cp > 1    the larger of that and ring attention's backward, a moment of its own (the
//             head's backward is over by then): one block fewer in full, the first block
//             going back keeping what its attention saved (2C + 2 + 4C/t + a/t), the ring's
//             working set 20C/t (dq, dk dv accumulating and travelling, k v arriving, each
//             message's flat copy, one block's gradients), 3C/t of gradients flowing in and
//             on the last stage the loss's logits of one chunk (V/2t).

//   build/bin/minigrad-run --nproc-per-node 4 build/bin/gpt-parallel-bench --dp 2 --tp 2
#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <map>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>
#include <fmt/format.h>

#include <minigrad/core/allocator.h>
#include <minigrad/core/ops.h>
#include <minigrad/minigrad.h>
#include <minigrad/models/gpt.h>
#include <minigrad/models/gpt_plan.h>
#include <minigrad/parallel/clip_grad.h>
#include <minigrad/parallel/loss_parallel.h>
#include <minigrad/parallel/pipeline/mesh_pipeline.h>
#include <minigrad/parallel/placement.h>
#include <minigrad/nn/optim/adam.h>
#include <minigrad/parallel/c10d/device_mesh.h>
#include <minigrad/parallel/c10d/rendezvous.h>
#include <minigrad/models/split_spec.h>
#include <minigrad/plan/gpt_formulas.h>
#include <minigrad/plan/planner.h>

#include "samples/support/command_line.h"
#include "samples/support/language_model.h"
#include "samples/support/precision.h"
#include "samples/support/split_model.h"

namespace {

using namespace mg;
using Clock = std::chrono::steady_clock;

// Bytes handed to collectives, per kind, by one group and its sub-groups' own counters.
struct Counts {
  int64_t all_reduce = 0, all_gather = 0, reduce_scatter = 0, broadcast = 0, send = 0, recv = 0;
  int64_t total() const { return all_reduce + all_gather + reduce_scatter + broadcast + send; }
};

int64_t bytes(const std::vector<Tensor>& ts) {
  int64_t n = 0;
  for (const Tensor& t : ts) n += static_cast<int64_t>(t.nbytes());
  return n;
}

// A ProcessGroup that counts this rank's input bytes and forwards everything. Its
// sub-groups are counting groups too, so the mesh's groups (made by new_group) count.
class CountingGroup : public parallel::ProcessGroup {
 public:
  explicit CountingGroup(std::shared_ptr<parallel::ProcessGroup> inner)
      : ProcessGroup(inner->rank(), inner->size()), inner_(std::move(inner)) {}
  std::string backend_name() const override { return inner_->backend_name(); }
  Device device() const override { return inner_->device(); }
  std::chrono::milliseconds timeout() const override { return inner_->timeout(); }
  std::shared_ptr<parallel::Work> allreduce(std::vector<Tensor> ts, parallel::ReduceOp op) override {
    counts.all_reduce += bytes(ts);
    return inner_->allreduce(std::move(ts), op);
  }
  std::shared_ptr<parallel::Work> broadcast(std::vector<Tensor> ts, int root) override {
    counts.broadcast += bytes(ts);
    return inner_->broadcast(std::move(ts), root);
  }
  std::shared_ptr<parallel::Work> barrier() override { return inner_->barrier(); }
  std::shared_ptr<parallel::Work> reduce_scatter(Tensor out, Tensor in, parallel::ReduceOp op) override {
    counts.reduce_scatter += static_cast<int64_t>(in.nbytes());
    return inner_->reduce_scatter(std::move(out), std::move(in), op);
  }
  std::shared_ptr<parallel::Work> all_gather(Tensor out, Tensor in) override {
    counts.all_gather += static_cast<int64_t>(in.nbytes());
    return inner_->all_gather(std::move(out), std::move(in));
  }
  std::shared_ptr<parallel::Work> send(std::vector<Tensor> ts, int dst, int tag) override {
    counts.send += bytes(ts);
    return inner_->send(std::move(ts), dst, tag);
  }
  std::shared_ptr<parallel::Work> recv(std::vector<Tensor> ts, int src, int tag) override {
    counts.recv += bytes(ts);
    return inner_->recv(std::move(ts), src, tag);
  }
  std::shared_ptr<parallel::ProcessGroup> new_group(const std::vector<int>& ranks) override {
    auto g = inner_->new_group(ranks);
    if (!g) return nullptr;
    auto c = std::make_shared<CountingGroup>(g);
    children.push_back(c);
    return c;
  }
  Counts counts;
  std::vector<std::shared_ptr<CountingGroup>> children;

 private:
  std::shared_ptr<parallel::ProcessGroup> inner_;
};

std::shared_ptr<parallel::ProcessGroup> world_group() {
  if (parallel::in_launched_job()) return parallel::init_process_group("gloo");
  parallel::TCPStoreOptions store_options;
  store_options.is_server = true;
  store_options.rank = 0;
  auto store = std::make_shared<parallel::TCPStore>("127.0.0.1", 0, store_options);
  return parallel::new_process_group("gloo", store, 0, 1, {});
}

Counts& counts_of(const std::shared_ptr<parallel::ProcessGroup>& g) {
  return static_cast<CountingGroup&>(*g).counts;
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0.0 : v[v.size() / 2];
}

struct Row {
  std::string what;
  double measured, formula;
  bool exact = true;  // bytes: must be equal; else a ratio (activations)
};

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"The GPT on a dp x pp x cp x tp mesh: bytes, collectives, activations, time"};
  models::GPTConfig config;
  config.n_layer = 4;
  config.n_head = 4;
  config.n_embd = 64;
  config.vocab_size = 256;
  config.block_size = 64;
  int dp = 1, tp = 1, cp = 1, pp = 1, zero = 0, steps = 3, model_chunks = 1;
  int64_t batch = 4, T = 64, micro_batches = 0;
  bool sp = false, json = false, check = false;
  std::string model_kind = "gpt", precision = "32-true";
  int64_t n_kv_head = 0, intermediate_size = 0;
  double tolerance = 0.05, grad_clip = 0;
  using mg::samples::integer_in;
  app.add_option("--dp", dp, "data-parallel ranks")->check(integer_in(1, 1024));
  app.add_option("--tp", tp, "tensor-parallel ranks")->check(integer_in(1, 1024));
  app.add_option("--cp", cp, "context-parallel ranks")->check(integer_in(1, 1024));
  app.add_option("--pp", pp, "pipeline stages")->check(integer_in(1, 1024));
  app.add_flag("--sequence-parallel", sp, "Megatron's sequence parallelism in the tp group");
  app.add_option("--zero", zero, "ZeRO over dp as train_gpt applies it: 1 AdamW's state, 2 and the "
                 "gradients, 3 FSDP by block (0: DDP)")->check(integer_in(0, 3));
  app.add_option("--model", model_kind, "gpt, or llama: the Llama (models/llama.h) built from the same flags "
                 "as train_gpt --model llama builds it, split by its SplitSpec; its collectives are counted "
                 "against LlamaArithmetic's (the bytes held are not compared)")
      ->check(CLI::IsMember({"gpt", "llama"}));
  app.add_option("--n-kv-head", n_kv_head, "--model llama: key-value heads (0: half of --n-head)")
      ->check(integer_in(0, 1024));
  app.add_option("--intermediate-size", intermediate_size, "--model llama: SwiGLU's width (0: 8/3 --n-embd, "
                 "rounded up to 32)")->check(integer_in(0, 1 << 20));
  app.add_option("--n-layer", config.n_layer, "blocks")->check(integer_in(1, 1024));
  app.add_option("--n-embd", config.n_embd, "width")->check(integer_in(1, 1 << 16));
  app.add_option("--n-head", config.n_head, "heads")->check(integer_in(1, 1024));
  app.add_option("--vocab", config.vocab_size, "vocabulary")->check(integer_in(1, 1 << 20));
  app.add_option("--block-size", config.block_size, "positions of wpe")->check(integer_in(1, 1 << 16));
  app.add_option("--batch", batch, "rows of the whole batch")->check(integer_in(1, 1 << 20));
  app.add_option("--T", T, "tokens per row")->check(integer_in(1, 1 << 16));
  app.add_option("--micro-batches", micro_batches, "pipeline micro-batches (0: pp)")->check(integer_in(0, 1024));
  app.add_option("--steps", steps, "measured steps after one warm-up")->check(integer_in(1, 1000));
  app.add_option("--precision", precision, "32-true, bf16-mixed, 16-mixed or bf16-true: the step as train_gpt "
                 "takes it in that precision")
      ->check(CLI::IsMember(samples::precision_names()));
  app.add_option("--model-chunks", model_chunks, "with --pp: the interleaved schedule with this many chunks a rank "
                 "(1: 1F1B)")->check(integer_in(1, 64));
  app.add_option("--grad-clip", grad_clip, "clip the gradient norm to this each step, as train_gpt (0: no clip)")
      ->check(CLI::NonNegativeNumber);
  app.add_flag("--json", json, "one JSON line per rank as well");
  app.add_flag("--check", check, "exit 1 unless every byte count equals its formula and the "
               "activation peak is within --tolerance of its formula (the smoke test)");
  app.add_option("--tolerance", tolerance, "relative, for --check's activation peak")
      ->check(CLI::Range(0.0, 1.0));
  if (const auto exit_code = mg::samples::parse_command_line(app, "gpt-parallel-bench", argc, argv))
    return *exit_code;
  try {
    auto world = std::make_shared<CountingGroup>(world_group());
    MG_CHECK(dp * pp * cp * tp == world->size(),
             "gpt-parallel-bench: dp {} x pp {} x cp {} x tp {} != {} ranks", dp, pp, cp, tp,
             world->size());
    MG_CHECK(batch % dp == 0, "gpt-parallel-bench: batch {} does not divide by dp {}", batch, dp);
    if (micro_batches == 0) micro_batches = pp;
    const int rank = world->rank();
    const bool llama_model = model_kind == "llama";
    // The Llama of these flags, as train_gpt makes it (samples/support/language_model.h).
    samples::ModelFlags llama_flags;
    llama_flags.model = "llama";
    llama_flags.n_layer = config.n_layer;
    llama_flags.n_head = config.n_head;
    llama_flags.n_embd = config.n_embd;
    llama_flags.block_size = config.block_size;
    llama_flags.n_kv_head = n_kv_head;
    llama_flags.intermediate_size = intermediate_size;
    manual_seed(1337);
    auto gpt = std::make_shared<models::GPT>(config);
    const auto llama = llama_model ? std::make_unique<samples::LanguageModel>(llama_flags, config.vocab_size) : nullptr;
    const samples::Precision precision_kind = samples::parse_precision(precision);
    const bool bf16_true = precision_kind == samples::Precision::BF16True;
    if (bf16_true) {  // train_gpt's: the weights themselves in bfloat16, before the split
      if (llama) llama->module()->to(DType::BFloat16);
      else gpt->to(DType::BFloat16);
    }
    manual_seed(7);
    const Tensor x = randint(0, config.vocab_size, Shape{batch, T});
    const Tensor y = randint(0, config.vocab_size, Shape{batch, T});

    // The single-device step on the whole batch, rank 0 alone (the others wait).
    double single_ms = 0;
    if (rank == 0 && !llama_model) {
      auto ref = std::static_pointer_cast<models::GPT>(gpt->clone());
      optim::AdamW opt(ref->parameters(), optim::AdamWOptions(1e-3));
      std::vector<double> ms;
      for (int s = 0; s <= steps; ++s) {
        const auto t0 = Clock::now();
        opt.zero_grad();
        models::GPT::loss(ref->forward(x), y).backward();
        opt.step();
        if (s > 0) ms.push_back(std::chrono::duration<double, std::milli>(Clock::now() - t0).count());
      }
      single_ms = median(ms);
    }
    world->barrier()->wait();

    // DDP: the mesh pipeline (one stage when pp is 1) and one AdamW. --zero: train_gpt's
    // split and its optimizers (AdamW over FSDP's flat shards for 3, as train_gpt's).
    std::unique_ptr<parallel::DeviceMesh> own_mesh;
    std::unique_ptr<parallel::MeshPipeline> model;
    std::unique_ptr<optim::AdamW> adamw;
    std::unique_ptr<samples::SplitModel> split;
    std::vector<std::unique_ptr<optim::Optimizer>> zero_optimizers;
    const bool interleaved = model_chunks > 1;
    // 16-mixed's scaler agrees on an inf over every rank, as train_gpt's (reduce_found_inf).
    std::unique_ptr<samples::MixedPrecision> amp;
    if (zero == 0 && !llama_model && !interleaved && precision == "32-true") {
      own_mesh = std::make_unique<parallel::DeviceMesh>(
          world, std::vector<parallel::MeshDim>{{"dp", dp}, {"pp", pp}, {"cp", cp}, {"tp", tp}});
      models::parallelize_gpt(*gpt, *own_mesh, sp);
      parallel::MeshPipelineOptions options;
      options.micro_batches = micro_batches;
      model = std::make_unique<parallel::MeshPipeline>(*gpt, *own_mesh, models::gpt_pipeline_cut(config, pp), options);
      adamw = std::make_unique<optim::AdamW>(model->parameters(), optim::AdamWOptions(1e-3));
    } else {
      samples::ModelSplit ms;
      ms.dp = dp;
      ms.tp = tp;
      ms.pp = pp;
      ms.cp = cp;
      ms.sequence_parallel = sp;
      ms.micro_batches = micro_batches;
      ms.interleaved = interleaved;
      ms.model_chunks = model_chunks;
      ms.zero = zero;
      // train_gpt's refusals (ZeRO-2/3 with pp, ZeRO without dp); FSDP's AdamW decays nothing.
      samples::check_split(ms, batch, T, config.dropout, 0.0);
      samples::DistributedRun dist;
      dist.group = world;
      dist.rank = rank;
      dist.world_size = world->size();
      split = std::make_unique<samples::SplitModel>(llama_model ? llama->split_spec()
                                                                : models::gpt_split_spec(gpt),
                                                    ms, dist, 1337);
      amp = std::make_unique<samples::MixedPrecision>(
          precision_kind, Device::cpu(), [s = split.get()](Tensor& found_inf) { s->reduce_found_inf(found_inf); });
      // train_gpt's optimizers: AdamW (MasterWeights' under bf16-true), ZeRO-1/2's own.
      const auto make_adamw = [zero](std::vector<Tensor> params) -> std::unique_ptr<optim::Optimizer> {
        optim::AdamWOptions options(1e-3);
        if (zero == 3) options.weight_decay(0.0);  // FSDP's flat shards mix weights with biases
        return std::make_unique<optim::AdamW>(std::move(params), options);
      };
      if (zero == 1 || zero == 2) {
        zero_optimizers = split->make_zero_optimizers(optim::AdamWOptions(1e-3), bf16_true);
      } else {
        zero_optimizers.push_back(amp->wrap_optimizer(split->parameters(), make_adamw));
        if (bf16_true) split->place_masters(dynamic_cast<const optim::MasterWeights&>(*zero_optimizers.back()));
      }
    }
    if (!amp) amp = std::make_unique<samples::MixedPrecision>(precision_kind, Device::cpu());
    const parallel::DeviceMesh& mesh = split ? split->mesh() : *own_mesh;
    const Tensor xl = model ? model->local_batch(x) : x, yl = model ? model->local_batch(y) : y;
    // A micro-batch's share of the batch's loss: its tokens' sum over the batch's B T.
    const double tokens = static_cast<double>(batch * T);
    const auto share = [&mesh, tokens](const Tensor& out, const Tensor& t) {
      parallel::LossParallel loss_parallel(mesh);
      return mul(models::GPT::loss(out, t, Reduction::Sum), 1.0 / tokens);
    };

    // The groups to count, by name; the embedding group ("emb") is the tie's, the pp
    // group's sub-group of the first and the last stage (its placement names it).
    std::vector<std::pair<std::string, std::shared_ptr<parallel::ProcessGroup>>> groups;
    for (const char* d : {"tp", "cp", "dp", "pp"}) groups.emplace_back(d, mesh.group(d));
    groups.emplace_back("world", world);  // the clip's (and nothing else's in a step)
    for (const Tensor& p : split ? split->parameters() : model->parameters())
      if (const parallel::ParameterSpec* spec = parallel::spec_of(p))
        for (const parallel::DimPlacement& d : spec->pieces[0].placements)
          if (d.dim == "tied" && groups.back().first != "emb") groups.emplace_back("emb", d.group);
    std::map<std::string, Counts> step_counts;

    double activations = 0;
    std::vector<double> ms;
    for (int s = 0; s <= steps; ++s) {
      if (model) model->zero_grad(/*set_to_none=*/s == 0);
      for (auto& o : zero_optimizers) o->zero_grad();
      std::map<std::string, Counts> before;
      for (auto& [n, g] : groups) before[n] = counts_of(g);
      const size_t at_rest = cpu_memory_allocated();
      cpu_reset_peak_memory_stats();
      const auto t0 = Clock::now();
      if (model) {
        model->train_step(xl, yl, share);
      } else {  // train_gpt's step, one micro-batch of accumulation
        Tensor step_loss;
        if (split->pipelined()) {
          const auto region = amp->autocast(false);  // train_gpt's: no cast cache over the micro-batches
          // train_gpt's reduce_gradients takes the loss in float32 (bf16-true's is bfloat16)
          step_loss = ops::to_dtype(split->pipeline_step(x, y, tokens, amp->loss_scale()), DType::Float32);
        } else {
          Tensor loss;
          {
            const auto region = amp->autocast();
            loss = split->loss_share(x, y);
          }
          amp->scale(mul(loss, split->backward_scale())).backward();  // ZeRO-2/3 average over dp
          step_loss = ops::to_dtype(loss.detach(), DType::Float32);   // bf16-true's is bfloat16
        }
        split->reduce_gradients(step_loss);
      }
      // Read here, before AdamW's step: its transient copies (contiguous gradients of
      // strided parameters) are not activations, and on a stage with few activations they
      // would be the peak.
      const size_t step_peak = cpu_max_memory_allocated();
      // train_gpt's order: the gradients made current (masters, ZeRO-1's shards) and under
      // 16-mixed unscaled, an inf looked for on every rank; the clip; the step.
      std::vector<optim::Optimizer*> optimizers;
      for (auto& o : zero_optimizers) optimizers.push_back(o.get());
      amp->unscale_(optimizers);
      if (grad_clip > 0) {  // train_gpt's: over what the optimizers step
        std::vector<Tensor> clipped = model ? model->parameters() : std::vector<Tensor>{};
        for (auto& o : zero_optimizers) clipped.insert(clipped.end(), o->parameters().begin(), o->parameters().end());
        parallel::clip_grad_norm_(clipped, mesh, grad_clip);
      }
      if (adamw) adamw->step();
      amp->step(optimizers);
      const double t = std::chrono::duration<double, std::milli>(Clock::now() - t0).count();
      if (s == 0) continue;  // the warm-up creates the gradients and AdamW's state
      ms.push_back(t);
      activations = static_cast<double>(step_peak - at_rest);
      for (auto& [n, g] : groups) {
        const Counts& a = counts_of(g);
        const Counts& b = before[n];
        step_counts[n] = Counts{a.all_reduce - b.all_reduce, a.all_gather - b.all_gather,
                                a.reduce_scatter - b.reduce_scatter, a.broadcast - b.broadcast,
                                a.send - b.send, a.recv - b.recv};
      }
    }

    // ---- measured bytes held (DDP only) ----
    double param_bytes = 0, grad_bytes = 0, adam_bytes = 0;
    if (model) {
      const auto params = model->parameters();
      for (size_t i = 0; i < params.size(); ++i) {
        param_bytes += static_cast<double>(params[i].nbytes());
        if (params[i].grad().defined()) grad_bytes += static_cast<double>(params[i].grad().nbytes());
        adam_bytes += static_cast<double>(adamw->exp_avg(i).nbytes() + adamw->exp_avg_sq(i).nbytes());
      }
    }

    // ---- the arithmetic: the planner's formulas (minigrad/plan/gpt_formulas.h) ----
    const int stage = mesh.rank("pp");
    const std::unique_ptr<plan::ModelArithmetic> arithmetic =
        llama_model ? llama->arithmetic() : std::make_unique<plan::GPTArithmetic>(config);
    const double Ls = static_cast<double>(arithmetic->stage_blocks(pp, stage));
    const double stage_params = plan::gpt_stage_param_elements(config, tp, pp, stage);
    const double S = 4;  // float32
    // The collectives: the planner's for this split and workload in float32 (DDP's are
    // gpt_collective_bytes'; ZeRO's over dp the planner's own terms). The device does not
    // enter the bytes.
    plan::Split plan_split;
    plan_split.dp = dp;
    plan_split.tp = tp;
    plan_split.pp = pp;
    plan_split.cp = cp;
    plan_split.sequence_parallel = sp;
    plan_split.zero = zero;
    plan_split.micro_batches = micro_batches;
    plan_split.clip_grad_norm = grad_clip > 0;
    if (interleaved) {
      plan_split.schedule = plan::Schedule::Interleaved;
      plan_split.virtual_stages = model_chunks;
    }
    plan::Workload workload;
    workload.batch = batch;
    workload.seq_len = T;
    workload.precision = plan::precision_from_string(precision);
    const plan::Plan planned = plan::plan_model(*arithmetic, plan_split, workload, plan::device_table().front());
    const plan::MeshShape shape = plan::mesh_shape(plan_split, workload);
    MG_CHECK(static_cast<size_t>(stage) < planned.stage_comm.size(),
             "gpt-parallel-bench: the planner priced {} stages, not stage {}", planned.stage_comm.size(), stage);
    std::map<std::string, plan::CollectiveBytes> f = planned.stage_comm[static_cast<size_t>(stage)];
    // The planner prices train_gpt's step, whose loss without the pipeline is loss_share's
    // mean over the cp ranks' tokens (their int64 count summed over cp); the DDP runs here
    // step MeshPipeline::train_step, which sums the micro-batches' losses and counts none.
    if (model && cp > 1 && pp == 1) f["cp"].all_reduce -= 8;
    // The step's peak is a maximum over moments: the activations' (the backward) and, under
    // dp or cp, the gradients' sum after it (a flat copy and the all-reduce's).
    const double activation_formula = std::max(plan::gpt_activation_peak_floats(config, shape, stage) * S,
                                               plan::gpt_gradient_sum_peak_bytes(config, shape, stage, S));
    const double step_ms = median(ms);
    std::vector<Row> rows;
    if (model)
      rows = {{"params", param_bytes, stage_params * S},
              {"grads", grad_bytes, stage_params * S},
              {"adamw", adam_bytes, 2 * stage_params * S}};
    // ZeRO-2/3 with SP: each dp rank sums over tp the replicated parameters' gradients its
    // shards hold, which differs by rank; the planner prices the dp ranks' mean, so the row
    // holds their sum (an all-reduce after the counts were read) against dp times it.
    const bool tp_reduce_summed = zero >= 2 && sp && tp > 1;
    double tp_reduce_sum = 0;
    if (tp_reduce_summed) {
      Tensor t = from_vector(std::vector<int64_t>{step_counts["tp"].all_reduce}, Shape{1});
      mesh.group("dp")->allreduce({t})->wait();
      tp_reduce_sum = static_cast<double>(t.to_vector<int64_t>()[0]);
    }
    for (auto& [n, g] : groups) {
      const Counts& got = step_counts[n];
      const plan::CollectiveBytes& e = f[n];
      if (got.total() == 0 && e.total() == 0) continue;
      if (n == "tp" && tp_reduce_summed)
        rows.push_back({"tp all_reduce, sum over dp", tp_reduce_sum, std::round(dp * e.all_reduce)});
      else
        rows.push_back({n + " all_reduce", double(got.all_reduce), e.all_reduce});
      rows.push_back({n + " all_gather", double(got.all_gather), e.all_gather});
      rows.push_back({n + " reduce_scatter", double(got.reduce_scatter), e.reduce_scatter});
      rows.push_back({n + " broadcast", double(got.broadcast), e.broadcast});
      rows.push_back({n + " send", double(got.send), e.send});
      rows.push_back({n + " recv", double(got.recv), e.recv});
    }
    if (model) rows.push_back({"activation peak", activations, activation_formula, false});

    int failures = 0;
    for (const Row& row : rows)
      failures += row.exact ? row.measured != row.formula
                            : std::abs(row.measured / row.formula - 1) > tolerance;
    // --zero compares the collectives alone: a dp group that saw nothing compared nothing.
    if (zero > 0 && step_counts["dp"].total() == 0) {
      fmt::print(stderr, "gpt-parallel-bench: rank {}: --zero {}, but the dp group counted no bytes\n", rank, zero);
      ++failures;
    }
    // Ranks print in turn.
    for (int r = 0; r < world->size(); ++r) {
      if (r == rank) {
        fmt::print("rank {} ({}dp {} pp {} cp {} tp {}{}{}), {} blocks, step {:.2f} ms (single device {:.2f} ms)\n",
                   rank, llama_model ? "the Llama, " : "", mesh.rank("dp"), stage, mesh.rank("cp"), mesh.rank("tp"), sp ? " sp" : "",
                   zero > 0 ? fmt::format(" ZeRO-{}", zero) : "", Ls, step_ms, single_ms);
        fmt::print("| quantity | measured B | formula B | measured / formula |\n|---|---|---|---|\n");
        for (const Row& row : rows) {
          if (row.measured == 0 && row.formula == 0) continue;
          if (row.exact)
            fmt::print("| {} | {:.0f} | {:.0f} | {} |\n", row.what, row.measured, row.formula,
                       row.measured == row.formula ? "exact" : "DIFFERS");
          else
            fmt::print("| {} | {:.0f} | {:.0f} | {:.3f} |\n", row.what, row.measured, row.formula,
                       row.formula != 0 ? row.measured / row.formula : 0.0);
        }
        if (json) {
          std::string j = fmt::format("{{\"rank\":{},\"dp\":{},\"tp\":{},\"cp\":{},\"pp\":{},\"sp\":{},"
                                      "\"zero\":{},\"step_ms\":{:.3f},\"single_ms\":{:.3f}",
                                      rank, dp, tp, cp, pp, sp, zero, step_ms, single_ms);
          for (const Row& row : rows)  // [measured, formula] bytes; the zero pairs left out
            if (row.measured != 0 || row.formula != 0)
              j += fmt::format(",\"{}\":[{:.0f},{:.0f}]", row.what, row.measured, row.formula);
          fmt::print("{}}}\n", j);
        }
        if (check)
          fmt::print("rank {} check: {}\n", rank,
                     failures == 0 ? (model ? "every byte count exact, activations within tolerance"
                                            : "every collective's byte count exact")
                                   : fmt::format("{} quantities off their formula", failures));
        std::fflush(stdout);
      }
      world->barrier()->wait();
    }
    return check && failures > 0 ? 1 : 0;
  } catch (const std::exception& e) {
    fmt::print(stderr, "gpt-parallel-bench: {}\n", e.what());
    return 1;
  }
}
