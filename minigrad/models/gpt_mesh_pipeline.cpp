// GPTMeshPipeline (gpt_mesh_pipeline.h): the GPT's pipeline of tensor-parallel,
// context-parallel stages on a dp x pp x cp x tp DeviceMesh, and the sums that finish its
// gradients.
#include <minigrad/models/gpt_mesh_pipeline.h>

#include <algorithm>
#include <set>
#include <utility>

#include <minigrad/autograd/functions.h>
#include <minigrad/autograd/grad_mode.h>
#include <minigrad/core/fault_injection.h>
#include <minigrad/core/ops.h>
#include <minigrad/models/gpt_plan.h>
#include <minigrad/parallel/context_parallel/context_parallel_loss.h>
#include <minigrad/parallel/context_parallel/sequence_layout.h>
#include <minigrad/parallel/context_parallel/wire.h>
#include <minigrad/parallel/pipeline/balance.h>
#include <minigrad/parallel/placement.h>
#include <minigrad/parallel/tensor_parallel/functions.h>
#include <minigrad/parallel/tensor_parallel/sequence_parallel.h>
#include <minigrad/parallel/tensor_parallel/vocab_parallel.h>

namespace mg::models {
namespace {

// The last stage's head holding the given weight (this tp rank's rows of the tied copy),
// named as nanoGPT's lm_head.
class Head : public nn::Cloneable<Head> {
 public:
  explicit Head(Tensor weight) : nn::Cloneable<Head>("Linear") {
    register_parameter("weight", std::move(weight));
  }
  Tensor forward(const Tensor& x) override { return linear(x, parameter("weight")); }
};

// Count of the targets that are not -1.
int64_t count_targets(const Tensor& targets) {
  int64_t n = 0;
  for (int64_t t : ops::copy_to(ops::contiguous(targets), Device::cpu()).to_vector<int64_t>())
    n += t != -1;
  return n;
}

}  // namespace

// ---------------------------------------------------------------- TensorParallelGPTStage

TensorParallelGPTStage::TensorParallelGPTStage(const GPT& gpt, parallel::TensorParallelGroupPtr group,
                                               const TensorParallelGPTOptions& options,
                                               std::shared_ptr<Generator> sharded_generator,
                                               std::shared_ptr<parallel::ProcessGroup> cp,
                                               int64_t first_block, int64_t blocks, bool embedding,
                                               bool head)
    : nn::Cloneable<TensorParallelGPTStage>("TensorParallelGPTStage"),
      group_(std::move(group)),
      sequence_parallel_(options.sequence_parallel),
      embedding_(embedding),
      head_(head) {
  MG_CHECK(blocks >= 1, "TensorParallelGPTStage: blocks [{}, {}): a stage needs a block",
           first_block, first_block + blocks);
  register_module("transformer",
                  tensor_parallel_transformer(gpt, group_, options, std::move(sharded_generator),
                                              std::move(cp),
                                              {first_block, blocks, embedding, /*ln_f=*/head}));
  // The head's copy of this rank's wte rows, unless this chunk holds wte itself (one stage).
  if (head_ && !embedding_) {
    NoGradGuard no_grad;
    Tensor copy = TensorParallelGPT::shard_of("lm_head.weight", gpt.parameter("transformer.wte.weight"),
                                              *group_);
    copy.set_requires_grad(true);
    register_module("lm_head", std::make_shared<Head>(std::move(copy)));
  }
  train(gpt.is_training());
}

Tensor& TensorParallelGPTStage::tied_weight() {
  if (embedding_) return parameter("transformer.wte.weight");
  MG_CHECK(head_, "TensorParallelGPTStage: a middle stage holds no copy of the tied embedding");
  return parameter("lm_head.weight");
}

Tensor TensorParallelGPTStage::forward(const Tensor& input) {
  const Tensor x = child("transformer")->forward(input);
  if (!head_) return x;
  // TensorParallelGPT's head: each rank's logits over its vocabulary, from the replicated
  // (or, with sequence parallelism, gathered) ln_f output.
  const Tensor whole = sequence_parallel_ ? parallel::gather_from_sequence_parallel(x, group_)
                                          : parallel::copy_to_parallel(x, group_);
  return linear(whole, embedding_ ? parameter("transformer.wte.weight") : parameter("lm_head.weight"));
}

// ---------------------------------------------------------------- GPTMeshPipeline

GPTMeshPipeline::GPTMeshPipeline(const GPT& gpt, const parallel::DeviceMesh& mesh,
                                 GPTMeshPipelineOptions options)
    : config_(gpt.config()), options_(options) {
  MG_CHECK(mesh.has_dim("pp") && mesh.has_dim("tp"),
           "GPTMeshPipeline: the mesh {} needs a pp and a tp dimension (of size 1 where unused)",
           mesh.str());
  pp_ = mesh.group("pp");
  if (mesh.size("dp") > 1) dp_ = mesh.group("dp");
  if (mesh.size("cp") > 1) cp_ = mesh.group("cp");
  // Refused here, on every rank, rather than in the first stage's forward while the
  // other stages wait for its activations.
  MG_CHECK(cp_ == nullptr || config_.dropout == 0.0,
           "GPTMeshPipeline: no dropout under context parallelism (cp = {}), got dropout {}: "
           "ring attention has no attention dropout (set dropout to 0)", mesh.size("cp"),
           config_.dropout);
  dp_size_ = mesh.size("dp");
  dp_rank_ = mesh.rank("dp");
  tp_ = parallel::tensor_parallel_group(mesh.group("tp"));
  const int p = pp_->size(), rank = pp_->rank(), v = options_.pipeline.model_chunks;
  // The blocks dealt as the GPT pipeline's cut deals them, and its errors.
  gpt_pipeline_cut(config_, p, v);
  const std::vector<int64_t> balance = parallel::even_balance(config_.n_layer, int64_t{p} * v);
  MG_CHECK(p > 1 || v == 1,
           "GPT pipeline: {} model chunks on one rank; interleaving needs at least two ranks", v);
  if (tp_->size() == 1 && !cp_) {
    // pp and dp alone: the GPT cut by module name, run and summed by the generic pipeline.
    parallel::MeshPipelineOptions generic;
    generic.micro_batches = options_.pipeline.micro_batches;
    generic.schedule = options_.pipeline.schedule;
    generic.checkpoint = options_.pipeline.checkpoint;
    generic.finish_gradients = false;  // this class's finish_gradients decides when
    cut_ = std::make_unique<parallel::MeshPipeline>(gpt, mesh, gpt_pipeline_cut(config_, p, v), generic);
    chunks_ = cut_->chunks();
    for (const Tensor& t : cut_->parameters())  // the tie's group, as the placement says
      if (const parallel::ParameterSpec* spec = parallel::spec_of(t))
        for (const parallel::DimPlacement& d : spec->pieces[0].placements)
          if (d.dim == "tied") embedding_group_ = d.group;
    return;
  }
  auto sharded_generator = std::make_shared<Generator>(
      options_.tensor_parallel.seed + 2718 + static_cast<uint64_t>(tp_->rank()));
  for (int c = 0; c < v; ++c) {
    const int k = c * p + rank;  // virtual stage
    int64_t first_block = 0;
    for (int i = 0; i < k; ++i) first_block += balance[static_cast<size_t>(i)];
    chunks_.push_back(std::make_shared<TensorParallelGPTStage>(
        gpt, tp_, options_.tensor_parallel, sharded_generator, cp_, first_block,
        balance[static_cast<size_t>(k)], k == 0, k + 1 == p * v));
  }
  // The embedding group of this (dp, cp, tp) coordinate's pp group: a collective call of
  // the pp group, every pp group making its own.
  if (p > 1) embedding_group_ = pp_->new_group({0, p - 1});
  parallel::PipelineStageOptions stage_options;
  stage_options.chunks = options_.pipeline.micro_batches;
  stage_options.schedule = options_.pipeline.schedule;
  stage_options.checkpoint = options_.pipeline.checkpoint;
  stage_options.weight_by_rows = false;  // each micro-batch's loss is already its share
  stage_ = std::make_unique<parallel::PipelineStage>(chunks_, pp_, stage_options);
}

Tensor GPTMeshPipeline::local_batch(const Tensor& x) const {
  if (cut_) return cut_->local_batch(x);
  MG_CHECK(x.defined() && x.dim() >= 2, "GPTMeshPipeline::local_batch: expected [B, T, ...], got {}",
           x.defined() ? x.shape().str() : "undefined");
  const int64_t B = x.size(0), base = B / dp_size_, extra = B % dp_size_;
  const int64_t rows = base + (dp_rank_ < extra ? 1 : 0);
  MG_CHECK(rows >= 1, "GPTMeshPipeline::local_batch: {} rows cannot feed {} dp ranks", B, dp_size_);
  const int64_t start = dp_rank_ * base + std::min<int64_t>(dp_rank_, extra);
  const Tensor mine = ops::contiguous(x.narrow(0, start, rows));
  return cp_ ? parallel::context_parallel::shard_sequence(mine, cp_->rank(), cp_->size()) : mine;
}

Tensor GPTMeshPipeline::train_step(const Tensor& idx, const Tensor& targets, double divide_by) {
  const int p = pp_->size();
  const bool first = pp_->rank() == 0, last = pp_->rank() + 1 == p;
  MG_CHECK(!last || (targets.defined() && targets.dim() == 2),
           "GPTMeshPipeline: the last stage (pp rank {}) needs this rank's targets [B, T/cp] "
           "int64; got {}", pp_->rank(), targets.defined() ? targets.shape().str() : "an undefined tensor");
  if (last && divide_by <= 0) {
    // The whole batch's count of targets: this rank's, summed over cp and dp (int64).
    Tensor count = from_vector(std::vector<int64_t>{count_targets(targets)}, Shape{1}, pp_->device());
    if (cp_) count = parallel::context_parallel::sum_over_group(count, *cp_);
    if (dp_) count = parallel::context_parallel::sum_over_group(count, *dp_);
    divide_by = static_cast<double>(ops::copy_to(count, Device::cpu()).to_vector<int64_t>()[0]);
  }
  // Each micro-batch: its tokens' summed loss over the whole batch's count, summed over the
  // vocabulary's tp ranks and (in value) over cp; the gradient reaches this rank's logits.
  const auto loss_fn = [this, divide_by](const Tensor& logits, const Tensor& target) {
    const Tensor part = parallel::vocab_parallel_cross_entropy(logits, target, tp_, -1, divide_by);
    return cp_ ? parallel::context_parallel::context_parallel_sum(part, *cp_) : part;
  };
  if (cut_) {
    const Tensor loss = cut_->train_step(idx, targets, loss_fn);  // on every rank
    if (options_.finish_gradients) finish_gradients();
    return loss;
  }
  const Tensor loss = stage_->train_step(first ? idx : Tensor(), last ? targets : Tensor(), loss_fn);
  if (options_.finish_gradients) finish_gradients();
  // The loss on every rank: broadcast from the last stage over pp (as its bits, whatever
  // the dtype), then this dp rank's part summed over dp.
  NoGradGuard no_grad;
  const DType dtype = chunks_.front()->parameters().front().dtype();
  Tensor buffer = last ? ops::contiguous(ops::to_dtype(loss.detach(), dtype).reshape(Shape{1}))
                       : zeros({1}, dtype, pp_->device());
  if (p > 1) pp_->broadcast(parallel::context_parallel::wire_view(buffer), p - 1)->wait();
  if (dp_) buffer = parallel::context_parallel::sum_over_group(buffer, *dp_);
  return buffer.reshape(Shape{});
}

void GPTMeshPipeline::finish_gradients() {
  if (cut_) return cut_->finish_gradients();
  const std::vector<Tensor> params = parameters();
  for (Tensor p : params)  // every rank of a group reduces the same list
    if (!p.grad().defined()) p.set_grad(zeros_like(p));
  // Sequence parallelism: the replicated parameters saw only this tp rank's positions.
  if (options_.tensor_parallel.sequence_parallel)
    TensorParallelGPT::sum_replicated_gradients(named_parameters(), *tp_);
  // Context parallelism: every gradient holds this cp rank's tokens' share.
  if (cp_) parallel::context_parallel::all_reduce_gradients(params, *cp_);
  sum_tied_gradient();
  // Data parallelism: the loss divides by the whole batch's count, so a plain sum.
  if (dp_) parallel::context_parallel::all_reduce_gradients(params, *dp_);
}

void GPTMeshPipeline::sum_tied_gradient() {
  if (!embedding_group_) return;  // a middle stage, or one stage (the head reads wte)
  auto& holder = static_cast<TensorParallelGPTStage&>(pp_->rank() == 0 ? *chunks_.front() : *chunks_.back());
  Tensor& weight = holder.tied_weight();
  // parity fault: the tied shard's gradient left unsummed, each copy stepping with its share.
  if (testing::fault_is_on(testing::Fault::PipelineTiedGradNotSummed)) return;
  NoGradGuard no_grad;
  ops::copy_(weight.grad(), parallel::context_parallel::sum_over_group(weight.grad(), *embedding_group_));
}

std::vector<nn::NamedTensor> GPTMeshPipeline::named_parameters() const {
  if (cut_) return cut_->named_parameters();
  std::vector<nn::NamedTensor> out;
  std::set<const void*> seen;
  for (const auto& chunk : chunks_)
    for (auto& [name, p] : chunk->named_parameters())
      if (seen.insert(p.impl()).second) out.emplace_back(name, p);
  return out;
}

std::vector<Tensor> GPTMeshPipeline::parameters() const {
  std::vector<Tensor> out;
  for (auto& [name, p] : named_parameters()) out.push_back(p);
  return out;
}

void GPTMeshPipeline::zero_grad(bool set_to_none) {
  if (cut_) return cut_->zero_grad(set_to_none);
  for (const auto& chunk : chunks_) chunk->zero_grad(set_to_none);
}

Tensor GPTMeshPipeline::shard_of(const std::string& name, const Tensor& full) const {
  return TensorParallelGPT::shard_of(name, full, *tp_);
}

std::shared_ptr<GPTMeshPipeline> pipeline_gpt_on_mesh(const GPT& gpt, const parallel::DeviceMesh& mesh,
                                                      GPTMeshPipelineOptions options) {
  return std::make_shared<GPTMeshPipeline>(gpt, mesh, options);
}

}  // namespace mg::models
