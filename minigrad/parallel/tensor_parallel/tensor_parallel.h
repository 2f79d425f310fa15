// TensorParallel: tensor parallelism in one process, over the devices DataParallel uses
// (CPU devices in CI, distinct GPUs with NCCL, one GPU named several times).
//
//   auto tp = std::make_shared<parallel::TensorParallel>(*mlp, devices);  // mlp stays whole
//   optim::SGD sgd(tp->parameters(), 0.1);                               // every rank's shards
//   cross_entropy(tp->forward(x), y).backward();                          // as with any module
//
// Each rank of the group is a thread of its own (one per device, on the worker pool that
// parallel_apply runs its replicas on), and runs exactly the code a process of a Gloo or NCCL group runs: its
// shard's forward, with the collectives of functions.h meeting the other ranks' threads in
// an InProcessGroup. Threads, not one thread taking the ranks in turn, because a rank
// blocks in each collective until every rank has reached it.
//
// The ranks' autograd graphs are joined to the caller's by one node, as replicate joins
// DataParallel's replicas: its backward runs every rank's backward at once, again on a
// thread per rank (their backward collectives meet the same way), and hands back the
// gradients of the input and of every rank's parameters, so the caller's backward, the
// optimizer and gradient hooks see ordinary leaves.
//
// At the edge of the region a tensor is either Replicate (each rank gets, or gives, the
// whole tensor: the ranks' copies are equal, and so are their gradients, by the
// conventions of functions.h) or Shard (split along the last dimension, rank r's part
// r), as DTensor's Replicate() and Shard(-1).
#pragma once

#include <optional>
#include <vector>

#include <minigrad/nn/layers.h>
#include <minigrad/parallel/placement.h>
#include <minigrad/parallel/tensor_parallel/in_process_group.h>

namespace mg::parallel {

// shards[r]->forward(rank r's part of input) for every rank of `group` at once, each on
// a thread of its own with devices()[r] current. Returns the ranks' outputs put together
// as `output_placement` says, on `output_device` (default: devices()[0]). A failure in
// any rank is re-thrown naming the rank and device; the other ranks are released from
// their collectives (InProcessGroup::abort) rather than left waiting.
Tensor tensor_parallel_apply(const std::vector<nn::ModulePtr>& shards,
                             const InProcessGroupPtr& group, const Tensor& input,
                             Placement input_placement = Placement::replicate(),
                             Placement output_placement = Placement::replicate(),
                             std::optional<Device> output_device = std::nullopt);

class TensorParallel : public nn::Cloneable<TensorParallel> {
 public:
  // `mlp` (a Sequential of Linear and ReLU) split with parallelize_mlp over `devices`,
  // rank r's shards on devices[r]. `mlp` is left as it is: the shards are copies.
  TensorParallel(const nn::Sequential& mlp, std::vector<Device> devices);
  // Shards built by the caller: shards[r] uses group->rank(r).
  TensorParallel(std::vector<nn::ModulePtr> shards, InProcessGroupPtr group);

  // The whole input (on any device) in, the whole output out on devices()[0].
  Tensor forward(const Tensor& input) override;

  // Rank r's module, registered as child "rank<r>" (parameters "rank0.0.weight", ...).
  nn::ModulePtr shard(int rank) const;
  const InProcessGroupPtr& group() const { return group_; }
  const std::vector<Device>& devices() const { return group_->devices(); }
  std::string extra_repr() const override;

 private:
  InProcessGroupPtr group_;
};

}  // namespace mg::parallel
