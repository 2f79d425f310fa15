#include <minigrad/parallel/devices/host_communicator.h>

#include <minigrad/core/fault_injection.h>
#include <minigrad/core/ops.h>
#include <minigrad/core/stream.h>
#include <minigrad/parallel/devices/transfer.h>

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
  std::vector<Tensor> out = sum_to(per_rank, root);
  // parity fault: the replicas' gradients averaged instead of summed (fault_injection.h).
  if (testing::fault_is_on(testing::Fault::DataParallelGradsAveraged))
    for (Tensor& t : out) t = ops::binary_scalar(BinaryOp::Mul, t, 1.0 / static_cast<double>(size()));
  return out;
}

std::vector<Tensor> HostCommunicator::sum_to(const std::vector<std::vector<Tensor>>& per_rank,
                                             size_t root) {
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

// Summed once, on rank 0, then copied: every rank gets the same bits, which a sum on each
// device would not promise (the order of a float sum changes its rounding).
std::vector<Tensor> HostCommunicator::all_reduce(const std::vector<Tensor>& per_rank) {
  check_one_per_rank("all_reduce", per_rank);
  std::vector<std::vector<Tensor>> wrapped;
  for (const Tensor& t : per_rank) wrapped.push_back({t});
  const Tensor sum = sum_to(wrapped, 0).at(0);
  std::vector<Tensor> out{size() == 1 ? ops::clone(sum) : sum};
  for (size_t r = 1; r < size(); ++r) out.push_back(copy_to_device(sum, devices()[r]));
  return out;
}

std::vector<Tensor> HostCommunicator::all_gather(const std::vector<Tensor>& per_rank) {
  check_one_per_rank("all_gather", per_rank);
  std::vector<int64_t> sizes{static_cast<int64_t>(size())};
  for (int64_t s : per_rank[0].shape().sizes()) sizes.push_back(s);
  std::vector<Tensor> out;
  for (size_t r = 0; r < size(); ++r) {
    Tensor stacked;
    {
      DeviceGuard guard(devices()[r]);  // allocated on rank r's current stream
      stacked = empty(Shape(sizes), per_rank[0].dtype(), devices()[r]);
    }
    for (size_t s = 0; s < size(); ++s)
      ordered_copy_(ops::view(ops::narrow(stacked, 0, static_cast<int64_t>(s), 1),
                              per_rank[s].shape()),
                    per_rank[s]);
    out.push_back(stacked);
  }
  return out;
}

}  // namespace mg::parallel
