#include <minigrad/parallel/distributed/zero_redundancy_optimizer.h>

#include <cmath>
#include <unordered_set>

#include <minigrad/autograd/grad_mode.h>
#include <minigrad/core/ops.h>
#include <minigrad/parallel/distributed/same_model.h>
#include <minigrad/parallel/distributed/sharded_grad_norm.h>
#include <minigrad/parallel/distributed/sharded_state.h>

namespace mg::parallel {

ZeroRedundancyOptimizer::ZeroRedundancyOptimizer(std::vector<Tensor> params,
                                                 std::shared_ptr<ProcessGroup> process_group,
                                                 const OptimizerFactory& make_optimizer,
                                                 ZeroOptions options)
    : params_(std::move(params)), process_group_(std::move(process_group)), options_(options) {
  MG_CHECK(process_group_ != nullptr, "ZeroRedundancyOptimizer: the process group is null");
  MG_CHECK(options_.stage == 1 || options_.stage == 2,
           "ZeroRedundancyOptimizer: stage must be 1 or 2, got {} (stage 3 is "
           "FullyShardedDataParallel)",
           options_.stage);
  MG_CHECK(std::isfinite(options_.bucket_cap_mb) && options_.bucket_cap_mb > 0.0,
           "ZeroRedundancyOptimizer: bucket_cap_mb must be positive, got {}",
           options_.bucket_cap_mb);
  MG_CHECK(!params_.empty(), "ZeroRedundancyOptimizer: no parameters to optimize");
  std::vector<nn::NamedTensor> named;
  std::unordered_set<const TensorImpl*> seen;
  for (size_t i = 0; i < params_.size(); ++i) {
    const Tensor& p = params_[i];
    MG_CHECK(p.defined() && p.is_leaf() && p.requires_grad() && p.dtype() == DType::Float32,
             "ZeroRedundancyOptimizer: parameter {} must be a float32 leaf that requires grad",
             i);
    MG_CHECK(p.device() == process_group_->device(),
             "ZeroRedundancyOptimizer: parameter {} (shape {}) is on {}, but the process group "
             "({}) works on {}",
             i, p.shape(), p.device(), process_group_->backend_name(), process_group_->device());
    MG_CHECK(seen.insert(p.impl()).second,
             "ZeroRedundancyOptimizer: parameter {} appears twice in the list", i);
    named.emplace_back(fmt::format("parameter {}", i), p);
  }
  // Every rank starts from rank 0's parameters (stage 1 under DDP: they already are).
  check_same_shapes_across_ranks(*process_group_, named, "ZeroRedundancyOptimizer");
  broadcast_from_rank0(*process_group_, params_);

  // Buckets as DDP makes them: from the last parameter (whose gradient backward produces
  // first) to the first, closing one once it holds bucket_cap_mb.
  const auto cap = static_cast<size_t>(std::max(1.0, options_.bucket_cap_mb * 1024.0 * 1024.0));
  std::vector<std::vector<size_t>> buckets(1);
  size_t bytes = 0;
  for (size_t i = params_.size(); i-- > 0;) {
    buckets.back().push_back(i);
    bytes += params_[i].nbytes();
    if (bytes >= cap && i > 0) {
      buckets.emplace_back();
      bytes = 0;
    }
  }
  std::vector<Tensor> shards;
  std::vector<std::vector<std::string>> names;
  for (const std::vector<size_t>& indices : buckets) {
    std::vector<Tensor> members;
    names.emplace_back();
    for (size_t i : indices) {
      members.push_back(params_[i]);
      names.back().push_back(named[i].first);
    }
    buckets_.push_back(std::make_unique<FlatParameter>(std::move(members), indices,
                                                       process_group_->rank(),
                                                       process_group_->size(),
                                                       ShardStorage::ViewOfFull));
    shards.push_back(buckets_.back()->shard());
  }

  optimizer_ = make_optimizer(shards);
  MG_CHECK(optimizer_ != nullptr, "ZeroRedundancyOptimizer: the optimizer factory returned null");
  const std::vector<Tensor>& given = optimizer_->parameters();
  bool same = given.size() == shards.size();
  for (size_t b = 0; same && b < shards.size(); ++b) same = given[b].is_same(shards[b]);
  MG_CHECK(same,
           "ZeroRedundancyOptimizer: the optimizer factory must build the optimizer over the "
           "{} shard tensors it is given (it has {} parameters)",
           shards.size(), given.size());

  if (options_.stage == 2) {
    std::vector<FlatParameter*> groups;
    for (auto& b : buckets_) groups.push_back(b.get());
    reducer_ = ShardedGradReducer::create(std::move(groups), std::move(names), process_group_,
                                          "ZeroRedundancyOptimizer");
  }
}

void ZeroRedundancyOptimizer::step() {
  bool any_grad = false;
  if (options_.stage == 1) {
    // Under DDP every rank holds the averaged gradient: each takes its shard of it.
    for (auto& bucket : buckets_) {
      bool has = false;
      for (const Tensor& p : bucket->params()) has = has || p.grad().defined();
      bucket->shard().set_grad(has ? bucket->shard_of_grads() : Tensor());
      any_grad = any_grad || has;
    }
  } else {
    reducer_->check("at step");
    for (auto& bucket : buckets_) any_grad = any_grad || bucket->shard().grad().defined();
  }
  if (!any_grad) return;  // as an optimizer whose parameters have no gradients

  optimizer_->step();  // this rank's shards only
  if (options_.stage == 1)
    for (auto& bucket : buckets_) bucket->shard().set_grad(Tensor());  // a copy: let it go

  // Everyone's update into everyone's parameters. The all-gathers run one after another
  // on the communication thread; the caller waits once for all of them.
  std::vector<std::shared_ptr<Work>> works;
  all_gather_bytes_ = 0;
  for (auto& bucket : buckets_) {
    works.push_back(bucket->all_gather(*process_group_));
    all_gather_bytes_ += bucket->full().nbytes();
  }
  for (auto& work : works) work->wait();
}

void ZeroRedundancyOptimizer::zero_grad(bool set_to_none) {
  NoGradGuard no_grad;
  for (const Tensor& p : params_) {
    Tensor g = p.grad();
    if (!g.defined()) continue;
    if (set_to_none) {
      p.set_grad(Tensor());
    } else {
      g.zero_();
    }
  }
  optimizer_->zero_grad(set_to_none);
}

double ZeroRedundancyOptimizer::clip_grad_norm_(double max_norm) {
  if (options_.stage == 2) return parallel::clip_grad_norm_(optimizer_->parameters(), max_norm,
                                                            *process_group_);
  // Stage 1: every rank holds the whole averaged gradient, so the norm needs no
  // communication and every rank scales by the same factor.
  MG_CHECK(std::isfinite(max_norm) && max_norm >= 0.0,
           "ZeroRedundancyOptimizer::clip_grad_norm_: max_norm must be a finite number >= 0, "
           "got {}",
           max_norm);
  NoGradGuard no_grad;
  double squares = 0.0;
  for (const Tensor& p : params_) {
    const Tensor g = p.grad();
    if (!g.defined() || g.numel() == 0) continue;
    squares += static_cast<double>(
        ops::sum(ops::binary(BinaryOp::Mul, g, g), {}, false).to(Device::cpu()).item<float>());
  }
  const double total = std::sqrt(squares);
  const double coef = max_norm / (total + 1e-6);
  if (coef < 1.0)
    for (const Tensor& p : params_)
      if (Tensor g = p.grad(); g.defined()) g.mul_(coef);
  return total;
}

std::vector<const FlatParameter*> ZeroRedundancyOptimizer::groups() const {
  std::vector<const FlatParameter*> out;
  for (const auto& b : buckets_) out.push_back(b.get());
  return out;
}

void ZeroRedundancyOptimizer::load_state_dict(const nn::TensorDict& state,
                                              const std::string& source) {
  optimizer_->load_state_dict(state, source);
}

nn::TensorDict ZeroRedundancyOptimizer::full_state_dict() {
  return gather_full_optimizer_state(optimizer_->state_dict(), groups(), *process_group_);
}

void ZeroRedundancyOptimizer::load_full_state_dict(const nn::TensorDict& state,
                                                   const std::string& source) {
  optimizer_->load_state_dict(shard_full_optimizer_state(state, groups(), source), source);
}

ZeroStats ZeroRedundancyOptimizer::stats() const {
  ZeroStats out;
  for (const auto& b : buckets_) {
    out.parameter_bytes += b->full().nbytes();
    out.shard_bytes += b->shard().nbytes();
  }
  for (const auto& [name, t] : optimizer_->state_dict()) out.optimizer_state_bytes += t.nbytes();
  out.all_gather_bytes = all_gather_bytes_;
  return out;
}

ShardedReductionStats ZeroRedundancyOptimizer::last_reduction_stats() const {
  return reducer_ ? reducer_->last_stats() : ShardedReductionStats{};
}

}  // namespace mg::parallel
