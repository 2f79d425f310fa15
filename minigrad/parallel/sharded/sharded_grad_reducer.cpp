#include <minigrad/parallel/sharded/sharded_grad_reducer.h>

#include <algorithm>
#include <chrono>

#include <minigrad/autograd/grad_mode.h>
#include <minigrad/core/ops.h>
#include <minigrad/parallel/c10d/bucketing.h>

namespace mg::parallel {

namespace {
using Clock = std::chrono::steady_clock;
}

std::shared_ptr<ShardedGradReducer> ShardedGradReducer::create(
    std::vector<FlatParameter*> groups, std::vector<std::vector<std::string>> names,
    std::shared_ptr<ProcessGroup> process_group, std::string owner,
    std::function<void(size_t)> after_launch) {
  auto reducer = std::make_shared<ShardedGradReducer>(std::move(groups), std::move(names),
                                                      std::move(process_group), std::move(owner),
                                                      std::move(after_launch));
  reducer->register_hooks();
  return reducer;
}

ShardedGradReducer::ShardedGradReducer(std::vector<FlatParameter*> groups,
                                       std::vector<std::vector<std::string>> names,
                                       std::shared_ptr<ProcessGroup> process_group,
                                       std::string owner, std::function<void(size_t)> after_launch)
    : groups_(std::move(groups)),
      names_(std::move(names)),
      process_group_(std::move(process_group)),
      owner_(std::move(owner)),
      after_launch_(std::move(after_launch)) {
  MG_CHECK(process_group_ != nullptr, "{}: the process group is null", owner_);
  MG_CHECK(names_.size() == groups_.size(), "{}: names for {} groups, but {} groups", owner_,
           names_.size(), groups_.size());
  for (size_t g = 0; g < groups_.size(); ++g) {
    MG_CHECK(names_[g].size() == groups_[g]->params().size(),
             "{}: {} names for the {} parameters of group {}", owner_, names_[g].size(),
             groups_[g]->params().size(), g);
    ready_.emplace_back(groups_[g]->params().size(), false);
  }
  pending_.resize(groups_.size());
  filling_.resize(groups_.size());
  reset_iteration();
}

void ShardedGradReducer::register_hooks() {
  std::weak_ptr<ShardedGradReducer> weak = weak_from_this();
  for (size_t g = 0; g < groups_.size(); ++g) {
    const std::vector<Tensor>& params = groups_[g]->params();
    for (size_t k = 0; k < params.size(); ++k) {
      // The hook outlives the reducer (hooks cannot be removed): a weak reference.
      params[k].register_post_accumulate_grad_hook([weak, g, k](Tensor&) {
        if (auto reducer = weak.lock()) reducer->mark_ready(g, k);
      });
    }
  }
}

void ShardedGradReducer::reset_iteration() {
  for (size_t g = 0; g < groups_.size(); ++g) {
    std::fill(ready_[g].begin(), ready_[g].end(), false);
    pending_[g] = ready_[g].size();
    filling_[g] = Tensor();
  }
  next_group_ = 0;
  iteration_started_ = false;
}

std::string ShardedGradReducer::unready_names() const {
  std::vector<std::string> unready;
  for (size_t g = 0; g < groups_.size(); ++g)
    for (size_t k = 0; k < ready_[g].size(); ++k)
      if (!ready_[g][k]) unready.push_back(names_[g][k]);
  return quoted_names(unready);
}

void ShardedGradReducer::check(const char* when) const {
  std::lock_guard<std::mutex> lock(mutex_);
  MG_CHECK(failure_.empty(),
           "{}: a gradient reduction failed earlier, so the ranks can no longer agree on the "
           "parameters (rank {}, {}): {}",
           owner_, process_group_->rank(), when, failure_);
  // Every finished iteration resets the flags: one still set is a backward left half done.
  const bool started = std::any_of(ready_.begin(), ready_.end(), [](const std::vector<bool>& r) {
    return std::any_of(r.begin(), r.end(), [](bool b) { return b; });
  });
  MG_CHECK(!started,
           "{}: the last backward did not reduce every gradient (rank {}, {}): parameter(s) {} "
           "received no gradient. Every parameter must take part in each backward",
           owner_, process_group_->rank(), when, unready_names());
}

void ShardedGradReducer::mark_ready(size_t group, size_t param) {
  std::lock_guard<std::mutex> lock(mutex_);
  if (!failure_.empty()) return;  // reported already; check() reports it again
  MG_CHECK(!ready_[group][param],
           "{}: parameter '{}' got a second gradient before its group's reduction (rank {}); "
           "a backward left other parameters without one",
           owner_, names_[group][param], process_group_->rank());
  if (!iteration_started_) {  // the first gradient of this backward
    iteration_started_ = true;
    stats_ = ShardedReductionStats{};
  }
  // Into the group's flat buffer at once, so the full-sized gradient lives no longer.
  FlatParameter& flat = *groups_[group];
  if (!filling_[group].defined()) {
    filling_[group] = flat.new_flat();
    hold(filling_[group].nbytes());
  }
  const Tensor& p = flat.params()[param];
  const Tensor grad = p.grad();
  const Tensor slot = flat.slot(filling_[group], param);
  if (grad.defined()) {
    ops::copy_(slot, ops::to_dtype(grad, slot.dtype()));  // into reduce_dtype (mixed precision)
    p.set_grad(Tensor());
  } else if (slot.numel() > 0) {
    backend(slot.device()).fill(slot, 0.0);
  }
  ready_[group][param] = true;
  --pending_[group];
  // Strictly in group order: every rank must issue the same collectives in the same order.
  while (next_group_ < groups_.size() && pending_[next_group_] == 0) launch(next_group_++);
  if (next_group_ == groups_.size()) finish_iteration();
}

void ShardedGradReducer::fail(const std::exception& e) {
  failure_ = e.what();
  in_flight_.clear();
  reset_iteration();
  buffer_bytes_ = 0;
}

void ShardedGradReducer::launch(size_t g) {
  FlatParameter& flat = *groups_[g];
  while (in_flight_.size() >= kMaxInFlight) complete_oldest();
  InFlight job;
  job.group = g;
  job.input = std::move(filling_[g]);
  job.output = empty(Shape{flat.layout().shard_numel}, job.input.dtype(), job.input.device());
  hold(job.output.nbytes());
  try {
    job.work = process_group_->reduce_scatter(job.output, job.input, ReduceOp::Average);
  } catch (const std::exception& e) {
    fail(e);
    throw;
  }
  ++stats_.collectives;
  stats_.bytes += job.input.nbytes();
  in_flight_.push_back(std::move(job));
  if (after_launch_) after_launch_(g);
}

void ShardedGradReducer::complete_oldest() {
  InFlight job = std::move(in_flight_.front());
  in_flight_.pop_front();
  const auto start = Clock::now();
  try {
    job.work->wait();
  } catch (const std::exception& e) {
    fail(e);
    throw;
  }
  stats_.wait_seconds += std::chrono::duration<double>(Clock::now() - start).count();
  stats_.comm_seconds += std::max(0.0, job.work->duration_seconds());
  buffer_bytes_ -= job.input.nbytes() + job.output.nbytes();
  const Tensor& shard = groups_[job.group]->shard();
  const Tensor grad = shard.grad();
  // The shard's gradient in the shard's dtype (a float32 master's, under a bfloat16 reduce).
  const Tensor reduced = ops::to_dtype(job.output, shard.dtype());
  if (grad.defined()) {
    NoGradGuard no_grad;
    Tensor(grad).add_(reduced);
  } else {
    shard.set_grad(reduced);
  }
}

void ShardedGradReducer::hold(size_t bytes) {
  buffer_bytes_ += bytes;
  stats_.peak_buffer_bytes = std::max(stats_.peak_buffer_bytes, buffer_bytes_);
}

void ShardedGradReducer::finish_iteration() {
  while (!in_flight_.empty()) complete_oldest();
  last_stats_ = stats_;
  reset_iteration();
}

ShardedReductionStats ShardedGradReducer::last_stats() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return last_stats_;
}

}  // namespace mg::parallel
