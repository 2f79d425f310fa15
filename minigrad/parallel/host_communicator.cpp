#include <minigrad/parallel/host_communicator.h>

#include <minigrad/core/ops.h>
#include <minigrad/core/stream.h>
#include <minigrad/parallel/transfer.h>

namespace mg::parallel {

HostCommunicator::HostCommunicator(std::vector<Device> devices)
    : Communicator(std::move(devices)) {}

std::vector<std::vector<Tensor>> HostCommunicator::broadcast(const std::vector<Tensor>& tensors,
                                                             size_t root) {
  check_broadcast(tensors, root);
  std::vector<std::vector<Tensor>> out(size());
  for (size_t r = 0; r < size(); ++r) {
    if (r == root) {
      out[r] = tensors;
      continue;
    }
    out[r].reserve(tensors.size());
    for (const Tensor& t : tensors) out[r].push_back(copy_to_device(t, devices()[r]));
  }
  return out;
}

std::vector<Tensor> HostCommunicator::reduce_add(const std::vector<std::vector<Tensor>>& per_rank,
                                                 size_t root) {
  check_reduce_add(per_rank, root);
  const Device destination = devices()[root];
  DeviceGuard guard(destination);  // the sums run on the root's current stream
  std::vector<Tensor> out;
  out.reserve(per_rank[root].size());
  for (size_t k = 0; k < per_rank[root].size(); ++k) {
    // Rank order, starting from rank 0 wherever the root is, so the rounding of the sum
    // does not depend on which rank is the root.
    Tensor sum;
    for (size_t r = 0; r < size(); ++r) {
      const Tensor& t = per_rank[r][k];
      const Tensor here = t.device() == destination ? t : copy_to_device(t, destination);
      sum = sum.defined() ? ops::binary(BinaryOp::Add, sum, here) : here;
    }
    out.push_back(sum);
  }
  return out;
}

}  // namespace mg::parallel
