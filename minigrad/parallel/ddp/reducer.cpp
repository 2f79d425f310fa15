#include <minigrad/parallel/ddp/reducer.h>

#include <algorithm>
#include <cmath>
#include <unordered_set>

#include <minigrad/autograd/node.h>
#include <minigrad/core/fault_injection.h>
#include <minigrad/core/ops.h>
#include <minigrad/core/profiler.h>

namespace mg::parallel {

namespace {
using Clock = std::chrono::steady_clock;
}

std::shared_ptr<Reducer> Reducer::create(std::vector<Tensor> params, std::vector<std::string> names,
                                         std::shared_ptr<ProcessGroup> process_group,
                                         size_t first_bucket_bytes, size_t bucket_bytes,
                                         bool find_unused_parameters,
                                         bool gradient_as_bucket_view) {
  auto reducer = std::make_shared<Reducer>(std::move(params), std::move(names),
                                           std::move(process_group), first_bucket_bytes,
                                           bucket_bytes, find_unused_parameters,
                                           gradient_as_bucket_view);
  reducer->register_hooks();
  return reducer;
}

Reducer::Reducer(std::vector<Tensor> params, std::vector<std::string> names,
                 std::shared_ptr<ProcessGroup> process_group, size_t first_bucket_bytes,
                 size_t bucket_bytes, bool find_unused_parameters, bool gradient_as_bucket_view)
    : params_(std::move(params)),
      names_(std::move(names)),
      process_group_(std::move(process_group)),
      find_unused_parameters_(find_unused_parameters),
      gradient_as_bucket_view_(gradient_as_bucket_view) {
  MG_CHECK(process_group_ != nullptr, "DistributedDataParallel: the process group is null");
  MG_CHECK(names_.size() == params_.size(), "Reducer: {} names for {} parameters", names_.size(),
           params_.size());
  MG_CHECK(first_bucket_bytes > 0 && bucket_bytes > 0,
           "DistributedDataParallel: bucket sizes must be positive (first {} bytes, others {} "
           "bytes)",
           first_bucket_bytes, bucket_bytes);
  assign_buckets(first_bucket_bytes, bucket_bytes);
  ready_.assign(params_.size(), false);
}

void Reducer::assign_buckets(size_t first_bucket_bytes, size_t bucket_bytes) {
  const std::vector<std::vector<size_t>> closed =
      compute_bucket_assignment_by_size(params_, first_bucket_bytes, bucket_bytes);
  bucket_of_.assign(params_.size(), 0);
  for (size_t b = 0; b < closed.size(); ++b) {
    Bucket bucket;
    bucket.params = closed[b];
    int64_t total = 0;
    for (size_t index : bucket.params) {
      total += params_[index].numel();
      bucket_of_[index] = b;
    }
    const Tensor& first = params_[bucket.params[0]];
    bucket.flat = zeros(Shape{total}, first.dtype(), first.device());
    int64_t offset = 0;
    for (size_t index : bucket.params) {
      const Tensor& p = params_[index];
      bucket.views.push_back(ops::view(ops::narrow(bucket.flat, 0, offset, p.numel()), p.shape()));
      offset += p.numel();
    }
    buckets_.push_back(std::move(bucket));
    bucket_indices_.push_back(closed[b]);
  }
  reset_iteration();
}

void Reducer::register_hooks() {
  std::weak_ptr<Reducer> weak = weak_from_this();
  for (size_t i = 0; i < params_.size(); ++i) {
    // The hook outlives this reducer (a tensor's hooks cannot be removed), so it holds a
    // weak reference and does nothing once the DistributedDataParallel is gone.
    params_[i].register_post_accumulate_grad_hook([weak, i](Tensor&) {
      if (auto reducer = weak.lock()) reducer->mark_ready(i);
    });
  }
}

std::vector<size_t> Reducer::bucket_bytes() const {
  std::vector<size_t> out;
  for (const Bucket& b : buckets_) out.push_back(b.flat.nbytes());
  return out;
}

ReductionStats Reducer::last_stats() const { return stats_; }

void Reducer::reset_iteration() {
  std::fill(ready_.begin(), ready_.end(), false);
  for (Bucket& b : buckets_) {
    b.pending = b.params.size();
    b.work.reset();
  }
  next_bucket_ = 0;
}

std::string Reducer::unready_names() const {
  std::vector<std::string> unready;
  for (size_t i = 0; i < params_.size(); ++i)
    if (!ready_[i]) unready.push_back(names_[i]);
  return quoted_names(unready);
}

void Reducer::prepare_for_forward() {
  std::lock_guard<std::mutex> lock(mutex_);
  MG_CHECK(state_ != State::Failed,
           "DistributedDataParallel: the gradient reduction of an earlier iteration failed, so "
           "the replicas can no longer be kept equal (rank {}): {}",
           process_group_->rank(), failure_);
  if (state_ == State::Armed) {
    const bool any_ready = std::any_of(ready_.begin(), ready_.end(), [](bool r) { return r; });
    MG_CHECK(!any_ready,
             "DistributedDataParallel: the previous iteration's gradient reduction did not "
             "finish (rank {}): parameter(s) {} received no gradient in its backward. If some "
             "parameters are not used to compute the output in some iterations, construct "
             "DistributedDataParallel with DDPOptions::find_unused_parameters = true",
             process_group_->rank(), unready_names());
  }
  // Forward without backward (evaluation with grad mode on) leaves nothing to undo.
  state_ = State::Idle;
  reset_iteration();
}

void Reducer::disarm() {
  std::lock_guard<std::mutex> lock(mutex_);
  state_ = State::Idle;
}

void Reducer::prepare_for_backward(const Tensor& output) {
  std::lock_guard<std::mutex> lock(mutex_);
  reset_iteration();
  stats_ = ReductionStats{};
  state_ = State::Armed;
  if (!find_unused_parameters_) return;

  // The parameters this output depends on are the leaves of its graph.
  std::unordered_set<const TensorImpl*> used;
  std::unordered_set<const Node*> seen;
  std::vector<Node*> stack;
  if (output.defined() && output.grad_fn()) stack.push_back(output.grad_fn().get());
  while (!stack.empty()) {
    Node* node = stack.back();
    stack.pop_back();
    if (!seen.insert(node).second) continue;
    if (auto* acc = dynamic_cast<AccumulateGrad*>(node)) used.insert(acc->leaf().get());
    for (const Edge& e : node->next_edges())
      if (e.valid()) stack.push_back(e.function.get());
  }
  // Parameters outside the graph are ready now: their slots will hold zeros.
  for (size_t i = 0; i < params_.size(); ++i) {
    if (used.count(params_[i].impl()) != 0) continue;
    ready_[i] = true;
    --buckets_[bucket_of_[i]].pending;
  }
  launch_ready_buckets();
}

void Reducer::mark_ready(size_t index) {
  std::lock_guard<std::mutex> lock(mutex_);
  // Idle: no_sync(), or a backward not through our forward. Failed: already reported.
  if (state_ == State::Idle || state_ == State::Failed) return;
  MG_CHECK(state_ != State::Finished,
           "DistributedDataParallel: parameter '{}' received a gradient after this iteration's "
           "reduction had finished (rank {}): backward ran twice for one forward. Run forward "
           "again before each backward, or accumulate under no_sync()",
           names_[index], process_group_->rank());
  MG_CHECK(!ready_[index],
           "DistributedDataParallel: parameter '{}' was marked ready twice in one backward "
           "(rank {})",
           names_[index], process_group_->rank());
  ready_[index] = true;
  --buckets_[bucket_of_[index]].pending;
  launch_ready_buckets();
}

void Reducer::launch_ready_buckets() {
  // Strictly in bucket order: every rank must issue the same collectives in the same order.
  while (next_bucket_ < buckets_.size() && buckets_[next_bucket_].pending == 0)
    launch(buckets_[next_bucket_++]);
  if (next_bucket_ == buckets_.size() && state_ == State::Armed) finalize();
}

// In a trace: "bucket <b> ready" spans the copy into the bucket and the launch, and the
// collective's span on the communication thread names the bucket ("for": "DDP bucket b").
void Reducer::launch(Bucket& bucket) {
  const auto index = static_cast<size_t>(&bucket - buckets_.data());
  profiler::Span span("bucket {} ready", index);
  span.category("ddp")
      .arg("bucket", index)
      .arg("parameters", bucket.params.size())
      .arg("bytes", bucket.flat.nbytes());
  for (size_t k = 0; k < bucket.params.size(); ++k) {
    Tensor& slot = bucket.views[k];
    const Tensor grad = params_[bucket.params[k]].grad();
    if (!grad.defined()) {
      slot.fill_(0.0);  // an unused parameter contributes nothing
    } else if (grad.data_ptr() != slot.data_ptr()) {  // (gradient_as_bucket_view: already there)
      ops::copy_(slot, grad);
    }
  }
  try {
    profiler::CollectiveLabel label("DDP bucket {}", index);
    // parity fault: the last bucket never reduced (fault_injection.h). Its all-reduce runs
    // on a copy, so the ranks still meet in every collective.
    const bool skip = testing::fault_is_on(testing::Fault::DdpLastBucketNotReduced) &&
                      index + 1 == buckets_.size();
    // A compressing hook sends a 16-bit copy, widened back into the bucket in finalize().
    const DType wire_dtype = comm_hook_ == CommHook::BF16Compress   ? DType::BFloat16
                             : comm_hook_ == CommHook::FP16Compress ? DType::Float16
                                                                    : bucket.flat.dtype();
    bucket.wire = wire_dtype == bucket.flat.dtype() ? bucket.flat : ops::to_dtype(bucket.flat, wire_dtype);
    bucket.work = process_group_->allreduce(skip ? ops::clone(bucket.wire) : bucket.wire, ReduceOp::Average);
  } catch (const std::exception& e) {
    state_ = State::Failed;
    failure_ = e.what();
    throw;
  }
  stats_.bytes += bucket.wire.nbytes();
}

void Reducer::set_comm_hook(CommHook hook) {
  MG_CHECK(state_ != State::Armed, "DistributedDataParallel::register_comm_hook: a backward is expecting its "
                                   "gradients reduced; set the hook between iterations");
  comm_hook_ = hook;
}

void Reducer::finalize() {
  const auto start = Clock::now();
  try {
    profiler::Span span("wait for all-reduce");
    span.category("ddp").arg("buckets", buckets_.size());
    for (Bucket& bucket : buckets_) bucket.work->wait();
  } catch (const std::exception& e) {
    state_ = State::Failed;
    failure_ = e.what();
    throw;
  }
  stats_.wait_seconds = std::chrono::duration<double>(Clock::now() - start).count();
  stats_.buckets = buckets_.size();
  for (Bucket& bucket : buckets_) {
    stats_.comm_seconds += std::max(0.0, bucket.work->duration_seconds());
    if (!bucket.wire.is_same(bucket.flat)) ops::copy_(bucket.flat, ops::to_dtype(bucket.wire, bucket.flat.dtype()));
    bucket.wire = Tensor();
    for (size_t k = 0; k < bucket.params.size(); ++k) {
      const Tensor& p = params_[bucket.params[k]];
      const Tensor& averaged = bucket.views[k];
      const Tensor grad = p.grad();
      if (gradient_as_bucket_view_) {
        if (!grad.defined() || grad.data_ptr() != averaged.data_ptr()) p.set_grad(averaged);
      } else if (grad.defined()) {
        ops::copy_(grad, averaged);
      } else {
        p.set_grad(ops::clone(averaged));
      }
    }
    bucket.work.reset();
  }
  state_ = State::Finished;
}

}  // namespace mg::parallel
