// HostCommunicator: the collectives as ordered copies (transfer.h) and adds.
// The communicator of CPU replicas, of replicas sharing a GPU, and of GPUs without NCCL.
#pragma once

#include <minigrad/parallel/devices/communicator.h>

namespace mg::parallel {

class HostCommunicator final : public Communicator {
 public:
  explicit HostCommunicator(std::vector<Device> devices);
  std::string name() const override { return "host"; }
  std::vector<std::vector<Tensor>> broadcast(const std::vector<Tensor>& tensors,
                                             size_t root) override;
  std::vector<Tensor> reduce_add(const std::vector<std::vector<Tensor>>& per_rank,
                                 size_t root) override;
  std::vector<Tensor> all_reduce(const std::vector<Tensor>& per_rank) override;
  std::vector<Tensor> all_gather(const std::vector<Tensor>& per_rank) override;

 private:
  // The sums of reduce_add (and all_reduce), on devices()[root].
  std::vector<Tensor> sum_to(const std::vector<std::vector<Tensor>>& per_rank, size_t root);
};

}  // namespace mg::parallel
