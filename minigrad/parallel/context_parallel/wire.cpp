// Float64 as int64 bits, and float64 sums in rank order: see wire.h.
#include <minigrad/parallel/context_parallel/wire.h>

#include <minigrad/core/ops.h>

namespace mg::parallel::context_parallel {

Tensor wire_view(const Tensor& t) {
  MG_CHECK(t.is_contiguous(), "context parallel: a message's tensor must be contiguous, got {} "
           "with strides {}", t.shape(), fmt::join(t.strides(), ", "));
  if (t.dtype() != DType::Float64) return t;
  // The same bytes, read as int64: both are 8 bytes, and the message never looks inside.
  return Tensor(std::make_shared<TensorImpl>(t.storage(), t.shape(), t.strides(),
                                             t.storage_offset(), DType::Int64));
}

std::shared_ptr<Work> send_any(ProcessGroup& group, const std::vector<Tensor>& tensors, int dst,
                               int tag) {
  std::vector<Tensor> wire;
  for (const Tensor& t : tensors) wire.push_back(wire_view(ops::contiguous(t)));
  return group.send(wire, dst, tag);
}

std::shared_ptr<Work> recv_any(ProcessGroup& group, const std::vector<Tensor>& tensors, int src,
                               int tag) {
  std::vector<Tensor> wire;
  for (const Tensor& t : tensors) wire.push_back(wire_view(t));
  return group.recv(wire, src, tag);
}

Tensor all_gather_any(const Tensor& t, ProcessGroup& group) {
  const Tensor local = ops::contiguous(t);
  Tensor out = empty(Shape{group.size() * local.numel()}, local.dtype(), local.device());
  group.all_gather(wire_view(out), wire_view(local))->wait();
  return out;
}

Tensor sum_over_group(const Tensor& t, ProcessGroup& group) {
  if (t.dtype() != DType::Float64) {
    Tensor sum = ops::clone(t);
    group.allreduce(sum)->wait();
    return sum;
  }
  const int64_t n = t.numel();
  const Tensor all = all_gather_any(t, group);
  Tensor sum = ops::clone(ops::view(ops::narrow(all, 0, 0, n), t.shape()));
  for (int r = 1; r < group.size(); ++r)
    sum = ops::binary(BinaryOp::Add, sum, ops::view(ops::narrow(all, 0, r * n, n), t.shape()));
  return sum;
}

}  // namespace mg::parallel::context_parallel
