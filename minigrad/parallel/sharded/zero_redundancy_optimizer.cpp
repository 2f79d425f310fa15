#include <minigrad/parallel/sharded/zero_redundancy_optimizer.h>

#include <algorithm>

#include <unordered_set>

#include <minigrad/autograd/grad_mode.h>
#include <minigrad/core/fault_injection.h>
#include <minigrad/core/ops.h>
#include <minigrad/nn/optim/master_weights.h>
#include <minigrad/parallel/c10d/bucketing.h>
#include <minigrad/parallel/c10d/same_model.h>
#include <minigrad/parallel/clip_grad.h>
#include <minigrad/parallel/placement.h>
#include <minigrad/parallel/sharded/sharded_state.h>

namespace mg::parallel {

namespace {

ProcessGroup& group_of(const std::shared_ptr<ProcessGroup>& group) {
  MG_CHECK(group != nullptr, "ZeroRedundancyOptimizer: the process group is null");
  return *group;
}

// The tensors of `named`, their names recorded first (placement.h: name_placements).
std::vector<Tensor> named_recorded(const std::vector<nn::NamedTensor>& named) {
  name_placements(named);
  std::vector<Tensor> tensors;
  for (const auto& [name, p] : named) tensors.push_back(p);
  return tensors;
}

}  // namespace

// The parameters in buckets, made (and checked, and made equal over the ranks) before
// the optim::Optimizer base, which holds the shards as its parameters.
struct ZeroRedundancyOptimizer::Buckets {
  std::vector<std::unique_ptr<FlatParameter>> list;
  std::vector<Tensor> shards;
  std::vector<std::vector<std::string>> names;  // for messages: "parameter <i>"

  Buckets(const std::vector<Tensor>& params, ProcessGroup& group, const ZeroOptions& options) {
    MG_CHECK(options.stage == 1 || options.stage == 2,
             "ZeroRedundancyOptimizer: stage must be 1 or 2, got {} (stage 3 is "
             "FullyShardedDataParallel)",
             options.stage);
    const size_t cap =
        bucket_bytes_from_mib(options.bucket_cap_mb, "ZeroRedundancyOptimizer", "bucket_cap_mb");
    MG_CHECK(!params.empty(), "ZeroRedundancyOptimizer: no parameters to optimize");
    std::vector<nn::NamedTensor> named;
    std::unordered_set<const TensorImpl*> seen;
    for (size_t i = 0; i < params.size(); ++i) {
      const Tensor& p = params[i];
      // Any one float dtype: bfloat16 parameters shard with an optim::MasterWeights inside
      // (float32 master shards, the ZeRO paper's 2 + 2 + 12 bytes).
      MG_CHECK(p.defined() && p.is_leaf() && p.requires_grad() && is_floating_point(p.dtype()) &&
                   p.dtype() == params[0].dtype(),
               "ZeroRedundancyOptimizer: parameter {} must be a floating-point leaf that requires grad, of "
               "parameter 0's dtype ({})",
               i, params[0].defined() ? std::string(dtype_name(params[0].dtype())) : "undefined");
      MG_CHECK(p.device() == group.device(),
               "ZeroRedundancyOptimizer: parameter {} (shape {}) is on {}, but the process group "
               "({}) works on {}",
               i, p.shape(), p.device(), group.backend_name(), group.device());
      MG_CHECK(seen.insert(p.impl()).second,
               "ZeroRedundancyOptimizer: parameter {} appears twice in the list", i);
      named.emplace_back(fmt::format("parameter {}", i), p);
    }
    // Every rank starts from rank 0's parameters (stage 1 under DDP: they already are).
    check_same_shapes_across_ranks(group, named, "ZeroRedundancyOptimizer");
    broadcast_from_rank0(group, params);

    // As DDP's buckets (all float32, every one up to bucket_cap_mb): from the last
    // parameter, whose gradient backward produces first, to the first.
    for (const std::vector<size_t>& indices : compute_bucket_assignment_by_size(params, cap, cap)) {
      std::vector<Tensor> tensors;
      names.emplace_back();
      for (size_t i : indices) {
        tensors.push_back(params[i]);
        names.back().push_back(named[i].first);
      }
      list.push_back(std::make_unique<FlatParameter>(std::move(tensors), indices, group.rank(),
                                                     group.size(), ShardStorage::ViewOfFull));
      shards.push_back(list.back()->shard());
    }
  }
};

ZeroRedundancyOptimizer::ZeroRedundancyOptimizer(std::vector<Tensor> params,
                                                 std::shared_ptr<ProcessGroup> process_group,
                                                 const OptimizerFactory& make_optimizer,
                                                 ZeroOptions options)
    : ZeroRedundancyOptimizer(Buckets(params, group_of(process_group), options), params,
                              process_group, make_optimizer, options) {}

ZeroRedundancyOptimizer::ZeroRedundancyOptimizer(const std::vector<nn::NamedTensor>& params,
                                                 std::shared_ptr<ProcessGroup> process_group,
                                                 const OptimizerFactory& make_optimizer,
                                                 ZeroOptions options)
    : ZeroRedundancyOptimizer(named_recorded(params), std::move(process_group), make_optimizer,
                              options) {}

ZeroRedundancyOptimizer::ZeroRedundancyOptimizer(Buckets&& buckets, std::vector<Tensor> params,
                                                 std::shared_ptr<ProcessGroup> process_group,
                                                 const OptimizerFactory& make_optimizer,
                                                 ZeroOptions options)
    : optim::Optimizer(buckets.shards, "ZeroRedundancyOptimizer"),
      full_params_(std::move(params)),
      process_group_(std::move(process_group)),
      options_(options),
      buckets_(std::move(buckets.list)) {
  local_ = make_optimizer(parameters());
  MG_CHECK(local_ != nullptr, "ZeroRedundancyOptimizer: the optimizer factory returned null");
  const std::vector<Tensor>& given = local_->parameters();
  // An optim::MasterWeights steps float32 masters of the shards (16-bit parameters): its
  // parameter b stands for shard b.
  const auto* masters = dynamic_cast<const optim::MasterWeights*>(local_.get());
  bool same = given.size() == parameters().size();
  for (size_t b = 0; same && b < given.size(); ++b)
    same = (masters ? masters->model_parameter(b) : given[b]).is_same(parameters()[b]);
  MG_CHECK(same,
           "ZeroRedundancyOptimizer: the optimizer factory must build the optimizer over the "
           "{} shard tensors it is given (it has {} parameters)",
           parameters().size(), given.size());
  // Every rank keeps every parameter whole; each shard holds flat pieces of some.
  for (const auto& b : buckets_) b->record_spec(std::vector<std::string>(b->params().size()), "dp", process_group_);
  // Unless the caller placed them on dp already (stage 1 under a trainer that sums the dp
  // ranks' gradients itself records them Partial there).
  for (const Tensor& p : full_params_) {
    const ParameterSpec* spec = spec_of(p);
    const bool placed = spec != nullptr && std::any_of(spec->pieces[0].placements.begin(), spec->pieces[0].placements.end(),
                                                       [](const DimPlacement& d) { return d.dim == "dp"; });
    if (!placed)
      record_placement(p, "", p.shape(),
                       DimPlacement{"dp", process_group_, process_group_->rank(), process_group_->size(),
                                    Placement::replicate(), false});
  }
  if (options_.stage == 2) {
    std::vector<FlatParameter*> groups;
    for (auto& b : buckets_) groups.push_back(b.get());
    reducer_ = ShardedGradReducer::create(std::move(groups), std::move(buckets.names),
                                          process_group_, "ZeroRedundancyOptimizer");
  }
}

ZeroRedundancyOptimizer::~ZeroRedundancyOptimizer() = default;

void ZeroRedundancyOptimizer::prepare_gradients() {
  if (options_.stage == 1 && !shards_prepared_) {
    // Under DDP every rank holds the averaged gradient: each takes its shard of it.
    for (auto& bucket : buckets_) {
      bool has = false;
      for (const Tensor& p : bucket->params()) has = has || p.grad().defined();
      bucket->shard().set_grad(has ? bucket->shard_of_grads() : Tensor());
    }
    shards_prepared_ = true;
  }
  local_->prepare_gradients();
}

void ZeroRedundancyOptimizer::step() {
  bool any_grad = false;
  if (options_.stage == 1) {
    prepare_gradients();
    shards_prepared_ = false;  // the next step takes them again
    for (auto& bucket : buckets_) any_grad = any_grad || bucket->shard().grad().defined();
  } else {
    reducer_->check("at step");
    for (auto& bucket : buckets_) any_grad = any_grad || bucket->shard().grad().defined();
  }
  if (!any_grad) return;  // as an optimizer whose parameters have no gradients

  local_->step();  // this rank's shards only
  if (options_.stage == 1)
    for (auto& bucket : buckets_) bucket->shard().set_grad(Tensor());  // a copy: let it go

  // Everyone's update into everyone's parameters. The all-gathers run one after another
  // on the communication thread; the caller waits once for all of them.
  std::vector<std::shared_ptr<Work>> works;
  all_gather_bytes_ = 0;
  for (auto& bucket : buckets_) {
    // parity fault: the all-gather skipped; each rank keeps only its own shard's update.
    if (testing::fault_is_on(testing::Fault::ZeroAllGatherSkipped)) break;
    works.push_back(bucket->all_gather(*process_group_));
    all_gather_bytes_ += bucket->full().nbytes();
  }
  for (auto& work : works) work->wait();
}

void ZeroRedundancyOptimizer::zero_grad(bool set_to_none) {
  optim::Optimizer::zero_grad(set_to_none);  // the shards'
  local_->zero_grad(set_to_none);            // and a MasterWeights' float32 masters'
  shards_prepared_ = false;
  zero_grads(full_params_, set_to_none);     // stage 1's full gradients (stage 2 frees them)
}

Tensor ZeroRedundancyOptimizer::clip_grad_norm_(double max_norm, double norm_type) {
  // Stage 2's gradients are the shards'; stage 1's the full ones, alike on every rank.
  return parallel::clip_grad_norm_(options_.stage == 2 ? parameters() : full_params_, process_group_, max_norm,
                                   norm_type);
}

std::vector<const FlatParameter*> ZeroRedundancyOptimizer::buckets() const {
  std::vector<const FlatParameter*> out;
  for (const auto& b : buckets_) out.push_back(b.get());
  return out;
}

std::unique_ptr<optim::Optimizer> ZeroRedundancyOptimizer::make_like(std::vector<Tensor>) const {
  MG_FAIL("ZeroRedundancyOptimizer::make_like: a ZeroRedundancyOptimizer shards a model's "
          "parameters over its process group; build a new one over them (its local optimizer "
          "is {})",
          local_->name());
}

void ZeroRedundancyOptimizer::check_param_state(
    size_t index, const optim::TensorDict& state,
    const std::function<std::string(const std::string&)>& /*key*/,
    std::vector<std::string>& problems) const {
  // The local optimizer's own checks, on this one shard's state.
  optim::TensorDict one;
  for (const auto& [name, t] : state) one.emplace(fmt::format("{}.{}", name, index), t);
  try {
    local_->check_state_dict(one, fmt::format("the state of shard {}", index));
  } catch (const Error& e) {
    problems.push_back(e.what());
  }
}

void ZeroRedundancyOptimizer::set_param_state(size_t index, const optim::TensorDict& state) {
  local_->set_state(index, state);
}

nn::TensorDict ZeroRedundancyOptimizer::full_state_dict() {
  return gather_full_optimizer_state(state_dict(), buckets(), *process_group_);
}

void ZeroRedundancyOptimizer::load_full_state_dict(const nn::TensorDict& state,
                                                   const std::string& source) {
  load_state_dict(shard_full_optimizer_state(state, buckets(), source), source);
}

ZeroStats ZeroRedundancyOptimizer::stats() const {
  ZeroStats out;
  for (const auto& b : buckets_) {
    out.parameter_bytes += b->full().nbytes();
    out.shard_bytes += b->shard().nbytes();
  }
  for (const auto& [name, t] : state_dict()) out.optimizer_state_bytes += t.nbytes();
  out.all_gather_bytes = all_gather_bytes_;
  return out;
}

ShardedReductionStats ZeroRedundancyOptimizer::last_reduction_stats() const {
  return reducer_ ? reducer_->last_stats() : ShardedReductionStats{};
}

}  // namespace mg::parallel
