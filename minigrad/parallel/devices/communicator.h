// Communicator: the collectives DataParallel and TensorParallel need over a list of
// devices in one process. Two implementations:
//   - NcclCommunicator (nccl_communicator.cpp): NCCL over distinct GPUs, from one
//     thread, inside ncclGroupStart/End; used when every device is a different GPU and
//     minigrad was built with NCCL.
//   - HostCommunicator (host_communicator.cpp): ordered copies (transfer.h) and adds; used
//     for CPU replicas, for several replicas on one GPU (NCCL refuses two ranks on one
//     device), and when NCCL is absent.
// The parallel layer calls only this interface, so the same DataParallel code runs on
// GPUs with NCCL and on CPU replicas in CI.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include <minigrad/core/tensor.h>

namespace mg::parallel {

class Communicator {
 public:
  explicit Communicator(std::vector<Device> devices);
  virtual ~Communicator() = default;
  Communicator(const Communicator&) = delete;
  Communicator& operator=(const Communicator&) = delete;

  // "nccl" or "host", for messages and tests.
  virtual std::string name() const = 0;
  // The devices, one per rank; the same device may appear more than once (host only).
  const std::vector<Device>& devices() const { return devices_; }
  size_t size() const { return devices_.size(); }

  // `tensors` live on devices()[root]. Returns out[r][k]: tensors[k] on devices()[r],
  // a fresh copy for every rank but the root, whose entries are `tensors` themselves.
  virtual std::vector<std::vector<Tensor>> broadcast(const std::vector<Tensor>& tensors,
                                                     size_t root) = 0;

  // per_rank[r][k] lives on devices()[r]; for each k all ranks agree on shape and dtype.
  // Returns sum over r of per_rank[r][k], on devices()[root]: summed, not averaged.
  virtual std::vector<Tensor> reduce_add(const std::vector<std::vector<Tensor>>& per_rank,
                                         size_t root) = 0;

  // The two collectives of tensor parallelism (tensor_parallel/in_process_group.h). Both
  // take one tensor per rank, per_rank[r] on devices()[r], of one shape and dtype.
  // all_reduce: out[r] on devices()[r] is the sum over the ranks, a fresh tensor with the
  //   same values on every rank (replicated activations must stay bitwise equal).
  virtual std::vector<Tensor> all_reduce(const std::vector<Tensor>& per_rank) = 0;
  // all_gather: out[r] on devices()[r] has shape [size(), shape...]: out[r][s] is rank s's
  //   tensor (NCCL's layout: the ranks' buffers one after the other).
  virtual std::vector<Tensor> all_gather(const std::vector<Tensor>& per_rank) = 0;

 protected:
  // Checks the arguments of a collective, naming it in errors.
  void check_broadcast(const std::vector<Tensor>& tensors, size_t root) const;
  void check_reduce_add(const std::vector<std::vector<Tensor>>& per_rank, size_t root) const;
  void check_one_per_rank(const char* collective, const std::vector<Tensor>& per_rank) const;

 private:
  std::vector<Device> devices_;
};

// The communicator for `devices`: NCCL when every device is a distinct GPU and NCCL was
// built in (created once per device list and cached), the host one otherwise.
std::shared_ptr<Communicator> communicator_for(const std::vector<Device>& devices);

// True when communicator_for(devices) would use NCCL.
bool nccl_available_for(const std::vector<Device>& devices);

#ifdef MINIGRAD_WITH_NCCL
// nccl_communicator.cpp: the cached NCCL communicator over `devices` (distinct GPUs).
std::shared_ptr<Communicator> nccl_communicator(const std::vector<Device>& devices);
#endif

}  // namespace mg::parallel
