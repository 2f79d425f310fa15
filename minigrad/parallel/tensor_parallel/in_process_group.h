// InProcessGroup: a tensor-parallel group whose ranks are threads of this process, one
// per device, over the Communicator DataParallel uses (NCCL for distinct GPUs; host
// copies for CPU devices, for one GPU named several times, and without NCCL).
//
// A Communicator collective takes every rank's tensor at once; a layer's code holds only
// its own rank's. The group bridges the two as a barrier: each rank's thread leaves its
// tensor and waits; the last to arrive runs the Communicator's collective for all of
// them and hands every rank its result. So each rank's thread runs exactly the code a
// process of a Gloo or NCCL group runs (group.h), and TensorParallel (tensor_parallel.h)
// runs one such thread per rank.
//
// A rank that fails must not leave the others waiting forever: abort() wakes every rank
// waiting in (or arriving at) a collective with an mg::Error, and a collective that
// waits longer than the timeout fails naming the ranks that never came.
#pragma once

#include <chrono>
#include <memory>
#include <string>
#include <vector>

#include <minigrad/parallel/tensor_parallel/group.h>

namespace mg::parallel {

class InProcessGroup {
 public:
  explicit InProcessGroup(std::vector<Device> devices,
                          std::chrono::milliseconds timeout = std::chrono::minutes(5));

  const std::vector<Device>& devices() const { return devices_; }
  int size() const { return static_cast<int>(devices_.size()); }
  // The handle of rank r (the same object on every call); its device is devices()[r].
  const TensorParallelGroupPtr& rank(int r) const;
  const std::vector<TensorParallelGroupPtr>& ranks() const { return handles_; }
  // "nccl" or "host": the Communicator the collectives run over.
  std::string communicator_name() const;

  // Every rank waiting in a collective, and every rank that calls one until clear_abort(),
  // throws an mg::Error quoting `reason`.
  void abort(const std::string& reason);
  // Makes the group usable again after an abort; call it when no rank is inside a
  // collective (TensorParallel does, after joining its threads).
  void clear_abort();

  struct Rendezvous;  // in_process_group.cpp: the barrier the ranks' handles share

 private:
  std::vector<Device> devices_;
  std::shared_ptr<Rendezvous> rendezvous_;
  std::vector<TensorParallelGroupPtr> handles_;
};

using InProcessGroupPtr = std::shared_ptr<InProcessGroup>;

}  // namespace mg::parallel
