// ProcessGroupGloo: collectives over CPU tensors between processes, with Gloo's TCP
// transport (Debian's libgloo-dev), as torch.distributed's "gloo" backend.
//
// The ranks meet through a TCPStore: each publishes the addresses of its connections
// there (gloo::rendezvous::Context::connectFullMesh over a small adapter to our store)
// and connects to every other rank. Collectives are queued to one communication thread
// that runs them in call order, so they match across ranks, while the caller goes on
// (DistributedDataParallel's backward). Every Gloo operation carries the group's
// timeout: a peer that died makes the next collective fail at once (its connection
// closed), a peer that hangs makes it fail after the timeout.
//
// bfloat16 and float16: Gloo has no reduction for them here, so the collectives carry a
// 16-bit tensor widened to float32 (exact), sum it in float32 and round the result once
// into the tensor's dtype -- twice the bytes NCCL would send, never a less exact sum.
// Point-to-point messages move bytes and carry the 16-bit floats as they are.
//
// Available when minigrad was built with Gloo (MINIGRAD_WITH_GLOO);
// init_process_group("gloo") says so clearly otherwise.
#pragma once

#ifdef MINIGRAD_WITH_GLOO

#include <memory>
#include <string>
#include <vector>

#include <minigrad/parallel/c10d/process_group.h>
#include <minigrad/parallel/c10d/store/tcp_store.h>

namespace mg::parallel {

class ProcessGroupGloo : public ProcessGroup {
 public:
  // Joins the group: every rank calls this with the same store and its own rank.
  ProcessGroupGloo(std::shared_ptr<Store> store, int rank, int size,
                   ProcessGroupOptions options = {});
  ~ProcessGroupGloo() override;

  std::string backend_name() const override { return "gloo"; }
  Device device() const override { return Device::cpu(); }
  std::chrono::milliseconds timeout() const override;

  std::shared_ptr<Work> allreduce(std::vector<Tensor> tensors,
                                  ReduceOp op = ReduceOp::Sum) override;
  std::shared_ptr<Work> broadcast(std::vector<Tensor> tensors, int root = 0) override;
  std::shared_ptr<Work> barrier() override;
  // Gloo's all-to-all brings every rank its slice of every input; the slices are then
  // summed here in rank order (Gloo's ReduceScatterHalvingDoubling is a pre-bound-buffer
  // algorithm whose early arrivals stall the connection for everything else on it).
  std::shared_ptr<Work> reduce_scatter(Tensor output, Tensor input,
                                       ReduceOp op = ReduceOp::Sum) override;
  // Gloo's ring all-gather.
  std::shared_ptr<Work> all_gather(Tensor output, Tensor input) override;
  // Gloo's unbound buffers, posted on the caller's thread (so messages never queue behind
  // collectives): a fixed-size header, then the payload once the header has been checked.
  std::shared_ptr<Work> send(std::vector<Tensor> tensors, int dst, int tag = 0) override;
  std::shared_ptr<Work> recv(std::vector<Tensor> tensors, int src, int tag = 0) override;
  // A new Gloo context over the same store and transport, under keys of its own.
  std::shared_ptr<ProcessGroup> new_group(const std::vector<int>& ranks) override;
  using ProcessGroup::allreduce;
  using ProcessGroup::broadcast;
  using ProcessGroup::recv;
  using ProcessGroup::send;

  struct Impl;  // gloo_internal.h

 private:
  ProcessGroupGloo(const Impl& parent, std::string prefix, int rank, int size);  // new_group
  void connect();
  void wait_until_every_rank_joined();

  std::unique_ptr<Impl> impl_;
};

}  // namespace mg::parallel

#endif  // MINIGRAD_WITH_GLOO
