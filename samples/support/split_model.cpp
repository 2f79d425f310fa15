#include "split_model.h"

#include <algorithm>
#include <unordered_map>

#include <fmt/format.h>

#include <minigrad/autograd/functions.h>
#include <minigrad/autograd/grad_mode.h>
#include <minigrad/core/generator.h>
#include <minigrad/core/ops.h>
#include <minigrad/parallel/c10d/launch_environment.h>
#include <minigrad/parallel/clip_grad.h>
#include <minigrad/parallel/context_parallel/sequence_layout.h>
#include <minigrad/parallel/context_parallel/wire.h>
#include <minigrad/parallel/full_state_dict.h>
#include <minigrad/parallel/loss_parallel.h>
#include <minigrad/parallel/partial_gradients.h>
#include <minigrad/parallel/placement.h>

#include "command_line.h"

namespace mg::samples {
namespace {

// Dropout's seed on dp rank r > 0 (rank 0 keeps the single-device run's).
uint64_t dp_seed(uint64_t seed, int dp_rank) { return seed + 7919 * static_cast<uint64_t>(dp_rank); }

}  // namespace

std::string ModelSplit::str() const {
  return fmt::format("dp {} x tp {} x {}cp {}{}{}{}{}", dp, tp, pp > 1 ? fmt::format("pp {} x ", pp) : "", cp,
                     sequence_parallel ? ", sequence parallel" : "",
                     pp > 1 ? fmt::format(", {} schedule, {} micro-batches, {} model chunk{}",
                                          interleaved ? "interleaved" : "1F1B", micro_batches,
                                          model_chunks, model_chunks > 1 ? "s" : "")
                            : "",
                     zero == 3 ? ", ZeRO-3 (FSDP by block)" : zero > 0 ? fmt::format(", ZeRO-{}", zero) : "",
                     recompute ? ", recompute" : "");
}

void check_split(const ModelSplit& s, int64_t batch_size, int64_t block_size, double dropout, double weight_decay) {
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
  if (s.zero > 1 && s.pp > 1)
    throw OptionError(fmt::format("--zero {} with --pp {}: ZeRO-2's and FSDP's reductions run in backward hooks, "
                                  "which would fire once per micro-batch inside the pipeline; --zero 1, which "
                                  "shards only AdamW's state, composes with the pipeline", s.zero, s.pp));
  if (s.zero > 0 && s.dp == 1)
    throw OptionError(fmt::format("--zero {} shards over the data-parallel ranks: it needs --dp 2 or more", s.zero));
  if (s.zero == 3 && weight_decay != 0.0)
    throw OptionError(fmt::format("--zero 3: AdamW steps FSDP's flat shards, which mix the 2-D weights with biases and "
                                  "LayerNorm gains, so it cannot decay the weights alone; pass --weight-decay 0 (not {})", weight_decay));
  if (s.recompute && s.tp > 1 && s.pp == 1)
    throw OptionError("--recompute with --tp: block checkpointing wraps the plain model's blocks; under --tp it needs --pp (the pipeline's checkpointing)");
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

SplitModel::SplitModel(models::SplitSpec spec, const ModelSplit& split, const DistributedRun& dist, uint64_t seed,
                       parallel::FSDPOptions fsdp)
    : spec_(std::move(spec)), split_(split), seed_(seed) {
  // Every dimension, size 1 included, so that every group exists.
  mesh_ = std::make_unique<parallel::DeviceMesh>(
      dist.group, std::vector<parallel::MeshDim>{{"dp", split.dp}, {"pp", split.pp}, {"cp", split.cp}, {"tp", split.tp}});
  parallel::ParallelizeOptions plan_options;
  plan_options.seed = seed;
  spec_.parallelize(*mesh_, split.sequence_parallel, plan_options);
  if (split.pp > 1) {
    parallel::MeshPipelineOptions options;
    options.micro_batches = split.micro_batches;
    options.schedule = split.interleaved ? parallel::Schedule::Interleaved1F1B : parallel::Schedule::OneFOneB;
    if (split.recompute) options.checkpoint = parallel::Checkpoint::Always;
    options.finish_gradients = false;  // once per step, after gradient accumulation
    pipeline_ = std::make_unique<parallel::MeshPipeline>(
        *spec_.model, *mesh_, spec_.pipeline_cut(split.pp, split.model_chunks), options);
  } else if (split.zero == 3) {
    fsdp_ = spec_.fully_shard(mesh_->group("dp"), fsdp);
  } else if (split.dp > 1) {
    // Each dp rank's gradient is its rows' share of the mean: summed over dp with the other
    // Partial gradients (ZeRO-2 and FSDP reduce over dp themselves).
    const auto& dp = mesh_->group("dp");
    for (const auto& [name, p] : spec_.model->named_parameters()) {
      const parallel::ParameterSpec* placed = parallel::spec_of(p);
      parallel::record_placement(p, name, placed ? placed->pieces[0].shape : p.shape(),
                                 parallel::DimPlacement{"dp", dp, dp->rank(), dp->size(),
                                                        parallel::Placement::replicate(), split.zero < 2});
    }
  }
  // Dropout: other rows, other masks. Rank 0 of dp keeps the single-device run's stream;
  // the ranks of one dp row (a tp group) stay alike, as replicated regions need.
  if (mesh_->rank("dp") > 0) manual_seed(dp_seed(seed, mesh_->rank("dp")));
}

std::vector<Generator::State> SplitModel::dp_generator_states() const {
  const Generator::State mine = default_generator().state();
  // The bits of the two uint64 carried as int64 (the process groups' integer type).
  Tensor local = from_vector(std::vector<int64_t>{static_cast<int64_t>(mine.seed), static_cast<int64_t>(mine.offset)},
                             Shape{2});
  const auto& dp = mesh_->group("dp");
  Tensor all = zeros({2 * dp->size()}, DType::Int64);
  dp->all_gather(all, local)->wait();
  const std::vector<int64_t> bits = all.to_vector<int64_t>();
  std::vector<Generator::State> states;
  for (size_t r = 0; r < bits.size(); r += 2)
    states.push_back({static_cast<uint64_t>(bits[r]), static_cast<uint64_t>(bits[r + 1])});
  return states;
}

void SplitModel::set_dp_generator_state(const std::vector<Generator::State>& states) const {
  MG_CHECK(!states.empty(), "SplitModel::set_dp_generator_state: no generator state");
  const auto r = static_cast<size_t>(mesh_->rank("dp"));
  default_generator().set_state(r < states.size() ? states[r]
                                                  : Generator::State{dp_seed(seed_, mesh_->rank("dp")), states[0].offset});
}

std::vector<Tensor> SplitModel::parameters() const {
  if (fsdp_) return fsdp_->parameters();
  return pipeline_ ? pipeline_->parameters() : spec_.model->parameters();
}

std::vector<nn::NamedTensor> SplitModel::named_parameters() const {
  if (pipeline_) return pipeline_->named_parameters();
  if (!fsdp_) return spec_.model->named_parameters();
  std::vector<nn::NamedTensor> out;  // flat shards: their pieces carry the names
  for (const Tensor& p : fsdp_->parameters()) out.emplace_back(fmt::format("flat_shard_{}", out.size()), p);
  return out;
}

std::vector<std::unique_ptr<optim::Optimizer>> SplitModel::make_zero_optimizers(const optim::AdamWOptions& options,
                                                                               bool master_weights) {
  MG_CHECK(split_.zero == 1 || split_.zero == 2, "SplitModel::make_zero_optimizers: --zero {}", split_.zero);
  // This rank's parameters (its plan's shards, its pipeline stages), in nanoGPT's two
  // groups; ZeRO cuts each list's AdamW state over dp.
  std::vector<nn::NamedTensor> decayed, rest;
  for (const nn::NamedTensor& p : named_parameters()) (p.second.dim() >= 2 ? decayed : rest).push_back(p);
  parallel::ZeroOptions zero_options;
  zero_options.stage = split_.zero;
  std::vector<std::unique_ptr<optim::Optimizer>> out;
  zero_.clear();
  for (int k = 0; k < 2; ++k) {
    optim::AdamWOptions group = options;
    if (k == 1) group.weight_decay(0.0);
    auto zero = std::make_unique<parallel::ZeroRedundancyOptimizer>(
        k == 0 ? decayed : rest, mesh_->group("dp"),
        [group, master_weights](std::vector<Tensor> shards) -> std::unique_ptr<optim::Optimizer> {
          const auto adamw = [group](std::vector<Tensor> params) -> std::unique_ptr<optim::Optimizer> {
            return std::make_unique<optim::AdamW>(std::move(params), group);
          };
          if (master_weights) return std::make_unique<optim::MasterWeights>(std::move(shards), adamw);
          return adamw(std::move(shards));
        },
        zero_options);
    zero_.push_back(zero.get());
    out.push_back(std::move(zero));
  }
  return out;
}

void SplitModel::set_training(bool on) {
  if (pipeline_) return pipeline_->train(on);
  spec_.model->train(on);
}

Tensor SplitModel::pipeline_step(const Tensor& x, const Tensor& y, double divide_by, double loss_scale) {
  const parallel::DeviceMesh& mesh = *mesh_;
  const auto& model_loss = spec_.loss;
  const Tensor loss = pipeline_->train_step(pipeline_->local_batch(x), pipeline_->local_batch(y),
                                            [&mesh, &model_loss, divide_by, loss_scale](const Tensor& out, const Tensor& t) {
                                              parallel::LossParallel loss_parallel(mesh);
                                              const Tensor sum = model_loss(out, t, Reduction::Sum);
                                              return loss_scale == 1.0 ? mul(sum, 1.0 / divide_by)
                                                                       : mul(mul(sum, loss_scale), 1.0 / divide_by);
                                            });
  return loss_scale == 1.0 ? loss : mul(loss, 1.0 / loss_scale);
}

double SplitModel::eval_loss(const Tensor& x, const Tensor& y) {
  // A training step's forward and backward in eval mode (the caller set it): the loss is
  // the forward's; the gradients it leaves are dropped (the next step zeroes them anyway).
  AutoGradMode grad(true);
  const double loss = ops::to_dtype(pipeline_step(x, y, static_cast<double>(x.numel())), DType::Float32).item<float>();
  pipeline_->zero_grad();
  return loss;
}

Tensor SplitModel::loss_share(const Tensor& x, const Tensor& y) {
  const int64_t B = x.size(0);
  const int dp = mesh_->size("dp"), dp_rank = mesh_->rank("dp");
  const int64_t base = B / dp, extra = B % dp;
  const int64_t start = dp_rank * base + std::min<int64_t>(dp_rank, extra);
  const int64_t rows = base + (dp_rank < extra ? 1 : 0);
  const auto local = [&](const Tensor& t) {  // this dp rank's rows, this cp rank's chunks of each
    const Tensor mine = dp > 1 ? ops::contiguous(ops::narrow(t, 0, start, rows)) : t;
    return split_.cp > 1 ? parallel::context_parallel::shard_sequence(mine, mesh_->rank("cp"), split_.cp) : mine;
  };
  parallel::LossParallel loss_parallel(*mesh_);
  const Tensor mean = spec_.loss((*spec_.model)(local(x)), local(y), Reduction::Mean);  // through FSDP's hooks too
  return rows == B ? mean : mean * (static_cast<double>(rows) / static_cast<double>(B));
}

std::vector<Tensor> SplitModel::gradient_holders() const {
  if (split_.zero != 2) return parameters();
  std::vector<Tensor> shards;
  for (const auto* zero : zero_)
    for (const Tensor& s : zero->parameters()) shards.push_back(s);
  return shards;
}

void SplitModel::reduce_gradients(Tensor& step_loss) {
  // Every Partial gradient: SP's over tp, everything over cp, the tied copies, dp's shares.
  if (pipeline_) pipeline_->finish_gradients();
  else parallel::reduce_partial_gradients(gradient_holders());
  if (split_.dp > 1 && !pipeline_) {  // the pipeline's loss is the whole batch's already
    step_loss = ops::clone(step_loss);
    mesh_->group("dp")->allreduce({step_loss})->wait();
  }
}

void SplitModel::sum_over_dp(Tensor& shares) {
  if (split_.dp > 1) mesh_->group("dp")->allreduce({shares})->wait();
}

Tensor SplitModel::clip_grad_norm_(double max_norm) {
  return parallel::clip_grad_norm_(gradient_holders(), *mesh_, max_norm);
}

Tensor SplitModel::clip_grad_norm_(const std::vector<Tensor>& holders, double max_norm) {
  return parallel::clip_grad_norm_(holders, *mesh_, max_norm);
}

void SplitModel::reduce_found_inf(Tensor& found_inf) const {
  mesh_->world()->allreduce({found_inf})->wait();
}

void SplitModel::place_masters(const optim::MasterWeights& masters) const {
  std::unordered_map<const TensorImpl*, std::string> names;
  for (const auto& [name, p] : named_parameters()) names.emplace(p.impl(), name);
  for (size_t i = 0; i < masters.parameters().size(); ++i) {
    const Tensor& p = masters.model_parameter(i);
    const auto it = names.find(p.impl());
    parallel::set_spec(masters.parameters()[i], parallel::pieces_of(p, it == names.end() ? std::string() : it->second));
  }
}

// ---- the single-device layout ----

std::vector<std::string> SplitModel::whole_optimizer_names() const {
  // optim::weight_decay_groups' order over the single-device parameters: the 2-D weights,
  // then the rest. A parameter's dimensions are the same in every split.
  std::vector<std::string> decayed, rest;
  for (const auto& [name, p] : spec_.model->named_parameters()) (p.dim() >= 2 ? decayed : rest).push_back(name);
  decayed.insert(decayed.end(), rest.begin(), rest.end());
  return decayed;
}

nn::TensorDict SplitModel::model_state_dict() {
  NoGradGuard no_grad;
  // The model's own layout (the GPT's lm_head.weight beside wte): a single-device state dict.
  return spec_.state_dict_of(parallel::full_state_dict(named_parameters(), *mesh_));
}

optim::TensorDict SplitModel::optimizer_state_dict(const std::vector<optim::Optimizer*>& optimizers) {
  parallel::OptimizerState whole;
  const std::vector<nn::NamedTensor> named = named_parameters();
  for (const optim::Optimizer* opt : optimizers)
    for (auto& [name, state] : parallel::full_optimizer_state(*opt, named, mesh_->world())) whole[name] = state;
  return parallel::indexed_optimizer_state(whole, whole_optimizer_names());
}

void SplitModel::load_model_state_dict(const nn::TensorDict& state, const std::string& source) {
  parallel::load_full_state_dict(named_parameters(), state, source);
}

void SplitModel::load_optimizer_state_dict(const std::vector<optim::Optimizer*>& optimizers,
                                         const optim::TensorDict& state, const std::string& source) {
  const parallel::OptimizerState whole = parallel::named_optimizer_state(state, whole_optimizer_names());
  const std::vector<nn::NamedTensor> named = named_parameters();
  for (optim::Optimizer* opt : optimizers) parallel::load_full_optimizer_state(*opt, named, whole, source);
}

}  // namespace mg::samples
