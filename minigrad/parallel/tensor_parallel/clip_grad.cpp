#include <minigrad/parallel/tensor_parallel/clip_grad.h>

#include <cmath>

#include <minigrad/autograd/grad_mode.h>
#include <minigrad/core/ops.h>
#include <minigrad/nn/utils/clip_grad.h>
#include <minigrad/parallel/tensor_parallel/layers.h>

namespace mg::parallel {

namespace {

std::vector<Tensor> grads_of(const std::vector<Tensor>& params) {
  std::vector<Tensor> grads;
  for (const Tensor& p : params)
    if (p.grad().defined()) grads.push_back(p.grad());
  return grads;
}

bool contains(const std::vector<Tensor>& tensors, const Tensor& t) {
  for (const Tensor& u : tensors)
    if (u.is_same(t)) return true;
  return false;
}

// The partial norm (sum |g|^p, or max |g|) of `grads` before any root: what
// get_total_norm hands its reducer, kept instead of reduced.
Tensor partial_of(const std::vector<Tensor>& grads, double norm_type, Device device) {
  Tensor partial;
  nn::utils::get_total_norm(
      grads, norm_type, false, [&](Tensor& p, nn::utils::NormReduction) { partial = p; }, device);
  return partial.device() == device ? partial : ops::copy_to(partial, device);
}

}  // namespace

TensorParallelParameters tensor_parallel_parameters(const nn::Module& module) {
  std::vector<Tensor> sharded;
  for (const auto& [name, m] : module.named_modules()) {
    if (const auto* column = dynamic_cast<const nn::ColumnParallelLinear*>(m)) {
      for (const auto& [pname, p] : column->named_parameters(false)) sharded.push_back(p);
    } else if (const auto* row = dynamic_cast<const nn::RowParallelLinear*>(m)) {
      for (const auto& [pname, p] : row->named_parameters(false))
        if (pname == "weight") sharded.push_back(p);
    }
  }
  TensorParallelParameters split;
  for (const Tensor& p : module.parameters())
    (contains(sharded, p) ? split.sharded : split.replicated).push_back(p);
  return split;
}

Tensor clip_grad_norm_(const nn::Module& module, const TensorParallelGroupPtr& group,
                       double max_norm, double norm_type) {
  MG_CHECK(group != nullptr, "tensor-parallel clip_grad_norm_: the group is null");
  MG_CHECK(max_norm >= 0.0, "clip_grad_norm_: max_norm must be >= 0, got {}", max_norm);
  NoGradGuard no_grad;
  const TensorParallelParameters split = tensor_parallel_parameters(module);
  const Device device = group->device();
  // The replicated gradients are equal on every rank: this rank's count for all.
  const Tensor replicated = partial_of(grads_of(split.replicated), norm_type, device);
  const bool infinity = std::isinf(norm_type);
  const Tensor total = nn::utils::get_total_norm(
      grads_of(split.sharded), norm_type, false,
      [&](Tensor& partial, nn::utils::NormReduction) {
        Tensor here = partial.device() == device ? partial : ops::copy_to(partial, device);
        here = here.reshape(Shape{1});
        // The ranks' shards: summed, or the largest of their maxima (an all-gather, since
        // the group's only reduction is a sum).
        Tensor over_ranks = infinity ? ops::abs_max(group->all_gather(here))
                                     : group->all_reduce(here).reshape(Shape{});
        partial = ops::binary(infinity ? BinaryOp::Maximum : BinaryOp::Add,
                              over_ranks.reshape(Shape{}), replicated.reshape(Shape{}));
      },
      device);
  std::vector<Tensor> all = split.sharded;
  all.insert(all.end(), split.replicated.begin(), split.replicated.end());
  nn::utils::clip_grads_with_norm_(all, max_norm, total);
  return total;
}

Tensor clip_grad_norm_(const TensorParallel& model, double max_norm, double norm_type) {
  MG_CHECK(max_norm >= 0.0, "clip_grad_norm_: max_norm must be >= 0, got {}", max_norm);
  NoGradGuard no_grad;
  std::vector<Tensor> counted, all;
  const int size = static_cast<int>(model.devices().size());
  for (int rank = 0; rank < size; ++rank) {
    const TensorParallelParameters split = tensor_parallel_parameters(*model.shard(rank));
    counted.insert(counted.end(), split.sharded.begin(), split.sharded.end());
    // Every rank's replicated copies have the same gradient: count rank 0's.
    if (rank == 0) counted.insert(counted.end(), split.replicated.begin(), split.replicated.end());
    all.insert(all.end(), split.sharded.begin(), split.sharded.end());
    all.insert(all.end(), split.replicated.begin(), split.replicated.end());
  }
  const Tensor total =
      nn::utils::get_total_norm(grads_of(counted), norm_type, false, nullptr, model.devices()[0]);
  nn::utils::clip_grads_with_norm_(all, max_norm, total);
  return total;
}

}  // namespace mg::parallel
