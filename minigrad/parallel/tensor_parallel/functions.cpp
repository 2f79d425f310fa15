#include <minigrad/parallel/tensor_parallel/functions.h>

#include <minigrad/autograd/node.h>
#include <minigrad/core/ops.h>

namespace mg::parallel {
namespace {

void check_group(const TensorParallelGroupPtr& group, const Tensor& x, const char* op) {
  MG_CHECK(group != nullptr, "{}: the tensor-parallel group is null", op);
  MG_CHECK(x.defined(), "{}: the input is undefined ({})", op, group->describe());
}

// This rank's part of the last dimension: a contiguous copy, so the next matmul reads it
// row by row.
Tensor split_last(const Tensor& x, const TensorParallelGroup& group, const char* op) {
  MG_CHECK(x.dim() >= 1, "{}: expected a tensor with at least one dimension, got shape {} ({})",
           op, x.shape(), group.describe());
  const std::string what = fmt::format("{}: the last dimension of shape {}", op, x.shape());
  const int64_t part = shard_size(x.size(-1), group.size(), what.c_str());
  return ops::contiguous(ops::narrow(x, x.dim() - 1, group.rank() * part, part));
}

// Every rank's part, side by side along the last dimension.
Tensor gather_last(const Tensor& x, TensorParallelGroup& group, const char* op) {
  MG_CHECK(x.dim() >= 1, "{}: expected a tensor with at least one dimension, got shape {} ({})",
           op, x.shape(), group.describe());
  const Tensor stacked = group.all_gather(ops::contiguous(x));  // [size, ..., part]
  const int64_t part = x.size(-1);
  std::vector<int64_t> sizes = x.shape().sizes();
  sizes.back() = part * group.size();
  Tensor out = empty(Shape(sizes), x.dtype(), x.device());
  for (int s = 0; s < group.size(); ++s)
    ops::copy_(ops::narrow(out, x.dim() - 1, s * part, part),
               ops::view(ops::narrow(stacked, 0, s, 1), x.shape()));
  return out;
}

}  // namespace

// f: every rank uses the same x with its own shard of the next layer, so each rank's
// gradient of x is a partial sum; backward adds them up.
Tensor copy_to_parallel(const Tensor& x, const TensorParallelGroupPtr& group) {
  check_group(group, x, "copy_to_parallel");
  if (group->size() == 1) return x;
  Tensor out = alias_for_node(x);
  record_function("CopyToParallelBackward", {x}, {out}, [group](const BackwardArgs& g) {
    return std::vector<Tensor>{group->all_reduce(g.grad())};
  });
  return out;
}

// g: the partial outputs of the shards summed; the sum's gradient is every part's.
Tensor reduce_from_parallel(const Tensor& x, const TensorParallelGroupPtr& group) {
  check_group(group, x, "reduce_from_parallel");
  if (group->size() == 1) return x;
  Tensor out = group->all_reduce(x);
  record_function("ReduceFromParallelBackward", {x}, {out},
                  [](const BackwardArgs& g) { return std::vector<Tensor>{g.grad()}; });
  return out;
}

Tensor scatter_to_parallel(const Tensor& x, const TensorParallelGroupPtr& group) {
  check_group(group, x, "scatter_to_parallel");
  if (group->size() == 1) return x;
  Tensor out = split_last(x, *group, "scatter_to_parallel");
  record_function("ScatterToParallelBackward", {x}, {out}, [group](const BackwardArgs& g) {
    return std::vector<Tensor>{gather_last(g.grad(), *group, "scatter_to_parallel backward")};
  });
  return out;
}

Tensor gather_from_parallel(const Tensor& x, const TensorParallelGroupPtr& group) {
  check_group(group, x, "gather_from_parallel");
  if (group->size() == 1) return x;
  Tensor out = gather_last(x, *group, "gather_from_parallel");
  record_function("GatherFromParallelBackward", {x}, {out}, [group](const BackwardArgs& g) {
    return std::vector<Tensor>{split_last(g.grad(), *group, "gather_from_parallel backward")};
  });
  return out;
}

}  // namespace mg::parallel
