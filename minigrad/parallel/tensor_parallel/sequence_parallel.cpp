// Sequence parallelism's all-gather and reduce-scatter along T (sequence_parallel.h). The
// group's collectives work along dimension 0, so T is moved there and back.
#include <minigrad/parallel/tensor_parallel/sequence_parallel.h>

#include <minigrad/autograd/node.h>
#include <minigrad/core/ops.h>

namespace mg::parallel {
namespace {

void check_input(const TensorParallelGroupPtr& group, const Tensor& x, const char* op) {
  MG_CHECK(group != nullptr, "{}: the tensor-parallel group is null", op);
  MG_CHECK(x.defined() && x.dim() >= 2,
           "{}: expected activations [B, T, ...] with at least two dimensions, got {} ({})", op,
           x.defined() ? x.shape().str() : "undefined", group->describe());
}

// [B, T/n, ...] -> [B, T, ...]: every rank's positions, in rank order.
Tensor all_gather_seq(const Tensor& x, TensorParallelGroup& group) {
  const Tensor t_first = ops::contiguous(ops::transpose(x, 0, 1));   // [T/n, B, ...]
  const Tensor stacked = group.all_gather(t_first);                  // [n, T/n, B, ...]
  std::vector<int64_t> sizes = t_first.shape().sizes();
  sizes[0] *= group.size();
  return ops::contiguous(ops::transpose(ops::view(stacked, Shape(sizes)), 0, 1));
}

// [B, T, ...] -> this rank's positions of the sum over the ranks, [B, T/n, ...].
Tensor reduce_scatter_seq(const Tensor& x, TensorParallelGroup& group, const char* op) {
  MG_CHECK(x.size(1) % group.size() == 0,
           "{}: the sequence length T = {} (shape {}) does not divide over the {} ranks of the "
           "tensor-parallel group; sequence parallelism needs T to be a multiple of {}",
           op, x.size(1), x.shape(), group.size(), group.size());
  const Tensor t_first = ops::contiguous(ops::transpose(x, 0, 1));   // [T, B, ...]
  return ops::contiguous(ops::transpose(group.reduce_scatter(t_first), 0, 1));
}

}  // namespace

Tensor gather_from_sequence_parallel(const Tensor& x, const TensorParallelGroupPtr& group) {
  check_input(group, x, "gather_from_sequence_parallel");
  if (group->size() == 1) return x;
  Tensor out = all_gather_seq(x, *group);
  record_function("GatherFromSequenceParallelBackward", {x}, {out},
                  [group](const BackwardArgs& g) {
                    return std::vector<Tensor>{reduce_scatter_seq(
                        g.grad(), *group, "gather_from_sequence_parallel backward")};
                  });
  return out;
}

Tensor reduce_scatter_to_sequence_parallel(const Tensor& x, const TensorParallelGroupPtr& group) {
  check_input(group, x, "reduce_scatter_to_sequence_parallel");
  if (group->size() == 1) return x;
  Tensor out = reduce_scatter_seq(x, *group, "reduce_scatter_to_sequence_parallel");
  record_function("ReduceScatterToSequenceParallelBackward", {x}, {out},
                  [group](const BackwardArgs& g) {
                    return std::vector<Tensor>{all_gather_seq(g.grad(), *group)};
                  });
  return out;
}

Tensor scatter_to_sequence_parallel(const Tensor& x, const TensorParallelGroupPtr& group) {
  check_input(group, x, "scatter_to_sequence_parallel");
  if (group->size() == 1) return x;
  const int64_t n = group->size();
  MG_CHECK(x.size(1) % n == 0,
           "scatter_to_sequence_parallel: the sequence length T = {} (shape {}) does not divide over the {} ranks "
           "of the tensor-parallel group", x.size(1), x.shape(), n);
  const int64_t part = x.size(1) / n;
  Tensor out = ops::contiguous(ops::narrow(x, 1, group->rank() * part, part));
  record_function("ScatterToSequenceParallelBackward", {x}, {out}, [group](const BackwardArgs& g) {
    return std::vector<Tensor>{all_gather_seq(g.grad(), *group)};
  });
  return out;
}

}  // namespace mg::parallel
