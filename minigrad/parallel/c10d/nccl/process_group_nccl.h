// ProcessGroupNccl: collectives over CUDA tensors between processes, one GPU per
// process, with NCCL, as torch.distributed's "nccl" backend.
//
//   - Rendezvous: rank 0 makes the NCCL unique id and publishes it in the TCPStore; the
//     others read it from there; all call ncclCommInitRankConfig. The communicator is
//     created non-blocking, so initialisation can be watched and aborted: a rank that
//     never arrives makes the others fail after the timeout instead of waiting forever.
//   - Ordering: collectives run on a communication stream of the group's own. Each waits
//     (cudaStreamWaitEvent) for the work already queued on the caller's current stream,
//     so a bucket's all-reduce sees its gradients while later backward kernels keep
//     running on the compute stream: that is the overlap. Work::wait() makes the caller's
//     current stream wait for the collective in turn.
//   - Failures: Work::wait() watches the collective from the host (its end event, and
//     ncclCommGetAsyncError) until the timeout; on an error or on timeout it aborts the
//     communicator (ncclCommAbort, which also ends kernels stuck waiting for a dead
//     peer) and throws. Every later call then fails at once with the first error. Waiting
//     on the host costs one synchronisation per step (PyTorch's "blocking wait" mode);
//     it is what lets the error reach the training loop as an exception.
//
// Available when minigrad was built with NCCL (MINIGRAD_WITH_NCCL).
#pragma once

#ifdef MINIGRAD_WITH_NCCL

#include <memory>
#include <string>
#include <vector>

#include <minigrad/parallel/c10d/process_group.h>
#include <minigrad/parallel/c10d/store/tcp_store.h>

namespace mg::parallel {

class ProcessGroupNccl : public ProcessGroup {
 public:
  // Joins the group on GPU options.device_index (-1: rank modulo the visible GPUs;
  // init_process_group passes LOCAL_RANK).
  ProcessGroupNccl(std::shared_ptr<Store> store, int rank, int size,
                   ProcessGroupOptions options = {});
  ~ProcessGroupNccl() override;

  std::string backend_name() const override { return "nccl"; }
  Device device() const override;
  std::chrono::milliseconds timeout() const override;

  std::shared_ptr<Work> allreduce(std::vector<Tensor> tensors,
                                  ReduceOp op = ReduceOp::Sum) override;
  std::shared_ptr<Work> broadcast(std::vector<Tensor> tensors, int root = 0) override;
  // An all-reduce of one element whose wait() blocks the host, as PyTorch's NCCL barrier.
  std::shared_ptr<Work> barrier() override;
  // ncclReduceScatter and ncclAllGather, ordered like allreduce.
  std::shared_ptr<Work> reduce_scatter(Tensor output, Tensor input,
                                       ReduceOp op = ReduceOp::Sum) override;
  std::shared_ptr<Work> all_gather(Tensor output, Tensor input) override;
  // Over a lane per direction and peer: a two-rank communicator, stream and thread of its
  // own (nccl_point_to_point.h), so a send and a recv never wait for each other's kernel.
  std::shared_ptr<Work> send(std::vector<Tensor> tensors, int dst, int tag = 0) override;
  std::shared_ptr<Work> recv(std::vector<Tensor> tensors, int src, int tag = 0) override;
  // A new communicator on the same GPU, its unique id through the store.
  std::shared_ptr<ProcessGroup> new_group(const std::vector<int>& ranks) override;
  using ProcessGroup::allreduce;
  using ProcessGroup::broadcast;
  using ProcessGroup::recv;
  using ProcessGroup::send;

  struct Impl;  // nccl_process_group.cpp

 private:
  ProcessGroupNccl(std::shared_ptr<Store> store, std::string prefix, int rank, int size,
                   ProcessGroupOptions options);

  std::shared_ptr<Impl> impl_;  // shared with Work handles still in flight
};

}  // namespace mg::parallel

#endif  // MINIGRAD_WITH_NCCL
