#include "gpt_parallel.h"

#include <algorithm>
#include <chrono>
#include <cmath>

#include <fmt/format.h>

#include <minigrad/autograd/functions.h>
#include <minigrad/autograd/grad_mode.h>
#include <minigrad/core/generator.h>
#include <minigrad/core/ops.h>
#include <minigrad/models/gpt_context_parallel.h>
#include <minigrad/models/gpt_mesh_clip.h>
#include <minigrad/models/gpt_plan.h>
#include <minigrad/nn/utils/clip_grad.h>
#include <minigrad/parallel/c10d/launch_environment.h>
#include <minigrad/parallel/c10d/rendezvous.h>
#include <minigrad/parallel/context_parallel/context_parallel_loss.h>
#include <minigrad/parallel/context_parallel/ring_attention.h>
#include <minigrad/parallel/context_parallel/sequence_layout.h>
#include <minigrad/parallel/tensor_parallel/group.h>

#include "command_line.h"

namespace mg::samples {

namespace cp = parallel::context_parallel;

std::string GPTSplit::str() const {
  return fmt::format("dp {} x tp {} x {}cp {}{}{}{}{}", dp, tp, pp > 1 ? fmt::format("pp {} x ", pp) : "", cp,
                     sequence_parallel ? ", sequence parallel" : "",
                     pp > 1 ? fmt::format(", {} schedule, {} micro-batches, {} model chunk{}",
                                          interleaved ? "interleaved" : "1F1B", micro_batches,
                                          model_chunks, model_chunks > 1 ? "s" : "")
                            : "",
                     zero == 3 ? ", ZeRO-3 (FSDP by block)" : zero > 0 ? fmt::format(", ZeRO-{}", zero) : "",
                     recompute ? ", recompute" : "");
}

void check_split(const GPTSplit& s, int64_t batch_size, int64_t block_size, double dropout, double weight_decay) {
  const bool launched = parallel::in_launched_job();
  const int world = launched ? parallel::LaunchEnvironment::from_environment().world_size : 1;
  if (s.ranks() != world)
    throw OptionError(fmt::format(
        "--dp {} x --tp {} x {}--cp {} = {} ranks, but the job has {} ({}); start {} processes, "
        "e.g. minigrad-run --nproc-per-node {} train_gpt ...",
        s.dp, s.tp, s.pp > 1 ? fmt::format("--pp {} x ", s.pp) : "", s.cp, s.ranks(), world,
        launched ? parallel::launcher_name(parallel::LaunchEnvironment::from_environment().launcher)
                 : "not started by a launcher",
        s.ranks(), s.ranks()));
  if (s.model_chunks > 1 && !s.interleaved)
    throw OptionError(fmt::format("--model-chunks {}: more than one chunk per rank needs --schedule interleaved", s.model_chunks));
  if (s.zero > 1 && (s.tp > 1 || s.pp > 1 || s.cp > 1 || s.sequence_parallel))
    throw OptionError(fmt::format("--zero {} shards over --dp alone: not with --tp, --pp, --cp or --sequence-parallel "
                                  "(got {}; ZeRO-2's gradient buckets and FSDP wrap the plain GPT; --zero 1, which "
                                  "shards only AdamW's state, composes with them)", s.zero, s.str()));
  if (s.zero > 0 && s.dp == 1)
    throw OptionError(fmt::format("--zero {} shards over the data-parallel ranks: it needs --dp 2 or more", s.zero));
  if (s.zero == 3 && weight_decay != 0.0)
    throw OptionError(fmt::format("--zero 3: AdamW steps FSDP's flat shards, which mix the 2-D weights with biases and "
                                  "LayerNorm gains, so it cannot decay the weights alone; pass --weight-decay 0 (not {})", weight_decay));
  if (s.recompute && s.tp > 1 && s.pp == 1)
    throw OptionError("--recompute with --tp: block checkpointing wraps the plain GPT's blocks; under --tp it needs --pp (the pipeline's checkpointing)");
  if (s.sequence_parallel && s.tp == 1)
    throw OptionError("--sequence-parallel splits the tensor-parallel layers' activations: it needs --tp 2 or more");
  if (batch_size < s.dp)
    throw OptionError(fmt::format("--batch-size {} cannot be cut over --dp {}: each data-parallel "
                                  "rank needs a window at least", batch_size, s.dp));
  if (s.cp > 1 && block_size % (2 * s.cp) != 0)
    throw OptionError(fmt::format("--cp {}: --block-size {} must divide into 2 x cp = {} chunks "
                                  "(ring attention's balanced layout)", s.cp, block_size, 2 * s.cp));
  if (s.sequence_parallel && (block_size / s.cp) % s.tp != 0)
    throw OptionError(fmt::format(
        "--sequence-parallel: {} must divide by --tp {} (each rank holds that / tp positions)",
        s.cp > 1 ? fmt::format("the --block-size {} / --cp {} = {} positions of a cp rank", block_size, s.cp, block_size / s.cp)
                 : fmt::format("--block-size {}", block_size),
        s.tp));
  if (s.cp > 1 && dropout != 0.0)
    throw OptionError(fmt::format("--cp {}: ring attention has no dropout; train with --dropout 0 "
                                  "(not {})", s.cp, dropout));
}

DistributedRun join_split_run(double timeout_seconds, std::vector<Device>& devices) {
  const parallel::DistributedEnv env = parallel::DistributedEnv::from_environment();
  const Device device = devices[static_cast<size_t>(env.local_rank) % devices.size()];
  devices = {device};
  parallel::ProcessGroupOptions options;
  options.timeout = std::chrono::milliseconds(static_cast<int64_t>(timeout_seconds * 1000));
  options.device_index = device.is_cuda() ? device.index() : -1;
  DistributedRun run;
  run.group = parallel::init_process_group(device.is_cuda() ? "nccl" : "gloo", options);
  run.rank = run.group->rank();
  run.world_size = run.group->size();
  return run;
}

SplitGPT::SplitGPT(std::shared_ptr<models::GPT> gpt, const GPTSplit& split, const DistributedRun& dist,
                   uint64_t seed)
    : gpt_(std::move(gpt)), split_(split) {
  if (split.pp > 1) {
    mesh_ = std::make_unique<parallel::DeviceMesh>(
        dist.group, std::vector<parallel::MeshDim>{{"dp", split.dp}, {"pp", split.pp}, {"cp", split.cp}, {"tp", split.tp}});
    models::GPTMeshPipelineOptions options;
    options.pipeline.micro_batches = split.micro_batches;
    options.pipeline.schedule = split.interleaved ? parallel::Schedule::Interleaved1F1B : parallel::Schedule::OneFOneB;
    options.pipeline.model_chunks = split.model_chunks;
    if (split.recompute) options.pipeline.checkpoint = parallel::Checkpoint::Always;
    options.tensor_parallel.sequence_parallel = split.sequence_parallel;
    options.tensor_parallel.seed = seed;
    options.finish_gradients = false;  // once per step, after gradient accumulation
    pipeline_ = models::pipeline_gpt_on_mesh(*gpt_, *mesh_, options);
    if (mesh_->rank("dp") > 0) manual_seed(seed + 7919 * static_cast<uint64_t>(mesh_->rank("dp")));
    return;
  }
  // Every dimension, size 1 included, so that every group exists.
  mesh_ = std::make_unique<parallel::DeviceMesh>(
      dist.group, std::vector<parallel::MeshDim>{{"dp", split.dp}, {"cp", split.cp}, {"tp", split.tp}});
  // Under tp the tensor-parallel GPT runs cp itself (mesh.group("cp"): ring attention on
  // its heads, the loss and the gradients summed over cp); cp alone runs on `gpt`.
  if (split.zero == 3) fsdp_ = models::fully_shard_gpt(gpt_, mesh_->group("dp"));
  if (split.tp > 1) {
    models::TensorParallelGPTOptions options;
    options.sequence_parallel = split.sequence_parallel;
    options.seed = seed;
    tp_model_ = models::parallelize_gpt(*gpt_, *mesh_, options);
  }
  if (split.cp > 1 && !tp_model_) models::set_attention_function(*gpt_, cp::ring_attention_function(mesh_->group("cp")));
  // Dropout: other rows, other masks. Rank 0 of dp keeps the single-device run's stream;
  // the ranks of one dp row (a tp group) stay alike, as replicated regions need.
  if (mesh_->rank("dp") > 0) manual_seed(seed + 7919 * static_cast<uint64_t>(mesh_->rank("dp")));
}

nn::Module& SplitGPT::trained() const {
  return tp_model_ ? static_cast<nn::Module&>(*tp_model_) : static_cast<nn::Module&>(*gpt_);
}

std::vector<Tensor> SplitGPT::parameters() const {
  if (fsdp_) return fsdp_->parameters();
  return pipeline_ ? pipeline_->parameters() : trained().parameters();
}

std::vector<std::unique_ptr<optim::Optimizer>> SplitGPT::make_zero_optimizers(const optim::AdamWOptions& options) {
  MG_CHECK(split_.zero == 1 || split_.zero == 2, "SplitGPT::make_zero_optimizers: --zero {}", split_.zero);
  // This rank's parameters: the whole GPT's under dp alone, its tp shards or its pipeline
  // chunks' otherwise; ZeRO-1 cuts each list's AdamW state over dp after the gradients
  // were summed over every group (reduce_gradients), so the split underneath is unseen.
  std::vector<Tensor> decayed, rest;
  for (const Tensor& p : parameters()) (p.dim() >= 2 ? decayed : rest).push_back(p);
  parallel::ZeroOptions zero_options;
  zero_options.stage = split_.zero;
  std::vector<std::unique_ptr<optim::Optimizer>> out;
  zero_.clear();
  for (int k = 0; k < 2; ++k) {
    optim::AdamWOptions group = options;
    if (k == 1) group.weight_decay(0.0);
    auto zero = std::make_unique<parallel::ZeroRedundancyOptimizer>(
        k == 0 ? decayed : rest, mesh_->group("dp"),
        [group](std::vector<Tensor> shards) { return std::make_unique<optim::AdamW>(std::move(shards), group); },
        zero_options);
    zero_.push_back(zero.get());
    out.push_back(std::move(zero));
  }
  return out;
}

void SplitGPT::set_training(bool on) {
  if (!pipeline_) {
    trained().train(on);
    return;
  }
  for (const auto& chunk : pipeline_->chunks()) chunk->train(on);
}

Tensor SplitGPT::pipeline_step(const Tensor& x, const Tensor& y, double divide_by) {
  return pipeline_->train_step(pipeline_->local_batch(x), pipeline_->local_batch(y), divide_by);
}

double SplitGPT::eval_loss(const Tensor& x, const Tensor& y) {
  // A training step's forward and backward in eval mode (the caller set it): the loss is
  // the forward's; the gradients it leaves are dropped (the next step zeroes them anyway).
  AutoGradMode grad(true);
  const double loss = pipeline_step(x, y, static_cast<double>(x.numel())).item<float>();
  pipeline_->zero_grad();
  return loss;
}

Tensor SplitGPT::loss_share(const Tensor& x, const Tensor& y) {
  const int64_t B = x.size(0), T = x.size(1);
  const int dp = mesh_->size("dp"), dp_rank = mesh_->rank("dp");
  const int64_t base = B / dp, extra = B % dp;
  const int64_t start = dp_rank * base + std::min<int64_t>(dp_rank, extra);
  const int64_t rows = base + (dp_rank < extra ? 1 : 0);
  const Tensor xs = dp > 1 ? ops::contiguous(ops::narrow(x, 0, start, rows)) : x;
  const Tensor ys_ = dp > 1 ? ops::contiguous(ops::narrow(y, 0, start, rows)) : y;
  if (fsdp_) {
    const Tensor mean = models::GPT::loss((*gpt_)(xs), ys_);  // through its hooks: FSDP's gathers
    return rows == B ? mean : mean * (static_cast<double>(rows) / static_cast<double>(B));
  }
  const Tensor ys = dp > 1 ? ops::contiguous(ops::narrow(y, 0, start, rows)) : y;
  // Tensor parallel: this dp rank's token losses summed (over cp too: each cp rank's part
  // of every row, local_sequence) / the global batch's tokens.
  if (tp_model_) {
    const Tensor x_local = tp_model_->local_sequence(xs), y_local = tp_model_->local_sequence(ys);
    return tp_model_->loss(tp_model_->forward(x_local), y_local, static_cast<double>(B * T));
  }
  // Otherwise the mean over this rank's rows (whole or over the cp group), weighted by
  // their part of the batch. Context parallel: two chunks of every row's positions.
  Tensor mean;
  if (split_.cp > 1) {
    const int c = mesh_->rank("cp");
    const Tensor logits = models::forward_at_positions(
        *gpt_, cp::shard_sequence(xs, c, split_.cp), cp::sequence_positions(T, c, split_.cp, xs.device()));
    mean = cp::context_parallel_cross_entropy(logits, cp::shard_sequence(ys, c, split_.cp), *mesh_->group("cp"));
  } else {
    mean = models::GPT::loss(gpt_->forward(xs), ys);
  }
  return rows == B ? mean : mean * (static_cast<double>(rows) / static_cast<double>(B));
}

void SplitGPT::reduce_gradients(Tensor& step_loss) {
  if (pipeline_) {  // the loss is already the whole batch's
    pipeline_->finish_gradients();
    return;
  }
  if (tp_model_) tp_model_->finish_gradients();  // with SP the tp sums, under cp the cp sum
  if (split_.zero >= 2) {  // the gradients were reduce-scattered in backward: the loss alone
    step_loss = ops::clone(step_loss);
    mesh_->group("dp")->allreduce({step_loss})->wait();
    return;
  }
  const std::vector<Tensor> params = parameters();
  if (split_.cp > 1 && !tp_model_) cp::all_reduce_gradients(params, *mesh_->group("cp"));
  if (split_.dp > 1) {
    std::vector<Tensor> tensors;
    for (const Tensor& p : params) {
      MG_CHECK(p.grad().defined(), "train_gpt --dp: a parameter of shape {} has no gradient", p.shape());
      tensors.push_back(p.grad());
    }
    step_loss = ops::clone(step_loss);
    tensors.push_back(step_loss);
    mesh_->group("dp")->allreduce(tensors)->wait();
  }
}

void SplitGPT::sum_over_dp(Tensor& shares) {
  if (split_.dp > 1) mesh_->group("dp")->allreduce({shares})->wait();
}

Tensor SplitGPT::clip_grad_norm_(double max_norm) {
  if (pipeline_) return models::clip_mesh_grad_norm_(*pipeline_, *mesh_, max_norm);
  if (fsdp_) return fsdp_->clip_grad_norm_(max_norm);
  if (split_.zero == 2) {  // the shards' gradients of both optimizers: squares summed over dp
    NoGradGuard no_grad;
    std::vector<Tensor> shards, grads;
    for (const auto* zero : zero_)
      for (const Tensor& s : zero->parameters())
        if (s.grad().defined()) {
          shards.push_back(s);
          grads.push_back(s.grad());
        }
    const auto& dp_group = mesh_->group("dp");
    const auto sum_over_dp = [&](Tensor& partial, nn::utils::NormReduction) {
      partial = ops::clone(partial);
      dp_group->allreduce({partial})->wait();
    };
    const Tensor total = nn::utils::get_total_norm(grads, 2.0, false, sum_over_dp, dp_group->device());
    nn::utils::clip_grads_with_norm_(shards, max_norm, total);
    return total;
  }
  if (!tp_model_) return nn::utils::clip_grad_norm_(parameters(), max_norm);
  NoGradGuard no_grad;
  std::vector<Tensor> sharded, replicated;
  for (const auto& [name, p] : tp_model_->named_parameters())
    if (p.grad().defined())
      (models::TensorParallelGPT::is_replicated(name) ? replicated : sharded).push_back(p.grad());
  const auto& tp_group = mesh_->group("tp");
  const Device device = tp_group->device();
  const auto sum_over_tp = [&](Tensor& partial, nn::utils::NormReduction) {
    partial = ops::clone(partial);
    tp_group->allreduce({partial})->wait();
  };
  const Tensor s = nn::utils::get_total_norm(sharded, 2.0, false, sum_over_tp, device);
  const Tensor r = nn::utils::get_total_norm(replicated, 2.0, false, nullptr, device);
  const double sv = s.item<float>(), rv = r.item<float>();
  const Tensor total = full({}, std::sqrt(sv * sv + rv * rv), DType::Float32, device);
  nn::utils::clip_grads_with_norm_(parameters(), max_norm, total);
  return total;
}

}  // namespace mg::samples
